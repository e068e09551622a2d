"""Prometheus targets from the scheduler, end to end on real servers: Slurm 22.05 (nodes created and
deleted at run time with `scontrol create/delete`), the health service's /v1/targets/<job>, and a real
Prometheus whose only source of targets is that http_sd endpoint."""

from __future__ import annotations

import subprocess
import time
from typing import Any

import httpx
import yaml
from baremetal_helpers import NODES, REPO, SD_REFRESH_S, DynamicSlurm

from health.discovery import DEFAULT_PORTS
from support import free_port, wait_until

# A change reaches Prometheus's active targets within one health refresh (0.3 s), one http_sd refresh
# and the scrape manager's own 5 s tick for applying new target sets, plus slack for a shared machine.
WITHIN_S = 0.3 + SD_REFRESH_S + 5 + 10


def scontrol(slurm: DynamicSlurm, *args: str) -> None:
    result = subprocess.run(
        ["scontrol", *args], env=slurm.env, capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, f"scontrol {' '.join(args)}: {result.stderr}"


def active_targets(prometheus: str) -> dict[str, dict[str, Any]]:
    """node -> the target's labels, as Prometheus has them now."""
    response = httpx.get(f"{prometheus}/api/v1/targets", params={"state": "active"}, timeout=5)
    response.raise_for_status()
    return {t["labels"]["node"]: t["labels"] for t in response.json()["data"]["activeTargets"]}


def timed(predicate, what: str) -> float:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    wait_until(predicate, timeout=WITHIN_S, interval=0.1, what=what)
    elapsed = time.monotonic() - started
    print(f"\ndiscovery: {what}: {elapsed:.2f} s")  # the figures of the 'Must show'
    return elapsed


def test_targets_are_the_scheduler_nodes_with_their_labels(health: str, prometheus: str) -> None:
    targets = wait_until(lambda: (t := active_targets(prometheus)) and set(NODES) <= set(t) and t, 30)
    labels = targets["n0001"]
    assert labels["instance"] == "n0001:9401"
    assert labels["job"] == "fleetsight-node"
    assert labels["cluster"] == "test"
    assert labels["partition"] == "batch"
    assert labels["scheduler_state"] == "idle"
    assert labels["unit"]
    groups = httpx.get(f"{health}/v1/targets/dcgm").json()
    assert {"targets": ["n0002:9400"]} | {"labels": groups[1]["labels"]} == groups[1]


def test_unknown_job_is_a_clear_404(health: str) -> None:
    response = httpx.get(f"{health}/v1/targets/nope")
    assert response.status_code == 404
    assert "known: dcgm, fleetsight-node, node" in response.text


def test_node_added_then_removed(slurm: DynamicSlurm, prometheus: str) -> None:
    wait_until(lambda: set(NODES) <= set(active_targets(prometheus)), 30, what="the first targets")
    scontrol(
        slurm,
        "create",
        "NodeName=n0042",
        "CPUs=1",
        "NodeAddr=127.0.0.1",
        f"Port={free_port()}",
        "State=CLOUD",
    )
    added = timed(lambda: "n0042" in active_targets(prometheus), "node added -> target up")
    assert active_targets(prometheus)["n0042"]["partition"] == "batch"
    scontrol(slurm, "delete", "NodeName=n0042")
    removed = timed(lambda: "n0042" not in active_targets(prometheus), "node removed -> target gone")
    assert added < WITHIN_S and removed < WITHIN_S


def state_of(prometheus: str, node: str) -> str:
    return active_targets(prometheus).get(node, {}).get("scheduler_state", "")


def test_drained_and_down_nodes_stay_targets_with_their_state(slurm: DynamicSlurm, prometheus: str) -> None:
    wait_until(lambda: set(NODES) <= set(active_targets(prometheus)), 30, what="the first targets")
    scontrol(slurm, "update", "NodeName=n0002", "State=DRAIN", "Reason=test: bad GPU")
    # a DOWN node whose slurmd still answers returns to service at its next ping (ReturnToService=2),
    # which on a loaded machine can come before the relabelled target is seen: its slurmd is stopped
    slurm.hang("n0003")
    scontrol(slurm, "update", "NodeName=n0003", "State=DOWN", "Reason=test: hung")
    try:
        timed(
            lambda: "drain" in state_of(prometheus, "n0002"),
            "node drained -> target relabelled",
        )
        timed(
            lambda: state_of(prometheus, "n0003").startswith("down"),
            "node down -> target relabelled",
        )
        assert set(NODES) <= set(active_targets(prometheus))
    finally:
        slurm.unhang("n0003")
        # restore; a DOWN node whose slurmd answers may already be back (ReturnToService=2), and Slurm
        # refuses to resume an idle node: best effort, per node
        for node in ("n0002", "n0003"):
            subprocess.run(
                ["scontrol", "update", f"NodeName={node}", "State=RESUME"], env=slurm.env, check=False
            )


def test_production_config_discovers_every_per_node_job_from_the_health_service() -> None:
    """metrics/prometheus.yml: each per-node job reads the compose `health` service's /v1/targets/<job>
    on the port it listens on, and keeps its file_sd list as the fallback."""
    production = yaml.safe_load((REPO / "metrics" / "prometheus.yml").read_text())
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    listen = next(a for a in compose["services"]["health"]["command"] if a.startswith("--listen="))
    jobs = {job["job_name"]: job for job in production["scrape_configs"]}
    for name in DEFAULT_PORTS:
        urls = [sd["url"] for sd in jobs[name].get("http_sd_configs", [])]
        assert f"http://health:{listen.rpartition(':')[2]}/v1/targets/{name}" in urls, name
        assert jobs[name]["file_sd_configs"], f"{name}: the file_sd fallback is gone"
