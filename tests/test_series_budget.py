"""The series budget (metrics/scale/budget.yml, docs/scaling.md): every exporter a node runs, measured
on the twin as a user runs it, stays within its series per node, and no metric carries a label with
unbounded values (pid, job step, timestamp, message text)."""

from __future__ import annotations

import re

import pytest

from evaluation.scale_capture import capture
from metrics.scale import series
from metrics.scale.capture import Capture


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> Capture:
    return capture(tmp_path_factory.mktemp("budget"))


@pytest.fixture(scope="module")
def budget() -> series.Budget:
    return series.load_budget()


def exporter_series(captured: Capture) -> dict[str, set[series.Series]]:
    return {
        "dcgm": series.parse("".join(captured.dcgm.values())),
        "fleetsight-node": series.parse(captured.node_agent),
        "fleetsight-fabric": series.parse(captured.fabric),
        "node": series.parse(captured.node_exporter),
    }


def per_node(name: str, found: set[series.Series], nodes: int) -> int:
    """The most series any one node has from this exporter; node_exporter is one host (no node label),
    and the fabric exporter's series without a node are shared by the fabric's nodes."""
    if name == "node":
        return len(found)
    grouped = series.by_node(found)
    shared = len(grouped.get("", ())) / nodes
    return round(max(series.per_node_counts(grouped).values()) + shared)


def test_every_exporter_within_its_series_budget(captured, budget):
    measured = {
        name: per_node(name, found, len(captured.nodes)) for name, found in exporter_series(captured).items()
    }
    print(f"series per node: {measured}, budget: {budget.per_node}")
    assert set(measured) == set(budget.per_node)
    over = {
        name: (count, budget.per_node[name])
        for name, count in measured.items()
        if count > budget.per_node[name]
    }
    assert over == {}, f"over budget (measured, budget): {over}"
    # Every node is counted: a capture that lost nodes would pass trivially.
    assert len(captured.nodes) == 12 and set(captured.dcgm) == set(captured.nodes)
    assert all(count > 0 for count in measured.values())


@pytest.mark.parametrize("exporter", ["dcgm", "fleetsight-node", "fleetsight-fabric", "node"])
def test_no_label_with_unbounded_values(captured, budget, exporter):
    problems = series.unbounded_labels(exporter_series(captured)[exporter], budget)
    assert problems == []


def test_the_check_sees_each_kind_of_unbounded_label(budget):
    """The label check itself: a pid, a timestamp, a message and a label with one value per event."""
    text = "\n".join(
        [
            'fleetsight_x{node="n1",pid="4242"} 1',
            'fleetsight_y{node="n1",since="1795592222.659"} 1',
            'fleetsight_z{node="n1",detail="GPU has fallen off the bus at address 0000:18:00.0"} 1',
            *(f'fleetsight_w{{node="n1",event="{i}"}} 1' for i in range(budget.max_label_values + 1)),
        ]
    )
    problems = series.unbounded_labels(series.parse(text + "\n"), budget)
    assert [p.split(":")[0] for p in problems] == [
        "fleetsight_w",
        "fleetsight_x",
        "fleetsight_y",
        "fleetsight_z",
    ]


def test_the_documented_budget_is_the_enforced_one(budget):
    """docs/scaling.md's table and metrics/scale/budget.yml say the same numbers."""
    docs = (series.BUDGET_FILE.parents[2] / "docs" / "scaling.md").read_text()
    rows = {}
    for line in docs.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        exporter = re.search(r"\(`([\w-]+)`\)", cells[0])
        if len(cells) == 4 and exporter and cells[2].replace(",", "").isdigit():
            rows[exporter.group(1)] = int(cells[2].replace(",", ""))
    assert rows == budget.per_node
