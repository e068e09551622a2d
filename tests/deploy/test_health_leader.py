"""Two health replicas, one writer, on the real API server (health/leader.py, health/replica.py): both
run `fleetsight health serve --leader-election-*` as the chart's ServiceAccount (its Role on the Lease);
the leader decides and is applied to the Nodes API, the follower copies its state and answers reads;
the leader is killed (SIGKILL: no hand-over) and the follower takes the Lease within 15 s, with the
drain done before not done again and the held reason kept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from health_helpers import fast_policy, node_state, post_alert, start_health, wait_state
from kube import NAMESPACE, RELEASE, Cluster

from support import REPO_ROOT, Process, stopping, wait_until

NODES = [f"l{i:02d}" for i in range(1, 9)]  # one unit of 8: the breaker allows 2 drains
LEASE = f"{RELEASE}-fleetsight-health"  # the name the chart's Role allows get/update of
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE}"
TAKEOVER_S = 15
DRAIN_TOKEN = "leader-test-drain-token-82aa"


def holder(cluster: Cluster) -> str:
    response = cluster.api("GET", LEASE_PATH)
    return response.json()["spec"].get("holderIdentity") or "" if response.status_code == 200 else ""


def status(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/v1/status", timeout=5).json()


def role(url: str) -> str:
    return httpx.get(f"{url}/v1/nodes", timeout=5).headers.get("X-FleetSight-Role", "")


def events_of(url: str, node: str) -> list[dict[str, Any]]:
    return httpx.get(f"{url}/v1/events", params={"node": node}, timeout=5).json()["events"]


def decided(item: dict[str, Any]) -> tuple[Any, ...]:
    """What a takeover must keep of a node: its state and since, its drain, its reasons and their since."""
    reasons = [(r["signal"], r["since"], r.get("summary"), bool(r.get("last_seen"))) for r in item["reasons"]]
    return item["state"], item["since"], item["drain"], reasons


def sync(url: str, pair: dict[str, Any]) -> dict[str, list[str]]:
    """One round of `fleetsight health kubernetes-sync` (the chart's sidecar) against one replica."""
    command = [
        sys.executable, "-m", "fleetsight.cli", "health", "kubernetes-sync", "--url", url,
        "--policy", str(pair["policy_file"]), "--kubeconfig", str(pair["kubeconfig"]), "--json",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return {c["node"]: c["actions"] for c in json.loads(result.stdout)["changes"]}


def start_replica(folder: Path, name: str, base: dict[str, Any]) -> tuple[Process, str]:
    env = {"KUBECONFIG": str(base["kubeconfig"]), "POD_NAME": name}
    return start_health(
        folder / name, base["policy"], base["args"], tokens=f"{DRAIN_TOKEN}=read,drain", env=env
    )


@pytest.fixture(scope="module")
def pair(
    release: Cluster, alertmanager: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("health-leader")
    for name in NODES:
        release.add_node(name, {"su": "unit-l"})
    token = folder / "events-token"
    token.write_text("leader-test-events-token-31d7\n")
    policy = fast_policy(kubernetes={"cordon": True, "taint": True})
    policy["hysteresis"]["clean_for"] = "10m"  # a cleared reason is held through the whole test
    base = {
        "kubeconfig": release.service_account_kubeconfig(NAMESPACE, LEASE, folder / "health.kubeconfig"),
        "policy": policy,
        "args": [
            "--alertmanager-url", alertmanager, "--kubernetes-nodes", "--no-breaker-alert",
            "--events-token-file", str(token),
            "--leader-election-namespace", NAMESPACE, "--leader-election-name", LEASE,
        ],
    }  # fmt: skip
    a, url_a = start_replica(folder, "health-a", base)
    try:
        wait_until(lambda: holder(release) == "health-a", timeout=20, what="health-a holding the Lease")
        b, url_b = start_replica(folder, "health-b", base)  # ready once it holds a copy
        with stopping(b):
            policy_file = folder / "health-a" / "policy.yml"
            yield {
                "a": a,
                "b": b,
                "url_a": url_a,
                "url_b": url_b,
                "cluster": release,
                "policy_file": policy_file,
                **base,
            }
    finally:
        a.stop()
        for name in NODES:  # the other modules count the inventory (their breaker's fractions)
            release.api("DELETE", f"/api/v1/nodes/{name}")
        post_alert(alertmanager, "GPUXidUncorrectable", "l02", ends_in=0, gpu="1", xid="79")


def test_one_writer_then_the_follower_takes_over_without_doing_anything_twice(
    alertmanager: str, pair: dict[str, Any]
) -> None:
    cluster: Cluster = pair["cluster"]
    url_a, url_b = pair["url_a"], pair["url_b"]
    assert (role(url_a), role(url_b)) == ("leader", "follower")
    # a drain and a held reason, decided by the leader
    post_alert(alertmanager, "GPUXidUncorrectable", "l02", gpu="1", xid="79")
    post_alert(alertmanager, "GPUThermalThrottling", "l03", gpu="4")
    wait_state(url_a, "l02", "draining")
    wait_state(url_a, "l03", "degraded")
    post_alert(alertmanager, "GPUThermalThrottling", "l03", ends_in=0, gpu="4")
    wait_until(
        lambda: node_state(url_a, "l03")["reasons"][0].get("last_seen"), timeout=20, what="l03's reason held"
    )
    assert "cordon" in sync(url_a, pair)["l02"]
    assert sync(url_b, pair) == {}  # the follower's sidecar writes nothing
    # an operator's drain sent to the follower is the leader's to decide: forwarded with its token
    drain = httpx.post(
        f"{url_b}/v1/nodes/l05/drain",
        json={"reason": "bios update"},
        headers={"Authorization": f"Bearer {DRAIN_TOKEN}"},
        timeout=15,
    )
    assert drain.status_code == 200 and drain.headers["X-FleetSight-Role"] == "follower", drain.text
    assert node_state(url_a, "l05")["state"] in ("draining", "drained")
    drained = decided(node_state(url_a, "l02"))
    # the follower answers reads from its copy of the leader's state
    wait_until(
        lambda: decided(node_state(url_b, "l02")) == drained, timeout=10, what="the follower's copy of l02"
    )
    wait_until(lambda: node_state(url_b, "l03")["reasons"][0].get("last_seen"), timeout=10, what="l03 copied")
    held_before = decided(node_state(url_a, "l03"))
    drains_before = [e for e in events_of(url_b, "l02") if e.get("to") == "draining"]
    assert len(drains_before) == 1

    killed = time.monotonic()
    os.kill(pair["a"].popen.pid, signal.SIGKILL)  # a crash: the Lease is not handed over
    wait_until(
        lambda: holder(cluster) == "health-b", timeout=TAKEOVER_S + 5, what="health-b taking the Lease"
    )
    wait_until(lambda: role(url_b) == "leader", timeout=5, what="health-b writing")
    takeover = time.monotonic() - killed
    print(f"\ntakeover: {takeover:.1f} s after SIGKILL of the leader")
    assert takeover <= TAKEOVER_S

    # after the new leader's first sweep (not the copy it answered from until then): l02 is the same
    # drain, not a new one; l03's reason is held
    wait_until(lambda: status(url_b)["leader"]["sweeps"] >= 1, timeout=10, what="health-b's first sweep")
    assert decided(node_state(url_b, "l02")) == drained
    assert [e for e in events_of(url_b, "l02") if e.get("to") == "draining"] == drains_before
    held = node_state(url_b, "l03")
    assert held["state"] == "degraded" and held["reasons"][0]["signal"] == "GPUThermalThrottling"
    assert decided(held) == held_before, held
    # the cordon is there: the new leader's sidecar has nothing to do for these nodes
    conditions = [c for c in cluster.node("l03")["status"]["conditions"] if c["type"].startswith("Fleet")]
    assert not {"l02", "l03"} & set(sync(url_b, pair)), (conditions, node_state(url_b, "l03"))
    assert cluster.node("l02")["spec"]["unschedulable"] is True
