"""`helm install` on a real API server: the release deploys, the node agent's DaemonSet places its pods
on the simulated GPU nodes only (DaemonSet controller and scheduler, kwok's kubelets run them), and the
health service's ServiceAccount may read and patch nodes and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest
from kube import CHART, CPU_NODES, GPU_NODES, NAMESPACE, RELEASE, Cluster, helm

from deploy.tools import OPERATOR_CRDS_STEP
from fleetsight.settings import Settings
from health.kubernetes import KubernetesError, from_kubeconfig
from support import REPO_ROOT, wait_until

FULL = Path(__file__).with_name("full-values.yaml")
AGENT = f"{RELEASE}-fleetsight-node-agent"
HEALTH = f"{RELEASE}-fleetsight-health"


def test_helm_install_deploys_the_release(release: Cluster) -> None:
    status = helm("status", RELEASE, "--namespace", NAMESPACE, "-o", "json", cluster=release)
    assert '"status":"deployed"' in status.stdout.replace(" ", "")
    apps = f"/apis/apps/v1/namespaces/{NAMESPACE}"
    deployments = {d["metadata"]["name"] for d in release.get(f"{apps}/deployments")["items"]}
    assert deployments == {f"{RELEASE}-fleetsight-{c}" for c in ("anomaly", "health", "chatbot", "checks")}
    assert release.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{HEALTH}")["rules"][1] == {
        "apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]
    }  # fmt: skip


def test_the_node_agent_runs_on_every_gpu_node_and_nowhere_else(release: Cluster) -> None:
    path = f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{AGENT}"

    last: dict[str, object] = {}

    def placed() -> bool:
        last.update(release.get(path).get("status", {}))
        return last.get("desiredNumberScheduled") == len(GPU_NODES) and last.get("numberReady") == len(
            GPU_NODES
        )

    try:
        wait_until(placed, timeout=60, what="the node agent ready on both GPU nodes")
    except pytest.fail.Exception as timed_out:
        nodes = {n: release.node(n)["status"].get("conditions") for n in GPU_NODES}
        pytest.fail(f"{timed_out}; DaemonSet status {last}; GPU nodes' conditions {nodes}")
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


def test_every_part_installs_with_the_operators_crds(release: Cluster) -> None:
    """Every part on, operator objects included: the API server validates each object, the
    ServiceMonitors, PodMonitors and PrometheusRules against prometheus-operator's CRD schemas."""
    settings = Settings()
    if not OPERATOR_CRDS_STEP.present(settings):
        pytest.fail(
            "prometheus-operator's CRDs are missing: run `fleetsight setup` (step prometheus-operator-crds)"
        )
    release.install_crds(OPERATOR_CRDS_STEP.files(settings))
    helm("install", "full", str(CHART), "--namespace", "full", "--create-namespace",
         "-f", str(FULL), cluster=release)  # fmt: skip
    group = "/apis/monitoring.coreos.com/v1/namespaces/full"
    rules = release.get(f"{group}/prometheusrules")["items"]
    assert len(rules) == len(list((REPO_ROOT / "rules").glob("*.yml")))
    assert sorted(m["metadata"]["name"] for m in release.get(f"{group}/podmonitors")["items"]) == [
        "full-fleetsight-dcgm-exporter", "full-fleetsight-node-agent"
    ]  # fmt: skip
    assert sorted(m["metadata"]["name"] for m in release.get(f"{group}/servicemonitors")["items"]) == [
        f"full-fleetsight-{c}" for c in ("anomaly", "chatbot", "checks", "fabric-exporter", "fleet", "health")
    ]
    path = "/apis/apps/v1/namespaces/full/daemonsets/full-fleetsight-dcgm-exporter"
    wait_until(
        lambda: release.get(path).get("status", {}).get("desiredNumberScheduled") == len(GPU_NODES),
        timeout=30,
        what="dcgm-exporter scheduled on the GPU nodes",
    )


def test_upgrade_and_uninstall(release: Cluster) -> None:
    """The docs' upgrade and uninstall commands, on the full release installed above."""
    upgrade = ["upgrade", "full", str(CHART), "--namespace", "full", "--reuse-values"]
    helm(*upgrade, "--set", "anomaly.replicas=2", cluster=release)
    deployment = release.get("/apis/apps/v1/namespaces/full/deployments/full-fleetsight-anomaly")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    helm("uninstall", "full", "--namespace", "full", cluster=release)
    role = release.api("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles/full-fleetsight-health")
    assert role.status_code == 404
    assert release.get("/apis/monitoring.coreos.com/v1/namespaces/full/prometheusrules")["items"] == []
    # the health state's claim outlives the release (helm.sh/resource-policy: keep)
    assert release.get("/api/v1/namespaces/full/persistentvolumeclaims/full-fleetsight-health")
