"""Two twin clusters and the global layer from one command (`fleetsight up --clusters`, here with one
--scenario per cluster): a Slurm cluster `east` and a Kubernetes-shaped cluster `west`, each with its own
real Prometheus pair, Alertmanager pair, health and anomaly services and Thanos sidecars, and above them
the real global Thanos Query, read API, Prometheus and Alertmanager, and one Slack stand-in.

What the issue asks of it: a fault in each cluster reaches the one Slack naming its cluster; the global API
finds a node and a job in either; with one cluster's Prometheus pair stopped the global view answers for
the other, names the missing one and alerts once, and the other's data has no gap over the outage.

Each cluster runs only the components these checks read (no log pipeline, no store gateway), to keep the
module within a few minutes; `fleetsight up --clusters 2` alone runs both whole stacks.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from alerting.slack_sink import read_records
from browser import console_errors, headless_chromium
from support import FLEETSIGHT, REPO_ROOT, free_port_base, wait_until

HERE = Path(__file__).resolve().parent
SCENARIOS = (HERE / "east.yaml", HERE / "west.yaml")
PER_CLUSTER = ("twin", "exporter-node", "health", "anomaly", "thanos-sidecar", "thanos-sidecar-b")
PAIR = ("prometheus", "prometheus-b", "thanos-sidecar", "thanos-sidecar-b")  # what "its Prometheus pair" is
STRIDE = 1000
SHOTS = os.environ.get("FLEETSIGHT_SCREENSHOTS")  # a folder: the fleet page's screenshots go there


@dataclass
class Fleet:
    run_dir: Path
    base: int
    env: dict[str, str]
    started_at: float

    def url(self, port_name: str, path: str = "", cluster: int = 0) -> str:
        from fleetsight.registry import port_offsets

        return f"http://127.0.0.1:{self.base + STRIDE * cluster + port_offsets()[port_name]}{path}"

    def cluster_dir(self, name: str) -> Path:
        return self.run_dir / "clusters" / name

    def slack(self) -> list[dict[str, str]]:
        """The one Slack's messages: title and text of each."""
        found = []
        for entry in read_records(self.run_dir / "data" / "slack-sink" / "messages.jsonl"):
            attachment = (entry["payload"].get("attachments") or [{}])[0]
            found.append({"title": attachment.get("title", ""), "text": attachment.get("text", "")})
        return found

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url("fleet_api", path), timeout=30)


def fleetsight(env: dict[str, str], *args: str, timeout: float) -> str:
    import subprocess

    result = subprocess.run(
        [*FLEETSIGHT, *args], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, (
        f"fleetsight {' '.join(args)}: {result.returncode}\n{result.stdout}\n{result.stderr}"
    )
    return result.stdout


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    run_dir = tmp_path_factory.mktemp("fleet") / "run"
    base = free_port_base(blocks=3)
    env = {
        **os.environ,
        "FLEETSIGHT_RUN_DIR": str(run_dir),
        "FLEETSIGHT_PORT_BASE": str(base),
        "COLUMNS": "200",
    }
    env.pop("FLEETSIGHT_CLUSTER", None)
    started = time.time()
    try:
        args = [f"--scenario={s}" for s in SCENARIOS]
        fleetsight(env, "up", *args, "--timeout", "600", *PER_CLUSTER, timeout=720)
        yield Fleet(run_dir, base, env, started)
    finally:
        fleetsight(env, "down", "--timeout", "30", timeout=600)


def component_pid(run_dir: Path, name: str) -> int:
    state = json.loads((run_dir / "state.json").read_text())
    (entry,) = [c for c in state["components"] if c["name"] == name]
    assert entry["status"] == "ready" and entry["pid"], entry
    return int(entry["pid"])


def query(fleet: Fleet, promql: str, **params: Any) -> list[dict[str, Any]]:
    response = httpx.get(
        fleet.url("fleet_query", "/api/v1/query"), params={"query": promql, **params}, timeout=30
    )
    response.raise_for_status()
    return response.json()["data"]["result"]


def messages_about(fleet: Fleet, cluster: str, alertname: str, node: str = "") -> list[dict[str, str]]:
    return [
        m
        for m in fleet.slack()
        if m["title"].startswith("[FIRING")
        and f"] {cluster}: {alertname}" in m["title"]
        and node in m["title"]
    ]


def test_status_and_plan_name_both_clusters(fleet: Fleet) -> None:
    out = fleetsight(fleet.env, "status", timeout=120)
    assert "global layer" in out and "cluster east" in out and "cluster west" in out, out
    plan = json.loads((fleet.run_dir / "clusters.json").read_text())
    assert [c["name"] for c in plan["clusters"]] == ["east", "west"]
    assert [c["port_base"] for c in plan["clusters"]] == [fleet.base + STRIDE, fleet.base + 2 * STRIDE]


def test_a_fault_in_each_cluster_reaches_the_one_slack_naming_its_cluster(fleet: Fleet) -> None:
    psu = wait_until(
        lambda: messages_about(fleet, "east", "PSUFailed", "n0002"),
        timeout=240,
        interval=2,
        what="east's PSU failure in Slack",
    )
    xid = wait_until(
        lambda: messages_about(fleet, "west", "GPUFellOffBus", "n0001"),
        timeout=240,
        interval=2,
        what="west's Xid 79 in Slack",
    )
    assert "cluster: `east`" in psu[0]["text"], psu[0]
    assert "cluster: `west`" in xid[0]["text"], xid[0]
    # Names repeat across clusters: neither fault is reported under the other cluster.
    assert not messages_about(fleet, "west", "PSUFailed"), fleet.slack()
    assert not messages_about(fleet, "east", "GPUFellOffBus"), fleet.slack()
    # The clusters' own Slack stand-ins got nothing: every cluster posts to the fleet's one Slack.
    for name in ("east", "west"):
        assert not read_records(fleet.cluster_dir(name) / "data" / "slack-sink" / "messages.jsonl")


def test_the_global_api_finds_a_node_and_a_job_in_either_cluster(fleet: Fleet) -> None:
    clusters = fleet.get("/v1/clusters").json()
    assert [c["cluster"] for c in clusters["clusters"]] == ["east", "west"], clusters
    assert clusters["missing"] == [] and clusters["metrics_missing"] == [], clusters

    node = fleet.get("/v1/nodes/n0001").json()
    assert sorted(m["cluster"] for m in node["matches"]) == ["east", "west"], node

    def job_fault(path: str, cluster: str, text: str) -> dict[str, Any] | None:
        response = fleet.get(path)
        if response.status_code != 200:
            return None
        matches = response.json()["matches"]
        if [m["cluster"] for m in matches] != [cluster]:
            return None
        return matches[0] if text in json.dumps(matches[0]["faults"]) else None

    east = wait_until(
        lambda: job_fault("/v1/jobs/6101/faults", "east", "PSUFailed"),
        timeout=240,
        interval=3,
        what="east's Slurm job 6101 with its PSU fault through the global API",
    )
    assert east["scheduler"] == "slurm", east
    west = wait_until(
        lambda: job_fault("/v1/jobs/team-w%2Fllm-8b-west/faults", "west", "GPUFellOffBus"),
        timeout=240,
        interval=3,
        what="west's JobSet with its Xid through the global API",
    )
    assert west["scheduler"] == "kubernetes" and west["namespace"] == "team-w", west
    assert fleet.get("/v1/jobs/no-such-job/faults").status_code == 404


def fleet_page(fleet: Fleet, browser: WebDriver, css: str, what: str, shot: str) -> None:
    """Open the global viewer's fleet page until ``css`` shows (the page polls; a reload each try too)."""

    def shown() -> bool:
        browser.get(fleet.url("fleet_dashboards", "/fleet"))
        return bool(
            wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "#clusters tbody tr"), timeout=20)
            and browser.find_elements(By.CSS_SELECTOR, css)
        )

    wait_until(shown, timeout=120, interval=3, what=what)
    assert console_errors(browser) == []
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(Path(SHOTS) / f"{shot}.png"))


def test_the_fleet_page_shows_a_fault_in_each_cluster(fleet: Fleet) -> None:
    with headless_chromium(width=1280, height=900) as browser:
        fleet_page(
            fleet,
            browser,
            '#alerts tr[data-cluster="east"][data-alert="PSUFailed"]',
            "east's PSUFailed on the fleet page",
            "fleet-two-clusters",
        )
        assert browser.find_elements(
            By.CSS_SELECTOR, '#alerts tr[data-cluster="west"][data-alert="GPUFellOffBus"]'
        )
        rows = {
            r.get_attribute("data-cluster")
            for r in browser.find_elements(By.CSS_SELECTOR, "#clusters tbody tr")
        }
        assert rows == {"east", "west"}, rows
        assert browser.find_element(By.ID, "partial").get_attribute("hidden") is not None  # nothing missing


def sample_times(fleet: Fleet, selector: str, start: float, end: float) -> list[float]:
    window = max(1, round(end - start))
    series = query(fleet, f"{selector}[{window}s]", time=f"{end:.3f}")
    assert len(series) == 1, series
    return [float(t) for t, _ in series[0]["values"]]


def test_one_cluster_pair_stopped_the_global_view_answers_for_the_other(fleet: Fleet) -> None:
    # Both clusters' metrics first, so that the outage below is the only reason one goes missing.
    wait_until(
        lambda: (
            {s["metric"]["cluster"] for s in query(fleet, "count by (cluster) (DCGM_FI_DEV_GPU_TEMP)")}
            == {"east", "west"}
        ),
        timeout=120,
        what="both clusters' GPUs through the global Query",
    )
    west_dir = fleet.cluster_dir("west")
    pids = [component_pid(west_dir, name) for name in PAIR]
    stopped_at = time.time()
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)  # hung, or the link cut: nothing answers, nothing refuses
    try:
        view = wait_until(
            lambda: (v := fleet.get("/v1/clusters").json())["metrics_missing"] and v,
            timeout=60,
            interval=1,
            what="the global layer to name west's metrics missing",
        )
        assert [m["cluster"] for m in view["metrics_missing"]] == ["west"], view
        assert view["missing"] == [], view  # west's health service still answers
        answered = query(fleet, "count by (cluster) (DCGM_FI_DEV_GPU_TEMP)")
        assert {s["metric"]["cluster"] for s in answered} == {"east"}, answered
        with headless_chromium(width=1280, height=900) as browser:
            fleet_page(
                fleet,
                browser,
                '#partial .gap[data-cluster="west"][data-what="metrics"]',
                "the fleet page's banner naming west",
                "fleet-west-missing",
            )
            assert "west" in browser.find_element(By.ID, "partial").text
        # Alerts once, from the global layer's own Prometheus, after its 2 minutes.
        wait_until(
            lambda: messages_about(fleet, "west", "FleetClusterMissing"),
            timeout=200,
            interval=2,
            what="FleetClusterMissing for west in Slack",
        )
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    thawed_at = time.time()
    wait_until(
        lambda: fleet.get("/v1/clusters").json()["metrics_missing"] == [],
        timeout=90,
        interval=1,
        what="west's metrics back in the global view",
    )
    assert len(messages_about(fleet, "west", "FleetClusterMissing")) == 1, fleet.slack()
    assert not messages_about(fleet, "east", "FleetClusterMissing"), fleet.slack()
    # east's data over the outage, through the global Query: no hole (a step over three 5 s scrapes).
    times = sample_times(
        fleet, 'DCGM_FI_DEV_GPU_TEMP{cluster="east", node="n0001", gpu="0"}', stopped_at - 30, thawed_at + 10
    )
    steps = [b - a for a, b in itertools.pairwise(times)]
    assert times and max(steps) <= 15, (max(steps), len(times))
    # samples from before the outage to its end (the query runs right after the thaw: its last step may be
    # a scrape interval short of it)
    assert times[0] <= stopped_at and times[-1] >= thawed_at - 10, (
        times[0],
        times[-1],
        stopped_at,
        thawed_at,
    )
    wait_until(
        lambda: (
            {s["metric"]["cluster"] for s in query(fleet, "count by (cluster) (DCGM_FI_DEV_GPU_TEMP)")}
            == {"east", "west"}
        ),
        timeout=90,
        what="west's GPUs back through the global Query",
    )
