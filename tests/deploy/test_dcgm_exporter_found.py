"""`dcgmExporter.enabled: auto` (the default) on the real API server: the chart looks for a dcgm-exporter
already running (helm's `lookup` at install) and uses it instead of deploying a second one; with none it
deploys its own. The "already running" one is the GPU operator's DaemonSet as the operator writes it
(NVIDIA/gpu-operator assets/state-dcgm-exporter/0900_daemonset.yaml: name and label
nvidia-dcgm-exporter, container port "metrics" 9400), placed on no node here (its nodeSelector matches
none), since only its object matters to the chart."""

from __future__ import annotations

import time
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
    upgrades must find no exporter). Its namespace stays: deleting one is asynchronous, and the next
    test would find it terminating."""
    namespace = release.api("GET", f"/api/v1/namespaces/{OPERATOR_NS}")
    if namespace.status_code == 404:
        release.create("/api/v1/namespaces", {"metadata": {"name": OPERATOR_NS}})
    path = f"/apis/apps/v1/namespaces/{OPERATOR_NS}/daemonsets"
    release.create(path, OPERATOR_DS)
    try:
        yield
    finally:
        release.api("DELETE", f"{path}/nvidia-dcgm-exporter")
        deadline = time.monotonic() + 30
        while release.api("GET", f"{path}/nvidia-dcgm-exporter").status_code != 404:
            assert time.monotonic() < deadline, "the DaemonSet was not deleted within 30 s"
            time.sleep(0.2)


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
    args = anomaly["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--pod-owners" in args
    # the operator's exporter as shipped collects every 30 s: the detector is told so (no fast path)
    assert "--dcgm-interval=30000ms" in args
    # an explicit true still deploys the chart's own beside it (the operator told not to run one)
    forced = render_on(release, "--set", "dcgmExporter.enabled=true")
    assert "probe-fleetsight-dcgm-exporter" in named(forced, "DaemonSet")


def exporter_with(release: Cluster, container: dict[str, Any]) -> None:
    """Replace the operator's DaemonSet container (env and args as a site may have set them)."""
    path = f"/apis/apps/v1/namespaces/{OPERATOR_NS}/daemonsets/nvidia-dcgm-exporter"
    body = yaml.safe_load(yaml.safe_dump(OPERATOR_DS))
    body["spec"]["template"]["spec"]["containers"][0].update(container)
    body["metadata"]["resourceVersion"] = release.get(path)["metadata"]["resourceVersion"]
    response = release.api("PUT", path, json=body)
    assert response.status_code == 200, f"PUT {path}: {response.status_code} {response.text[:500]}"


def found_interval(release: Cluster) -> str:
    objects = render_on(release)
    [monitor] = [o for o in objects if o["kind"] == "PodMonitor" and o["metadata"]["name"].endswith("-found")]
    return monitor["metadata"]["annotations"]["fleetsight.io/dcgm-collect-interval-ms"]


def test_the_found_exporters_collection_interval_is_read_and_a_slow_one_is_named(
    release: Cluster, operator_exporter: None
) -> None:
    # The operator's DaemonSet as shipped sets no interval: dcgm-exporter's own default, 30 s.
    assert found_interval(release) == "30000"
    # NOTES come from `helm install`, which checks every kind against the API server: without the
    # Prometheus operator's CRDs here, only with monitoring.operator off (the lookup is the same)
    notes = helm(
        "install", "probe", str(CHART), "--namespace", "probe", "--dry-run=server",
        "--set", "monitoring.operator.enabled=false", cluster=release,
    ).stdout  # fmt: skip
    assert "It collects every 30000 ms" in notes and "DCGM_EXPORTER_INTERVAL" in notes, notes
    env = [
        {"name": "DCGM_EXPORTER_KUBERNETES", "value": "true"},
        {"name": "DCGM_EXPORTER_INTERVAL", "value": "5000"},
    ]
    exporter_with(release, {"env": env})
    assert found_interval(release) == "5000"
    anomaly = next(
        o
        for o in render_on(release)
        if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("anomaly")
    )
    assert "--dcgm-interval=5000ms" in anomaly["spec"]["template"]["spec"]["containers"][0]["args"]
    exporter_with(
        release, {"args": ["-f", "/etc/dcgm-exporter/dcp-metrics-included.csv", "--collect-interval=1000"]}
    )
    assert found_interval(release) == "1000"
    exporter_with(release, {"args": ["-c", "2000"]})
    assert found_interval(release) == "2000"
    notes = helm(
        "install", "probe", str(CHART), "--namespace", "probe", "--dry-run=server",
        "--set", "monitoring.operator.enabled=false", cluster=release,
    ).stdout  # fmt: skip
    assert "using the one already running" in notes and "It collects every" not in notes, notes
