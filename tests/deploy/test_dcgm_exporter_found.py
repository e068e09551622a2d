"""`dcgmExporter.enabled: auto` (the default) on the real API server: the chart looks for a dcgm-exporter
already running (helm's `lookup` at install) and uses it instead of deploying a second one; with none it
deploys its own. The "already running" one is the GPU operator's DaemonSet as the operator writes it
(NVIDIA/gpu-operator assets/state-dcgm-exporter/0900_daemonset.yaml: name and label
nvidia-dcgm-exporter, container port "metrics" 9400), placed on no node here (its nodeSelector matches
none), since only its object matters to the chart."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kube import CHART, Cluster, helm

OPERATOR_NS = "gpu-operator"
OPERATOR_DS = {
    "metadata": {"name": "nvidia-dcgm-exporter", "labels": {"app": "nvidia-dcgm-exporter"}},
    "spec": {
        "selector": {"matchLabels": {"app": "nvidia-dcgm-exporter"}},
        "template": {
            "metadata": {"labels": {"app": "nvidia-dcgm-exporter"}},
            "spec": {
                "nodeSelector": {"nvidia.com/gpu.deploy.dcgm-exporter": "true"},
                "containers": [
                    {
                        "name": "nvidia-dcgm-exporter",
                        "image": "nvcr.io/nvidia/k8s/dcgm-exporter:4.4.2-4.7.0-ubuntu22.04",
                        "env": [{"name": "DCGM_EXPORTER_KUBERNETES", "value": "true"}],
                        "ports": [{"name": "metrics", "containerPort": 9400}],
                    }
                ],
            },
        },
    },
}


def render_on(cluster: Cluster, *values: str) -> list[dict[str, Any]]:
    """What `helm install` would apply, rendered against the live API server (lookup answers)."""
    result = helm(
        "template", "probe", str(CHART), "--namespace", "probe", "--dry-run=server",
        "--set", "monitoring.operator.enabled=true", *values, cluster=cluster,
    )  # fmt: skip
    return [o for o in yaml.safe_load_all(result.stdout) if o]


def named(objects: list[dict[str, Any]], kind: str) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objects if o["kind"] == kind)


@pytest.fixture
def operator_exporter(release: Cluster) -> Iterator[None]:
    """The GPU operator's dcgm-exporter DaemonSet, removed afterwards (the shared release's later
    upgrades must find the cluster as it was)."""
    release.create("/api/v1/namespaces", {"metadata": {"name": OPERATOR_NS}})
    path = f"/apis/apps/v1/namespaces/{OPERATOR_NS}/daemonsets"
    release.create(path, OPERATOR_DS)
    try:
        yield
    finally:
        release.api("DELETE", f"{path}/nvidia-dcgm-exporter")
        release.api("DELETE", f"/api/v1/namespaces/{OPERATOR_NS}")


def test_with_no_exporter_running_the_chart_deploys_its_own(release: Cluster) -> None:
    objects = render_on(release)
    assert "probe-fleetsight-dcgm-exporter" in named(objects, "DaemonSet")
    assert [m for m in named(objects, "PodMonitor") if "dcgm" in m] == ["probe-fleetsight-dcgm-exporter"]


def test_the_gpu_operators_exporter_is_found_and_scraped_not_doubled(
    release: Cluster, operator_exporter: None
) -> None:
    objects = render_on(release)
    assert "probe-fleetsight-dcgm-exporter" not in named(objects, "DaemonSet")
    [monitor] = [o for o in objects if o["kind"] == "PodMonitor" and "dcgm" in o["metadata"]["name"]]
    assert monitor["metadata"]["name"] == "probe-fleetsight-dcgm-exporter-found"
    assert (
        monitor["metadata"]["annotations"]["fleetsight.io/dcgm-exporter"]
        == "gpu-operator/nvidia-dcgm-exporter"
    )
    spec = monitor["spec"]
    assert spec["namespaceSelector"] == {"matchNames": [OPERATOR_NS]}
    assert spec["selector"] == {"matchLabels": {"app": "nvidia-dcgm-exporter"}}
    [endpoint] = spec["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics"
    relabel = {r["targetLabel"]: r for r in endpoint["relabelings"]}
    assert relabel["node"]["sourceLabels"] == ["__meta_kubernetes_pod_node_name"]
    assert relabel["job"]["replacement"] == "dcgm"
    # its series carry pod and namespace only: the anomaly service names their jobs from the owners
    anomaly = next(
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("anomaly")
    )
    assert "--pod-owners" in anomaly["spec"]["template"]["spec"]["containers"][0]["args"]
    # an explicit true still deploys the chart's own beside it (the operator told not to run one)
    forced = render_on(release, "--set", "dcgmExporter.enabled=true")
    assert "probe-fleetsight-dcgm-exporter" in named(forced, "DaemonSet")
