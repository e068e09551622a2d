"""The exporters' one renderer of the exposition format gives the samples prometheus_client's
``generate_latest`` gives for the same families: the node agent's with every collector, the fabric
exporter's, and fuzzed families (escaping, special values)."""

from __future__ import annotations

import json
import math

from exporter_helpers import FIXTURES, JsonServer, load_routes
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from test_exporter_promtool import full_node

from exporters.exposition import CONST_LABELS, render
from exporters.fabric import FabricExporter
from exporters.node import NodeAgent, NodeOptions


class Fixed:
    """A collector that hands out the same families on every collect."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def parsed(text: str) -> dict[str, tuple[str, str, list[tuple]]]:
    """``{family: (type, help, sorted samples)}``, values as floats (NaN as a string: NaN != NaN)."""
    result = {}
    for family in text_string_to_metric_families(text):
        samples = sorted(
            (s.name, tuple(sorted(s.labels.items())), "NaN" if math.isnan(s.value) else s.value)
            for s in family.samples
        )
        result[family.name] = (family.type, family.documentation, samples)
    return result


def assert_same_as_generate_latest(families: list[Metric]) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed(families))
    ours, theirs = render(families).decode(), generate_latest(registry).decode()
    assert parsed(ours) == parsed(theirs)
    # Same families in the same order, each announced once.
    heads = [line for line in ours.splitlines() if line.startswith("# TYPE")]
    assert heads == [line for line in theirs.splitlines() if line.startswith("# TYPE")]


def test_the_node_agent_with_every_collector(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETSIGHT_BMC_USERNAME", "fleet")
    monkeypatch.setenv("FLEETSIGHT_BMC_PASSWORD", "s3cret")
    paths = full_node(tmp_path)
    server = JsonServer(load_routes("bmc_both_schemas.json"), credentials=("fleet", "s3cret"))
    agent = NodeAgent(
        NodeOptions(
            node="n0001",
            sysfs_root=str(paths["sys"]),
            procfs_root=str(paths["proc"]),
            kmsg_file=str(paths["kern_log"]),
            nvml=False,
            lustre_jobstats=True,
            pcie_bandwidth_file=str(paths["probe"]),
            redfish_url=server.url,
        )
    )
    try:
        families = list(agent.registry.collect())
    finally:
        agent.close()
        server.close()
    assert sum(len(f.samples) for f in families) > 500  # every collector's families, ~900 samples
    assert_same_as_generate_latest(families)


def test_the_fabric_exporter(tmp_path):
    routes = {
        "/ufmRest/resources/ports": json.loads((FIXTURES / "ufm" / "ports.json").read_text()),
        "/ufmRest/resources/systems": json.loads((FIXTURES / "ufm" / "systems.json").read_text()),
        "/ufmRest/app/events": json.loads((FIXTURES / "ufm" / "events.json").read_text()),
        "/csv/metrics": (FIXTURES / "ufm" / "telemetry.csv").read_text(),
    }
    server = JsonServer(routes, prefix="/ufm")
    exporter = FabricExporter(ufm_url=f"{server.url}/ufm", telemetry_url=f"{server.url}/ufm/csv/metrics")
    try:
        families = exporter.runner.gather()  # every source, then the shared self-metrics
    finally:
        exporter.close()
        server.close()
    assert {f.name for f in families} >= {
        "fleetsight_fabric_port_up",
        "fleetsight_fabric_port_symbol_errors",
        "fleetsight_collector_success",
    }
    assert_same_as_generate_latest(families)


LABEL_VALUES = st.text(alphabet=st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
    ['a"b', "a\\b", "a\nb", "\\n", '\\"', "", "é€"]
)
VALUES = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**63), 2**63).map(float)


@settings(max_examples=200, deadline=None)
@given(
    const=st.sampled_from([(), ("node",)]),
    rows=st.lists(st.tuples(LABEL_VALUES, LABEL_VALUES, VALUES), max_size=6),
    doc=st.text(max_size=20),
)
def test_fuzzed_families(const, rows, doc):
    CONST_LABELS.set((const, tuple("n0001" for _ in const)))
    gauge = GaugeMetricFamily("fleetsight_fuzz_value", doc, labels=[*const, "a", "b"])
    counter = CounterMetricFamily("fleetsight_fuzz_events", doc, labels=[*const, "a"])
    node = tuple("n0001" for _ in const)
    by_labels = {(a, b): value for a, b, value in rows}  # one sample per label set, as in a family
    for (a, b), value in by_labels.items():
        gauge.add_metric([*node, a, b], value)
    for a, value in {a: abs(v) for (a, _), v in by_labels.items()}.items():
        counter.add_metric([*node, a], value)
    plain = GaugeMetricFamily("fleetsight_fuzz_unlabelled", doc, value=rows[0][2] if rows else 0.0)
    assert_same_as_generate_latest([gauge, counter, plain])
