"""Active checks on a real kube-apiserver with kwok playing the kubelets: an intrusive check is a Job
pinned to an idle node (never beside a training pod), one per fabric leaf, within the budget, tolerating
FleetSight's taint; results become node labels; and a node the health service drained (cordon + taint by
kubernetes-sync) is untainted only after its validation check passes.

kwok runs no containers: the test plays the kubelet by running each Job's own command line here, which
posts its result to the checks service exactly as the container would."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from health_helpers import fast_policy, post_alert, start_health
from kube import NAMESPACE, Cluster

from checks.catalog import load_catalog
from checks.kube import CHECK_LABEL, TAINT_KEY, KubeChecks, KubeClient
from checks.plan import Unit
from checks.slurm import validation_requests
from support import REPO_ROOT, Process, free_port, stopping, wait_until

NODES = ["kc1", "kc2", "kc3", "kc4"]
LEAVES = {"kc1": "leaf-a", "kc2": "leaf-a", "kc3": "leaf-b", "kc4": "leaf-b"}
FLEETSIGHT = [sys.executable, "-m", "fleetsight.cli"]
TRACE: list[str] = []


@pytest.fixture(scope="module")
def world(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("checks-kube")
    for name in NODES:
        cluster.add_node(name, {"fleetsight-test": "checks"})
    wait_until(lambda: all(cluster.node_ready(n) for n in NODES), timeout=30, what="the kc nodes Ready")
    with_namespace(cluster)
    faults, tools, policy = folder / "faults.yml", folder / "tools.yml", folder / "policy.yml"
    faults.write_text("{}\n")
    stand_in = [sys.executable, "-m", "twin.checks", "--faults", str(faults), "--node", "{node}", "dcgmi"]
    tools.write_text(yaml.safe_dump({"tools": {"dcgmi": stand_in}}))
    policy.write_text(yaml.safe_dump({"after": {"GPUXidUncorrectable": ["dcgm_diag_r3"]}, "default": []}))
    port = free_port()
    command = [*FLEETSIGHT, "checks", "serve", "--listen", f"127.0.0.1:{port}", "--state-dir", str(folder)]
    process = Process("checks", [*command, "--policy", str(policy)], folder / "checks.log")
    url = f"http://127.0.0.1:{port}"
    with stopping(process):
        process.wait_ready(f"{url}/-/ready")
        runner = KubeChecks(
            KubeClient(cluster.admin_kubeconfig), load_catalog(), url, FLEETSIGHT, tools=str(tools),
            leaf_map={n: frozenset({leaf}) for n, leaf in LEAVES.items()}, budget=3,
        )  # fmt: skip
        yield {"url": url, "faults": faults, "runner": runner, "folder": folder, "cluster": cluster}


def with_namespace(cluster: Cluster) -> None:
    if cluster.api("GET", f"/api/v1/namespaces/{NAMESPACE}").status_code == 404:
        cluster.create(
            "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        )


def results(url: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["node"], r["check"]): r for r in httpx.get(f"{url}/v1/results", timeout=5).json()["results"]}


def play_kubelet(cluster: Cluster, node: str) -> None:
    """Run the newest check Job of the node as its container would (kwok runs none)."""
    jobs = cluster.get(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs?labelSelector={CHECK_LABEL}")["items"]
    mine = [j for j in jobs if j["spec"]["template"]["spec"]["nodeName"] == node]
    job = max(mine, key=lambda j: j["metadata"]["creationTimestamp"] + j["metadata"]["name"])
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)


def test_jobs_only_on_idle_nodes_one_per_leaf_pinned_and_tolerating_the_taint(world: dict[str, Any]) -> None:
    cluster: Cluster = world["cluster"]
    runner: KubeChecks = world["runner"]
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "training-0", "namespace": NAMESPACE},
        "spec": {"nodeName": "kc1", "containers": [{"name": "train", "image": "trainer:1"}],
                 "tolerations": [{"operator": "Exists"}]},
    }  # fmt: skip
    cluster.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
    wait_until(lambda: "kc1" in runner.busy_nodes(), timeout=20, what="kc1 busy with the training pod")
    taint = {"key": TAINT_KEY, "value": "drained", "effect": "NoSchedule"}
    cluster.patch("/api/v1/nodes/kc3", {"spec": {"unschedulable": True, "taints": [taint]}})
    wanted = [Unit("dcgm_diag_r2", (n,)) for n in NODES]
    decision = runner.cycle(wanted, NODES, results(world["url"]))
    assert [u.nodes for u in decision.start] == [("kc2",), ("kc3",)]
    assert decision.waiting[wanted[0]] == "not idle: kc1"
    assert decision.waiting[wanted[3]] == "leaf busy: leaf-b"
    jobs = cluster.get(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs?labelSelector={CHECK_LABEL}")["items"]
    spec = next(j for j in jobs if j["spec"]["template"]["spec"]["nodeName"] == "kc3")["spec"]["template"][
        "spec"
    ]
    assert {"key": TAINT_KEY, "operator": "Exists"} in spec["tolerations"]
    assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert runner.cycle(wanted, NODES, results(world["url"])).start == []  # still running: nothing twice
    for node in ("kc2", "kc3"):
        play_kubelet(cluster, node)
    assert {("kc2", "dcgm_diag_r2"), ("kc3", "dcgm_diag_r2")} <= set(results(world["url"]))
    second = runner.cycle(wanted, NODES, results(world["url"]))
    assert [u.nodes for u in second.start] == [("kc2",), ("kc3",)]  # done: the leaves are free again
    labels = runner.label_results(list(results(world["url"]).values()))
    assert labels["kc2"] == {"fleetsight.io/check-dcgm-diag-r2": "PASS"}
    assert cluster.node("kc2")["metadata"]["labels"]["fleetsight.io/check-dcgm-diag-r2"] == "PASS"
    cluster.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/training-0")
    cluster.patch("/api/v1/nodes/kc3", {"spec": {"unschedulable": None, "taints": None}})
    for node in ("kc2", "kc3"):
        play_kubelet(cluster, node)  # finish the second round


def kube_sync(world: dict[str, Any], health: str, policy: Path) -> None:
    command = [*FLEETSIGHT, "health", "kubernetes-sync", "--url", health, "--policy", str(policy),
               "--kubeconfig", str(world["cluster"].admin_kubeconfig), "--json"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def drain_listed(url: str, node: str) -> bool:
    return node in [d["node"] for d in httpx.get(f"{url}/v1/drain-list", timeout=5).json()["nodes"]]


def phase(url: str, node: str) -> dict[str, Any]:
    response = httpx.get(f"{url}/v1/validation/{node}", timeout=5)
    return response.json() if response.status_code == 200 else {"phase": None}


def trace(world: dict[str, Any], url: str, node: str, step: str) -> None:
    item = world["cluster"].node(node)
    taints = [f"{t['key']}={t.get('value')}:{t['effect']}" for t in item["spec"].get("taints") or []]
    label = item["metadata"]["labels"].get("fleetsight.io/check-dcgm-diag-r3", "-")
    state = httpx.get(f"{url}/v1/nodes/{node}", timeout=5).json()["state"]
    TRACE.append(
        f"{time.strftime('%H:%M:%S')} {step:<34} health={state:<9} phase={phase(url, node)['phase']!s:<10} "
        f"taints={','.join(taints) or '-'} check-dcgm-diag-r3={label}"
    )


def test_drained_node_is_untainted_only_after_its_validation_check_passes(
    world: dict[str, Any], alertmanager: str, tmp_path: Path
) -> None:
    node, runner = "kc4", world["runner"]
    world["faults"].write_text(yaml.safe_dump({node: [{"kind": "hbm_silent_corruption", "gpu": 5}]}))
    policy = fast_policy(kubernetes={"cordon": True, "taint": True, "no_execute_for": []})
    policy["circuit_breaker"].update(max_cluster_fraction=1.0, max_unit_fraction=1.0)
    env = {"KUBECONFIG": str(world["cluster"].admin_kubeconfig), "FLEETSIGHT_CHECKS_URL": world["url"]}
    env["FLEETSIGHT_CHECKS_REFRESH"] = "0.3"
    args = ["--alertmanager-url", alertmanager, "--kubernetes-nodes", "--no-breaker-alert"]
    process, url = start_health(tmp_path / "health", policy, args, env=env)
    policy_file = tmp_path / "health" / "policy.yml"
    catalog = runner.catalog

    def cycle(retry_after: float = 3600.0) -> list[Unit]:
        wanted = validation_requests(url, catalog, retry_after)
        return runner.cycle(wanted, NODES, results(world["url"])).start

    with stopping(process):
        wait_until(
            lambda: httpx.get(f"{url}/v1/nodes/{node}").status_code == 200, timeout=20, what="kc4 known"
        )
        post_alert(alertmanager, "GPUXidUncorrectable", node, ends_in=600, xid="48")
        wait_until(lambda: phase(url, node)["phase"] == "drained", timeout=30, what="the drain")
        kube_sync(world, url, policy_file)
        trace(world, url, node, "alert fired, kubernetes-sync tainted")
        post_alert(alertmanager, "GPUXidUncorrectable", node, ends_in=0, xid="48")
        wait_until(lambda: phase(url, node)["phase"] == "validating", timeout=30, what="validation to start")
        trace(world, url, node, "alert resolved: validating")
        assert cycle() == [Unit("dcgm_diag_r3", (node,), validation=True)]
        play_kubelet(world["cluster"], node)
        wait_until(lambda: phase(url, node)["phase"] == "failed", timeout=30, what="the failing diagnostic")
        runner.label_results(list(results(world["url"]).values()))
        kube_sync(world, url, policy_file)
        trace(world, url, node, "dcgm_diag_r3 ERR: stays tainted")
        assert any(t["key"] == TAINT_KEY for t in world["cluster"].node(node)["spec"]["taints"])
        assert "memtest (GPU 5)" in phase(url, node)["failed"][0]["summary"]

        world["faults"].write_text("{}\n")  # the GPU is replaced
        assert cycle() == []  # a failed check reruns only after retry_after
        assert cycle(retry_after=0) == [Unit("dcgm_diag_r3", (node,), validation=True)]
        play_kubelet(world["cluster"], node)
        wait_until(lambda: phase(url, node)["phase"] == "resumed", timeout=30, what="the passing diagnostic")
        runner.label_results(list(results(world["url"]).values()))
        wait_until(lambda: not drain_listed(url, node), timeout=30, what="the drain released")
        kube_sync(world, url, policy_file)
        trace(world, url, node, "dcgm_diag_r3 PASS: untainted")
        item = world["cluster"].node(node)
        assert not [t for t in item["spec"].get("taints") or [] if t["key"] == TAINT_KEY]
        assert not item["spec"].get("unschedulable")
        assert item["metadata"]["labels"]["fleetsight.io/check-dcgm-diag-r3"] == "PASS"
    print("\n".join(["", "drain -> validate -> resume on Kubernetes:", *TRACE]))
    json.dumps(TRACE)
