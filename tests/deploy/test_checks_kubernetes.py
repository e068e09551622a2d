"""Active checks on a real kube-apiserver with kwok playing the kubelets: an intrusive check is a Job
pinned to an idle node (never beside a training pod), one per fabric leaf, within the budget, tolerating
FleetSight's taint; results become node labels; a node the health service drained (cordon + taint by
kubernetes-sync) is untainted only after its validation check passes; and the InfiniBand pair check is two
Jobs started together, one pinned to each node of the pair, whose result is read per port.

kwok runs no containers: the test plays the kubelet by running each Job's own command line here, which
posts its result to the checks service exactly as the container would (a pair's two Jobs at once, as two
processes; the twin's ib_write_bw stand-ins find each other through the nodes' InternalIPs, which the test
gives each node as its kubelet would report them)."""

from __future__ import annotations

import base64
import json
import os
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
ADDRESSES = {node: f"10.0.1.{i}" for i, node in enumerate(NODES, start=11)}  # each node's InternalIP
FLEETSIGHT = [sys.executable, "-m", "fleetsight.cli"]
TRACE: list[str] = []
# The Jobs' token for POST /v1/results: a Secret in the namespace, as the chart's checksToken.
TOKEN_SECRET, TOKEN = "fleetsight-checks-token", "kube-test-results-token-3f9c"


@pytest.fixture(scope="module")
def world(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("checks-kube")
    for name in NODES:
        cluster.add_node(name, {"fleetsight-test": "checks"})
    wait_until(lambda: all(cluster.node_ready(n) for n in NODES), timeout=30, what="the kc nodes Ready")
    for name, address in ADDRESSES.items():  # what each node's kubelet reports (kwok keeps it)
        status = {
            "addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name}]
        }
        cluster.api("PATCH", f"/api/v1/nodes/{name}/status", json={"status": status},
                    headers={"Content-Type": "application/merge-patch+json"}).raise_for_status()  # fmt: skip
    with_namespace(cluster)
    faults, tools, policy = folder / "faults.yml", folder / "tools.yml", folder / "policy.yml"
    faults.write_text("{}\n")
    stand_in = [sys.executable, "-m", "twin.checks", "--faults", str(faults), "--node", "{node}"]
    stand_ins = {"dcgmi": [*stand_in, "dcgmi"], "ib_write_bw": [*stand_in, "ib_write_bw"]}
    tools.write_text(yaml.safe_dump({"tools": stand_ins}))
    # the twin's nodes share this host: its perftest stand-ins resolve an address as /etc/hosts would
    (folder / "twin-ib").mkdir()
    (folder / "twin-ib" / "hosts").write_text("".join(f"{a} {n}\n" for n, a in ADDRESSES.items()))
    # DCGM 4 runs memtest, the test that finds silent HBM corruption, at level 4 (checks/policy.yml)
    policy.write_text(yaml.safe_dump({"after": {"GPUXidUncorrectable": ["dcgm_diag_r4"]}, "default": []}))
    port = free_port()
    command = [*FLEETSIGHT, "checks", "serve", "--listen", f"127.0.0.1:{port}", "--state-dir", str(folder)]
    meta = {"name": TOKEN_SECRET, "namespace": NAMESPACE}
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "stringData": {"token": TOKEN}}
    if cluster.api("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets/{TOKEN_SECRET}").status_code == 404:
        cluster.create(f"/api/v1/namespaces/{NAMESPACE}/secrets", secret)
    service_env = {**os.environ, "FLEETSIGHT_CHECKS_TOKENS": f"{TOKEN}=results"}
    process = Process("checks", [*command, "--policy", str(policy)], folder / "checks.log", service_env)
    url = f"http://127.0.0.1:{port}"
    with stopping(process):
        process.wait_ready(f"{url}/-/ready")
        runner = KubeChecks(
            KubeClient(cluster.admin_kubeconfig), load_catalog(), url, FLEETSIGHT, tools=str(tools),
            leaf_map={n: frozenset({leaf}) for n, leaf in LEAVES.items()}, budget=3,
            token_secret=TOKEN_SECRET,
        )  # fmt: skip
        yield {"url": url, "faults": faults, "runner": runner, "folder": folder, "cluster": cluster}


def with_namespace(cluster: Cluster) -> None:
    if cluster.api("GET", f"/api/v1/namespaces/{NAMESPACE}").status_code == 404:
        cluster.create(
            "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        )


def results(url: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["node"], r["check"]): r for r in httpx.get(f"{url}/v1/results", timeout=5).json()["results"]}


def container_env(cluster: Cluster, container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet gives it: its values, its Secret references read from
    the apiserver (the Jobs' FLEETSIGHT_CHECKS_TOKEN), over this process's own environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSIGHT_CHECKS_TOKEN")}
    for item in container.get("env") or []:
        ref = (item.get("valueFrom") or {}).get("secretKeyRef")
        if ref:
            data = cluster.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{ref['name']}")["data"]
            env[item["name"]] = base64.b64decode(data[ref["key"]]).decode()
        else:
            env[item["name"]] = item.get("value", "")
    return env


def play_kubelet(cluster: Cluster, node: str) -> None:
    """Run the newest check Job of the node as its container would (kwok runs none)."""
    jobs = cluster.get(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs?labelSelector={CHECK_LABEL}")["items"]
    mine = [j for j in jobs if j["spec"]["template"]["spec"]["nodeName"] == node]
    job = max(mine, key=lambda j: j["metadata"]["creationTimestamp"] + j["metadata"]["name"])
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = container_env(cluster, container)
    done = subprocess.run(
        container["command"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False, env=env
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr  # 3: the result was not taken


def train_on_kc1_and_drain_kc3(cluster: Cluster, runner: KubeChecks, pod_name: str) -> None:
    """A training pod on kc1 (busy: no intrusive check there) and kc3 cordoned with FleetSight's taint
    (drained: its validation must tolerate it)."""
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod_name, "namespace": NAMESPACE},
        "spec": {"nodeName": "kc1", "containers": [{"name": "train", "image": "trainer:1"}],
                 "tolerations": [{"operator": "Exists"}]},
    }  # fmt: skip
    cluster.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
    wait_until(lambda: "kc1" in runner.busy_nodes(), timeout=20, what="kc1 busy with the training pod")
    taint = {"key": TAINT_KEY, "value": "drained", "effect": "NoSchedule"}
    cluster.patch("/api/v1/nodes/kc3", {"spec": {"unschedulable": True, "taints": [taint]}})


def test_jobs_only_on_idle_nodes_one_per_leaf_pinned_and_tolerating_the_taint(world: dict[str, Any]) -> None:
    cluster: Cluster = world["cluster"]
    runner: KubeChecks = world["runner"]
    train_on_kc1_and_drain_kc3(cluster, runner, "training-0")
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
    token_ref = {"secretKeyRef": {"name": TOKEN_SECRET, "key": "token"}}
    assert spec["containers"][0]["env"] == [{"name": "FLEETSIGHT_CHECKS_TOKEN", "valueFrom": token_ref}]
    assert TOKEN not in json.dumps(jobs)  # the Job names the Secret, never the token
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
    label = item["metadata"]["labels"].get("fleetsight.io/check-dcgm-diag-r4", "-")
    state = httpx.get(f"{url}/v1/nodes/{node}", timeout=5).json()["state"]
    TRACE.append(
        f"{time.strftime('%H:%M:%S')} {step:<34} health={state:<9} phase={phase(url, node)['phase']!s:<10} "
        f"taints={','.join(taints) or '-'} check-dcgm-diag-r4={label}"
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
        assert cycle() == [Unit("dcgm_diag_r4", (node,), validation=True)]
        play_kubelet(world["cluster"], node)
        wait_until(lambda: phase(url, node)["phase"] == "failed", timeout=30, what="the failing diagnostic")
        runner.label_results(list(results(world["url"]).values()))
        kube_sync(world, url, policy_file)
        trace(world, url, node, "dcgm_diag_r4 ERR: stays tainted")
        assert any(t["key"] == TAINT_KEY for t in world["cluster"].node(node)["spec"]["taints"])
        assert "memtest (GPU 5)" in phase(url, node)["failed"][0]["summary"]

        world["faults"].write_text("{}\n")  # the GPU is replaced
        assert cycle() == []  # a failed check reruns only after retry_after
        assert cycle(retry_after=0) == [Unit("dcgm_diag_r4", (node,), validation=True)]
        play_kubelet(world["cluster"], node)
        wait_until(lambda: phase(url, node)["phase"] == "resumed", timeout=30, what="the passing diagnostic")
        runner.label_results(list(results(world["url"]).values()))
        wait_until(lambda: not drain_listed(url, node), timeout=30, what="the drain released")
        kube_sync(world, url, policy_file)
        trace(world, url, node, "dcgm_diag_r4 PASS: untainted")
        item = world["cluster"].node(node)
        assert not [t for t in item["spec"].get("taints") or [] if t["key"] == TAINT_KEY]
        assert not item["spec"].get("unschedulable")
        assert item["metadata"]["labels"]["fleetsight.io/check-dcgm-diag-r4"] == "PASS"
    print("\n".join(["", "drain -> validate -> resume on Kubernetes:", *TRACE]))
    json.dumps(TRACE)


# ------------------------------------------------------------------------------------------ pair check
def check_jobs(cluster: Cluster, check: str) -> list[dict[str, Any]]:
    jobs = cluster.get(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs?labelSelector={CHECK_LABEL}%3D{check}")
    return jobs["items"]


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def play_pair(cluster: Cluster, pair: tuple[str, str]) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run the pair's two Jobs as their containers would, at once: the server Job's command in the
    background, the client Job's (which posts both nodes' results) until it ends. Returns the client's
    run and the server's output."""
    containers = {
        job["spec"]["template"]["spec"]["nodeName"]: job["spec"]["template"]["spec"]["containers"][0]
        for job in sorted(check_jobs(cluster, "ib_pair_bandwidth"), key=lambda j: j["metadata"]["name"])
        if job["spec"]["template"]["spec"]["nodeName"] in pair
    }  # the newest Job of each node last: it wins
    mine = {node: container["command"] for node, container in containers.items()}
    client, server = pair
    assert flag(mine[server], "--here") == server and flag(mine[client], "--here") == client
    served = subprocess.Popen(mine[server], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=container_env(cluster, containers[server]))  # fmt: skip
    try:
        ran = subprocess.run(mine[client], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                             env=container_env(cluster, containers[client]))  # fmt: skip
        return ran, served.communicate(timeout=60)[0]
    finally:
        served.kill()


def test_a_pair_check_is_two_pinned_jobs_on_idle_nodes_holding_both_leaves_read_per_port(
    world: dict[str, Any],
) -> None:
    """ib_pair_bandwidth on kwok: the pair's two Jobs start together, one pinned to each node (nodeName,
    host network, FleetSight's taint tolerated, every GPU asked for), the client told the server node's
    InternalIP; a pair with a busy node waits; while the pair runs nothing else starts on either of its
    leaves; both nodes' results carry the result per port (port 3 down on one end fails mlx5_3 on
    both), and become node labels. Then a drained node's validation gets a partner on its own leaf."""
    cluster: Cluster = world["cluster"]
    runner: KubeChecks = world["runner"]
    world["faults"].write_text(yaml.safe_dump({"kc3": [{"kind": "ib_port_down", "port": 3}]}))
    train_on_kc1_and_drain_kc3(cluster, runner, "training-1")
    pair, busy = Unit("ib_pair_bandwidth", ("kc2", "kc3")), Unit("ib_pair_bandwidth", ("kc1", "kc4"))
    single = Unit("dcgm_diag_r2", ("kc4",))
    decision = runner.cycle([single, busy, pair], NODES, results(world["url"]))
    assert decision.start == [pair]
    assert decision.waiting == {busy: "not idle: kc1", single: "leaf busy: leaf-b"}  # kc3's leaf is held

    jobs = {j["spec"]["template"]["spec"]["nodeName"]: j for j in check_jobs(cluster, "ib_pair_bandwidth")}
    assert sorted(jobs) == ["kc2", "kc3"], "one Job pinned to each node of the pair"
    for node, job in jobs.items():
        spec = job["spec"]["template"]["spec"]
        assert spec["hostNetwork"] is True and spec["restartPolicy"] == "Never"
        assert {"key": TAINT_KEY, "operator": "Exists"} in spec["tolerations"]  # kc3 is drained and cordoned
        assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert job["spec"]["backoffLimit"] == 0
        command = spec["containers"][0]["command"]
        assert command[len(FLEETSIGHT) : len(FLEETSIGHT) + 2] == ["checks", "pair"]
        assert (flag(command, "--client"), flag(command, "--server"), flag(command, "--here")) == (
            "kc2",
            "kc3",
            node,
        )
        assert flag(command, "--server-address") == ADDRESSES["kc3"]  # the server node's InternalIP
    # while the pair runs: not twice, and nothing intrusive on either of its leaves
    again = runner.cycle([pair, Unit("dcgm_diag_r2", ("kc4",)), Unit("dcgm_diag_r2", ("kc2",))], NODES,
                         results(world["url"]))  # fmt: skip
    assert again.start == []
    assert again.waiting[pair] == "already under test: kc2, kc3"
    assert again.waiting[Unit("dcgm_diag_r2", ("kc4",))] == "leaf busy: leaf-b"
    assert again.waiting[Unit("dcgm_diag_r2", ("kc2",))] == "already under test: kc2"

    client, served = play_pair(cluster, ("kc2", "kc3"))
    assert client.returncode == 1, client.stdout + client.stderr  # a failed check, posted
    assert served.count("RDMA_Write BW Test") == 7 and "Unable to Connect the HCA's" in served
    now = results(world["url"])
    for node, partner, role in (("kc2", "kc3", "client"), ("kc3", "kc2", "server")):
        result = now[(node, "ib_pair_bandwidth")]
        assert (
            not result["passed"] and result["summary"] == "slow or unreadable towards " + partner + ": mlx5_3"
        )
        evidence = result["evidence"]
        assert (evidence["partner"], evidence["role"]) == (partner, role)
        ports = evidence["ports"]
        assert sorted(ports) == [f"mlx5_{i}" for i in range(8)]
        assert [d for d, p in ports.items() if not p["passed"]] == ["mlx5_3"]
        assert all(p["gbits"] >= 350 for d, p in ports.items() if d != "mlx5_3"), ports
    labels = runner.label_results([now[("kc2", "ib_pair_bandwidth")], now[("kc3", "ib_pair_bandwidth")]])
    assert labels == {n: {"fleetsight.io/check-ib-pair-bandwidth": "ERR"} for n in ("kc2", "kc3")}
    assert cluster.node("kc3")["metadata"]["labels"]["fleetsight.io/check-ib-pair-bandwidth"] == "ERR"
    after = runner.cycle([single], NODES, results(world["url"]))  # the pair is done: leaf-b is free again
    assert after.start == [single]
    play_kubelet(cluster, "kc4")

    # the port is repaired; kc3's validation asks for the pair check alone: kc4 (its own leaf) partners it
    world["faults"].write_text("{}\n")
    validation = Unit("ib_pair_bandwidth", ("kc3",), validation=True)
    decision = runner.cycle([validation], NODES, results(world["url"]))
    assert decision.start == [Unit("ib_pair_bandwidth", ("kc3", "kc4"), validation=True)]
    newest = {}
    for job in sorted(check_jobs(cluster, "ib_pair_bandwidth"), key=lambda j: j["metadata"]["name"]):
        newest[job["spec"]["template"]["spec"]["nodeName"]] = job["spec"]["template"]["spec"]
    assert flag(newest["kc4"]["containers"][0]["command"], "--server-address") == ADDRESSES["kc4"]
    client, _ = play_pair(cluster, ("kc3", "kc4"))
    assert client.returncode == 0, client.stdout + client.stderr
    now = results(world["url"])
    assert now[("kc3", "ib_pair_bandwidth")]["summary"] == "8 ports at line rate towards kc4"
    assert now[("kc4", "ib_pair_bandwidth")]["passed"]
    cluster.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/training-1")
    cluster.patch("/api/v1/nodes/kc3", {"spec": {"unschedulable": None, "taints": None}})
