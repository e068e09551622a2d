"""Node health on a real API server: the health service (inventory from the Nodes API, as the chart's
ServiceAccount) and `fleetsight health kubernetes-sync` (same token) set the FleetSightGPUHealthy
condition, the state label, a cordon and taints for a failing node, lift only what they set, leave an
operator's cordon alone, hold on the circuit breaker, and a NoExecute taint (policy: repair) gets a pod
without a toleration evicted by kube-controller-manager's taint-eviction controller."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from health_helpers import fast_policy, node_state, post_alert, start_health, wait_state
from kube import NAMESPACE, RELEASE, Cluster

from health.kubernetes import CONDITION, CORDONED, LABEL, TAINT_KEY, TAINTS
from support import REPO_ROOT, stopping, wait_until

NODES = [f"k{i:02d}" for i in range(1, 17)]  # units of 8 by their su label: k01-k08 unit01, k09-k16 unit02
LEAF = NODES[8:]
OPERATOR_TAINT = {"key": "example.com/maintenance", "value": "bios", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def setup(
    release: Cluster, alertmanager: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("health-kubernetes")
    for index, name in enumerate(NODES):
        # not labelled nvidia.com/gpu.present: the chart's DaemonSets stay on gpu-a and gpu-b
        release.add_node(name, {"su": f"unit0{1 + index // 8}"})
    wait_until(lambda: all(release.node_ready(n) for n in NODES), timeout=30, what="the k nodes Ready")
    health = f"{RELEASE}-fleetsight-health"
    kubeconfig = release.service_account_kubeconfig(NAMESPACE, health, folder / "health.kubeconfig")
    policy = fast_policy(kubernetes={"cordon": True, "taint": True, "no_execute_for": ["repair"]})
    policy["circuit_breaker"]["unit_label"] = "su"
    args = ["--alertmanager-url", alertmanager, "--kubernetes-nodes", "--no-breaker-alert"]
    process, url = start_health(folder, policy, args, env={"KUBECONFIG": str(kubeconfig)})
    with stopping(process):
        yield {"url": url, "kubeconfig": kubeconfig, "policy": folder / "policy.yml", "cluster": release}


def sync(setup: dict[str, Any], *extra: str) -> dict[str, list[str]]:
    """One round of `fleetsight health kubernetes-sync` as the health ServiceAccount: node -> actions."""
    command = [
        sys.executable, "-m", "fleetsight.cli", "health", "kubernetes-sync", "--url", setup["url"],
        "--policy", str(setup["policy"]), "--kubeconfig", str(setup["kubeconfig"]), "--json", *extra,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return {c["node"]: c["actions"] for c in json.loads(result.stdout)["changes"]}


def condition(node: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in node["status"]["conditions"] if c["type"] == CONDITION)


def ours(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in node["spec"].get("taints") or [] if t["key"] == TAINT_KEY]


def test_the_inventory_comes_from_the_nodes_api(setup: dict[str, Any]) -> None:
    wait_until(lambda: node_state(setup["url"], "k16"), timeout=20, what="k16 known to the service")
    assert node_state(setup["url"], "k09")["unit"] == "unit02"
    assert node_state(setup["url"], "gpu-a")["state"] == "healthy"


def test_a_failing_node_gets_condition_label_cordon_and_taint(
    alertmanager: str, setup: dict[str, Any]
) -> None:
    cluster: Cluster = setup["cluster"]
    post_alert(alertmanager, "GPUXidUncorrectable", "k02", gpu="1", xid="79")
    wait_state(setup["url"], "k02", "draining")
    planned = sync(setup, "--dry-run")
    assert "cordon" in planned["k02"] and not cluster.node("k02")["spec"].get("unschedulable")
    changes = sync(setup)
    assert changes["k02"] == planned["k02"]
    assert changes["k02"][:2] == ["label fleetsight.io/health=draining", "cordon"]
    node = cluster.node("k02")
    assert node["spec"]["unschedulable"] is True
    assert [(t["effect"], t["value"]) for t in ours(node)] == [("NoSchedule", "draining")]
    assert node["metadata"]["labels"][LABEL] == "draining"
    assert node["metadata"]["annotations"][CORDONED] == "true"
    assert node["metadata"]["annotations"][TAINTS] == "NoSchedule"
    state = condition(node)
    assert (state["status"], state["reason"]) == ("False", "FleetSightDraining")
    assert "GPUXidUncorrectable" in state["message"]
    healthy = cluster.node("k01")
    assert condition(healthy)["status"] == "True" and healthy["metadata"]["labels"][LABEL] == "healthy"
    assert not healthy["spec"].get("unschedulable") and not ours(healthy)
    # kwok's kubelet keeps its own conditions beside FleetSight's
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
    assert sync(setup) == {}  # nothing changes twice


def test_recovery_lifts_only_what_fleetsight_set(alertmanager: str, setup: dict[str, Any]) -> None:
    cluster: Cluster = setup["cluster"]
    # an operator cordons k03 and taints it for maintenance; then k03 fails as well
    cluster.patch("/api/v1/nodes/k03", {"spec": {"unschedulable": True, "taints": [OPERATOR_TAINT]}})
    post_alert(alertmanager, "GPUXidUncorrectable", "k03", gpu="0", xid="79")
    wait_state(setup["url"], "k03", "draining")
    assert "cordon" not in sync(setup)["k03"]
    assert CORDONED not in cluster.node("k03")["metadata"].get("annotations", {})
    # both recover
    post_alert(alertmanager, "GPUXidUncorrectable", "k02", ends_in=0, gpu="1", xid="79")
    post_alert(alertmanager, "GPUXidUncorrectable", "k03", ends_in=0, gpu="0", xid="79")
    wait_state(setup["url"], "k02", "healthy")
    wait_state(setup["url"], "k03", "healthy")
    changes = sync(setup)
    assert "uncordon (FleetSight's cordon)" in changes["k02"]
    assert not any(a.startswith("uncordon") for a in changes["k03"])
    k02, k03 = cluster.node("k02"), cluster.node("k03")
    assert not k02["spec"].get("unschedulable") and not ours(k02)
    assert not {CORDONED, TAINTS} & set(k02["metadata"].get("annotations", {}))
    assert condition(k02)["status"] == "True" and k02["metadata"]["labels"][LABEL] == "healthy"
    assert k03["spec"]["unschedulable"] is True  # the operator's cordon stays
    assert OPERATOR_TAINT in k03["spec"]["taints"] and not ours(k03)  # and their taint
    # (the node lifecycle controller adds node.kubernetes.io/unschedulable to a cordoned node itself)


def test_a_mass_failure_cordons_nobody(alertmanager: str, setup: dict[str, Any]) -> None:
    cluster: Cluster = setup["cluster"]
    post_alert(alertmanager, "InfiniBandPortDown", LEAF, port="1", device="mlx5_0")
    wait_until(
        lambda: all(node_state(setup["url"], n)["state"] == "unhealthy" for n in LEAF),
        timeout=20,
        what="the whole unit unhealthy",
    )
    sync(setup)
    for name in LEAF:
        node = cluster.node(name)
        assert not node["spec"].get("unschedulable") and not ours(node), name
        assert node["metadata"]["labels"][LABEL] == "unhealthy"
        state = condition(node)
        assert (state["status"], state["reason"]) == ("False", "FleetSightUnhealthy")
        assert "circuit breaker holds" in state["message"]
    post_alert(alertmanager, "InfiniBandPortDown", LEAF, ends_in=0, port="1", device="mlx5_0")
    wait_until(
        lambda: all(node_state(setup["url"], n)["state"] == "healthy" for n in LEAF),
        timeout=30,
        what="the unit healthy again",
    )


def pod(name: str, node: str, tolerate_fleetsight: bool) -> dict[str, Any]:
    tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    if tolerate_fleetsight:
        tolerations.append({"key": TAINT_KEY, "operator": "Exists"})
    containers = [{"name": "train", "image": "example.org/train:1"}]
    return {
        "metadata": {"name": name},
        "spec": {"nodeName": node, "tolerations": tolerations, "containers": containers},
    }


def test_no_execute_evicts_pods_without_a_toleration(alertmanager: str, setup: dict[str, Any]) -> None:
    cluster: Cluster = setup["cluster"]
    pods = "/api/v1/namespaces/default/pods"
    cluster.create(pods, pod("plain", "k13", tolerate_fleetsight=False))
    cluster.create(pods, pod("tolerant", "k13", tolerate_fleetsight=True))
    for name in ("plain", "tolerant"):
        wait_until(
            lambda n=name: cluster.get(f"{pods}/{n}")["status"].get("phase") == "Running",
            timeout=30,
            what=f"{name} Running",
        )
    # k13: unit02's drain budget is unused (k02 and k03 spent unit01's: 2 of 8 nodes per window)
    post_alert(alertmanager, "GPUFellOffBus", "k13", gpu="3")  # effect repair: the policy's NoExecute
    wait_state(setup["url"], "k13", "draining")
    assert "taint fleetsight.io/unhealthy=draining:NoExecute" in sync(setup)["k13"]
    assert sorted(t["effect"] for t in ours(cluster.node("k13"))) == ["NoExecute", "NoSchedule"]
    wait_until(
        lambda: cluster.api("GET", f"{pods}/plain").status_code == 404, timeout=60, what="plain evicted"
    )
    assert cluster.get(f"{pods}/tolerant")["status"]["phase"] == "Running"
    events = cluster.get("/api/v1/namespaces/default/events")["items"]
    assert any(
        e["reason"] == "TaintManagerEviction" and e["involvedObject"]["name"] == "plain" for e in events
    )
    post_alert(alertmanager, "GPUFellOffBus", "k13", ends_in=0, gpu="3")
    wait_state(setup["url"], "k13", "healthy")
    sync(setup)
    assert not ours(cluster.node("k13")) and not cluster.node("k13")["spec"].get("unschedulable")


def test_the_policy_block_is_checked(tmp_path: Path) -> None:
    (tmp_path / "policy.yml").write_text(yaml.safe_dump({"kubernetes": {"no_execute_for": ["degraded"]}}))
    command = [
        sys.executable,
        "-m",
        "fleetsight.cli",
        "health",
        "kubernetes-sync",
        "--policy",
        str(tmp_path / "policy.yml"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert result.returncode != 0
    assert "kubernetes.no_execute_for: a list of signal effects among unhealthy, repair" in result.stderr
