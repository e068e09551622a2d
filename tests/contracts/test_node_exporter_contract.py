"""node_exporter contract: every ``node_*`` series FleetSight reads (rules, dashboards, the health and
anomaly services, alerting, docs and runbooks) exists in what the real node_exporter publishes, with the
labels used (../shared/PRODUCERS.md: "node_exporter: the real binary, installed by setup").

The producer is Debian's ``prometheus-node-exporter`` run with the flags the local stack gives it
(``metrics.local.node_exporter_command``), one per module, on a free loopback port.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetsight.procs import stop_process
from fleetsight.settings import Settings
from metrics.local import NODE_EXPORTER, node_exporter_command, node_exporter_scrape_configs
from support import free_port, wait_until

REPO = Path(__file__).resolve().parents[2]
# Where FleetSight reads metrics: PromQL in rules and dashboards, the services' queries, the
# expressions the docs and runbooks tell an operator to run, and the scrape and relabel configuration
# (metrics/, deploy/: a metric_relabel_configs that keeps or drops a node_* name reads it too).
READERS = ("rules", "dashboards", "health", "anomaly", "alerting", "chatbot", "docs", "metrics", "deploy")
SUFFIXES = ("*.yml", "*.yaml", "*.py", "*.json", "*.md")
# Series whose name does not start with its collector's name (node_exporter's collector -> prefix).
PREFIX_OF = {
    "loadavg": "load",
    "meminfo": "memory",
    "netdev": "network",
    "diskstats": "disk",
    "stat": "boot",
    "exporter": "exporter",
    "time": "time",
    "uname": "uname",
}
STAT_SERIES = ("context", "forks", "intr", "procs")  # the stat collector's other names
# Labels Prometheus adds (scrape job, target labels from file_sd/http_sd), not node_exporter's.
TARGET_LABELS = {"job", "instance", "node", "cluster", "rack", "replica", "__name__"}
# Words in FleetSight's own code that start with node_ but are not series.
NOT_SERIES = {"node_exporter", "node_exporter_text", "node_exporter_command"}


@pytest.fixture(autouse=True, scope="module")
def node_exporter_installed() -> None:
    """A missing producer fails loudly: setup installs it (Debian prometheus-node-exporter)."""
    if not shutil.which(NODE_EXPORTER):
        pytest.fail(
            f"{NODE_EXPORTER} is not installed: run `fleetsight setup` (Debian prometheus-node-exporter)"
        )


def command(port: int, *extra: str) -> list[str]:
    """The local stack's own command line, on another port."""
    args = [a for a in node_exporter_command(Settings()) if not a.startswith("--web.listen-address=")]
    return [*args, f"--web.listen-address=127.0.0.1:{port}", *extra]


def scrape_once(*extra: str) -> str:
    port = free_port()
    process = subprocess.Popen(command(port, *extra), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        return wait_until(lambda: _get(url, process), timeout=30, what="node_exporter's /metrics")
    finally:
        stop_process(process)


def _get(url: str, process: subprocess.Popen) -> str:
    if process.poll() is not None:
        pytest.fail(f"node_exporter exited: {process.stderr.read().decode() if process.stderr else ''}")
    try:
        response = httpx.get(url, timeout=5)
    except httpx.TransportError:
        return ""
    return response.text if response.status_code == 200 else ""


def series(text: str) -> dict[str, set[str]]:
    """Sample name -> label names, as the real producer publishes them."""
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
    return found


@pytest.fixture(scope="module")
def real() -> Iterator[dict[str, set[str]]]:
    yield series(scrape_once())


def collectors() -> set[str]:
    """node_exporter's collectors, from the installed binary's own --help."""
    text = subprocess.run([NODE_EXPORTER, "--help"], capture_output=True, text=True, check=False)
    names = re.findall(r"collector\.([a-z0-9_]+)", text.stdout + text.stderr)
    return {n for n in names if n not in {"disable", "disable_defaults"}}


def prefixes(names: set[str]) -> set[str]:
    return {PREFIX_OF.get(n, n) for n in names} | set(STAT_SERIES)


NAME_AND_LABELS = re.compile(r"\b(node_[a-z][a-z0-9_]*)(\{[^}]*\})?")


def uses(prefix_set: set[str]) -> dict[str, set[str]]:
    """``node_*`` names in FleetSight's readers whose second word is a node_exporter collector's prefix,
    with the label names their matchers use ("file:line" kept in the error message)."""
    found: dict[str, set[str]] = {}
    for folder in READERS:
        for pattern in SUFFIXES:
            for path in (REPO / folder).rglob(pattern):
                for name, matchers in NAME_AND_LABELS.findall(path.read_text(errors="replace")):
                    if name in NOT_SERIES or name.split("_")[1] not in prefix_set:
                        continue
                    labels = set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
                    found.setdefault(name, set()).update(labels - TARGET_LABELS)
    return found


def exists(name: str, labels: set[str], real: dict[str, set[str]]) -> bool:
    """``node_load1`` as published, or a name a PromQL reader writes as a prefix (``node_load``)."""
    if name in real:
        return labels <= real[name]
    family = [n for n in real if n.startswith(name)]
    return bool(family) and all(labels <= real[n] for n in family)


def test_the_detector_finds_node_exporter_names_and_misses_fleetsight_words() -> None:
    # What makes this contract able to fail: a real series and a typo are both caught as uses.
    prefix_set = prefixes(collectors())
    assert {"cpu", "load", "memory", "filesystem", "network"} <= prefix_set
    assert all(len(n.split("_")) > 1 for n in NOT_SERIES)
    sample = 'rate(node_cpu_seconds_total{mode="idle"}[5m]) + node_lod1 + node_state'
    assert [m[0] for m in NAME_AND_LABELS.findall(sample)] == [
        "node_cpu_seconds_total",
        "node_lod1",
        "node_state",
    ]
    assert "state" not in prefix_set and "lod1" not in prefix_set


def test_every_node_series_fleetsight_reads_is_published(real: dict[str, set[str]]) -> None:
    used = uses(prefixes(collectors()))
    # docs/scaling.md names node_load* and node_cpu_seconds_total: the scan must see them.
    assert {"node_cpu_seconds_total", "node_load"} <= set(used)
    missing = {name: sorted(labels) for name, labels in used.items() if not exists(name, labels, real)}
    assert missing == {}, "read by FleetSight but not published by node_exporter (name: labels)"


def test_cpu_series_carry_the_labels_a_relabel_rule_would_use(real: dict[str, set[str]]) -> None:
    assert {"cpu", "mode"} <= real["node_cpu_seconds_total"]
    assert {"node_load1", "node_load5", "node_load15"} <= set(real)


def test_no_cpu_collector_keeps_load_and_drops_cpu_seconds() -> None:
    # docs/scaling.md: "--no-collector.cpu keeps node_load*" (the series-budget advice for big hosts).
    without_cpu = series(scrape_once("--no-collector.cpu"))
    assert "node_cpu_seconds_total" not in without_cpu
    assert {"node_load1", "node_load5", "node_load15"} <= set(without_cpu)


def test_node_down_reads_the_scrape_job_the_stack_configures() -> None:
    # NodeDown reads up{job=~"node|dcgm|fleetsight-node"}: `node` must be the job name node_exporter is
    # scraped under,
    # and the scrape must label the host as `node` (node_exporter itself publishes no node label).
    configs = node_exporter_scrape_configs(Settings())
    assert [c["job_name"] for c in configs] == ["node"]
    assert all("node" in group["labels"] for c in configs for group in c["static_configs"])
    rules = (REPO / "rules" / "node.yml").read_text()
    assert 'up{job=~"node|dcgm|fleetsight-node"}' in rules
