"""`helm install` on a real API server: the release deploys, the node agent's DaemonSet places its pods
on the simulated GPU nodes only (DaemonSet controller and scheduler, kwok's kubelets run them), and the
health service's ServiceAccount may read and patch nodes and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest
from kube import CPU_NODES, GPU_NODES, NAMESPACE, RELEASE, Cluster, helm

from health.kubernetes import KubernetesError, from_kubeconfig
from support import wait_until

AGENT = f"{RELEASE}-fleetsight-node-agent"
HEALTH = f"{RELEASE}-fleetsight-health"


def test_helm_install_deploys_the_release(release: Cluster) -> None:
    status = helm("status", RELEASE, "--namespace", NAMESPACE, "-o", "json", cluster=release)
    assert '"status":"deployed"' in status.stdout.replace(" ", "")
    apps = f"/apis/apps/v1/namespaces/{NAMESPACE}"
    deployments = {d["metadata"]["name"] for d in release.get(f"{apps}/deployments")["items"]}
    assert deployments == {f"{RELEASE}-fleetsight-{c}" for c in ("anomaly", "health", "chatbot")}
    assert release.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{HEALTH}")["rules"][1] == {
        "apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]
    }  # fmt: skip


def test_the_node_agent_runs_on_every_gpu_node_and_nowhere_else(release: Cluster) -> None:
    path = f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{AGENT}"
    wait_until(
        lambda: (
            (s := release.get(path).get("status", {})).get("desiredNumberScheduled") == len(GPU_NODES)
            and s.get("numberReady") == len(GPU_NODES)
        ),
        timeout=60,
        what="the node agent ready on both GPU nodes",
    )
    pods = release.get(
        f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=app.kubernetes.io/component%3Dnode-agent"
    )["items"]
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(GPU_NODES)
    assert not {p["spec"]["nodeName"] for p in pods} & set(CPU_NODES)
    assert all(p["status"]["phase"] == "Running" for p in pods)


def test_the_health_service_account_may_patch_nodes_and_nothing_else(
    release: Cluster, tmp_path: Path
) -> None:
    api = from_kubeconfig(
        release.service_account_kubeconfig(NAMESPACE, HEALTH, tmp_path / "health.kubeconfig")
    )
    try:
        assert {n["metadata"]["name"] for n in api.nodes()} >= set(GPU_NODES)
        api.request(
            "PATCH",
            f"/api/v1/nodes/{GPU_NODES[0]}?dryRun=All",
            json={"metadata": {"labels": {"fleetsight.io/health": "healthy"}}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        for method, path in [
            ("GET", f"/api/v1/namespaces/{NAMESPACE}/pods"),
            ("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets"),
            ("DELETE", f"/api/v1/nodes/{GPU_NODES[0]}?dryRun=All"),
            ("POST", "/api/v1/nodes?dryRun=All"),
        ]:
            with pytest.raises(KubernetesError) as refused:
                api.request(method, path, json={} if method == "POST" else None)
            assert getattr(refused.value, "status", 0) == 403, (method, path, str(refused.value))
    finally:
        api.close()
