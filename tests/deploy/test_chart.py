"""The Helm chart offline: it lints (strict) and renders for its defaults and for every part switched on;
every rendered built-in object validates against Kubernetes 1.31's schemas (kubernetes-validate); the
PrometheusRules are rules/*.yml as they are (promtool checks them) and the dashboards dashboards/*.json;
the schema rejects bad values with a message that names the value; RBAC is least privilege."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kube import CHART, helm

from support import REPO_ROOT

FULL = Path(__file__).with_name("full-values.yaml")
KUBE_VERSION = "1.31.0"
OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def render(*args: str) -> list[dict[str, Any]]:
    out = helm(
        "template", "fs", str(CHART), "--namespace", "fleetsight", "--kube-version", KUBE_VERSION, *args
    )
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@pytest.fixture(scope="module")
def default() -> list[dict[str, Any]]:
    return render()


@pytest.fixture(scope="module")
def full() -> list[dict[str, Any]]:
    return render("-f", str(FULL))


def kinds(objects: list[dict[str, Any]]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for obj in objects:
        found.setdefault(obj["kind"], []).append(obj["metadata"]["name"])
    return found


@pytest.mark.parametrize("values", [[], ["-f", str(FULL)]], ids=["default", "full"])
def test_the_chart_lints_strictly(values: list[str]) -> None:
    result = helm("lint", "--strict", str(CHART), *values)
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_defaults_render_the_services_without_the_operator(default: list[dict[str, Any]]) -> None:
    found = kinds(default)
    assert found["DaemonSet"] == ["fs-fleetsight-node-agent"]
    assert sorted(found["Deployment"]) == [
        "fs-fleetsight-anomaly",
        "fs-fleetsight-chatbot",
        "fs-fleetsight-health",
    ]
    assert not OPERATOR_KINDS & set(found)
    pods = [o for o in default if o["kind"] in ("DaemonSet", "Deployment")]
    for workload in pods:
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true", workload["metadata"]["name"]


def test_full_values_render_every_part(full: list[dict[str, Any]]) -> None:
    found = kinds(full)
    assert sorted(found["DaemonSet"]) == ["fs-fleetsight-dcgm-exporter", "fs-fleetsight-node-agent"]
    assert "fs-fleetsight-fabric-exporter" in found["Deployment"]
    assert len(found["PrometheusRule"]) == len(list((REPO_ROOT / "rules").glob("*.yml")))
    monitored = ("anomaly", "chatbot", "fabric-exporter", "health")
    assert sorted(found["ServiceMonitor"]) == [f"fs-fleetsight-{m}" for m in monitored]
    assert found["PersistentVolumeClaim"] == ["fs-fleetsight-health"]
    for monitor in (o for o in full if o["kind"] in OPERATOR_KINDS):
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


@pytest.mark.parametrize("which", ["default", "full"])
def test_every_rendered_object_validates(which: str, request: pytest.FixtureRequest) -> None:
    objects = request.getfixturevalue(which)
    checked = 0
    for obj in objects:
        if obj["kind"] in OPERATOR_KINDS:
            continue  # CRDs: checked below (rules by promtool, monitors by structure)
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        checked += 1
    assert checked >= 20


def test_prometheus_rules_are_the_repository_rules(full: list[dict[str, Any]], tmp_path: Path) -> None:
    """Read through the chart's files/rules link: never a stale copy. promtool checks what the chart made."""
    rules = {
        o["metadata"]["name"].removeprefix("fs-fleetsight-"): o["spec"]
        for o in full
        if o["kind"] == "PrometheusRule"
    }
    for path in sorted((REPO_ROOT / "rules").glob("*.yml")):
        assert rules[path.stem] == yaml.safe_load(path.read_text()), path.name
        (tmp_path / path.name).write_text(yaml.safe_dump(rules[path.stem]))
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: run `fleetsight setup`"
    result = subprocess.run(
        [promtool, "check", "rules", *sorted(map(str, tmp_path.glob("*.yml")))],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboards_are_configmaps_for_the_grafana_sidecar(default: list[dict[str, Any]]) -> None:
    maps = {
        o["metadata"]["name"]: o
        for o in default
        if o["kind"] == "ConfigMap" and "-dashboard-" in o["metadata"]["name"]
    }
    files = sorted((REPO_ROOT / "dashboards").glob("*.json"))
    assert len(maps) == len(files)
    for path in files:
        config_map = maps[f"fs-fleetsight-dashboard-{path.stem}"]
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert json.loads(config_map["data"][path.name]) == json.loads(path.read_text())


def test_the_packaged_chart_holds_rules_and_dashboards_but_no_code(tmp_path: Path) -> None:
    helm("package", str(CHART), "--destination", str(tmp_path))
    with tarfile.open(next(tmp_path.glob("fleetsight-*.tgz"))) as archive:
        names = archive.getnames()
    assert "fleetsight/files/rules/gpu.yml" in names and "fleetsight/files/dashboards/node.json" in names
    assert not [n for n in names if n.endswith(".py") or "/tests/" in n], names


def test_the_node_agent_reads_the_host_read_only_on_gpu_nodes(full: list[dict[str, Any]]) -> None:
    agent = next(o for o in full if o["kind"] == "DaemonSet" and o["metadata"]["name"].endswith("node-agent"))
    pod = agent["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert {"key": "fleetsight.io/unhealthy", "operator": "Exists"} in pod["tolerations"]
    container = pod["containers"][0]
    mounts = {m["name"]: m for m in container["volumeMounts"] if m["name"] != "tmp"}
    assert sorted(mounts) == ["log", "metrics-auth", "proc", "sys"]
    assert all(m["readOnly"] for m in mounts.values())
    host_paths = sorted(v["name"] for v in pod["volumes"] if "hostPath" in v)
    assert host_paths == ["log", "proc", "sys"], "the host is reached through these three mounts only"
    assert container["resources"]["requests"] == {"cpu": "10m", "memory": "64Mi"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["automountServiceAccountToken"] is False
    assert "--node=$(NODE_NAME)" in container["args"]


def test_secrets_are_only_referenced(full: list[dict[str, Any]]) -> None:
    assert "Secret" not in kinds(full)
    health = next(o for o in full if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-health"))
    volumes = {v["name"]: v for v in health["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tokens"]["secret"]["secretName"] == "fleetsight-health-tokens"


def test_only_the_health_service_gets_api_rights(full: list[dict[str, Any]]) -> None:
    roles = [o for o in full if o["kind"] in ("Role", "ClusterRole")]
    assert [r["metadata"]["name"] for r in roles] == ["fs-fleetsight-health"]
    assert roles[0]["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
    ]
    binding = next(o for o in full if o["kind"] == "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "fs-fleetsight-health", "namespace": "fleetsight"}
    ]
    accounts = {
        o["metadata"]["name"]: o["automountServiceAccountToken"]
        for o in full
        if o["kind"] == "ServiceAccount"
    }
    assert [name for name, mounted in accounts.items() if mounted] == ["fs-fleetsight-health"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "nodeAgent.port=99999"], "nodeAgent.port"),
        (["--set", "health.kubernetesSync.interval=0"], "health.kubernetesSync.interval"),
        (["--set", "fabricExporter.enabled=true"], "ufmUrl"),
        (["--set", "nodeAgnet.enabled=false"], "nodeAgnet"),
        (["--set", "nodeAgent.resources.requests.memory=lots"], "nodeAgent.resources.requests.memory"),
        (["--set", "image.pullPolicy=Sometimes"], "image.pullPolicy"),
    ],
    ids=["port", "interval", "fabric-without-ufm", "typo", "quantity", "pull-policy"],
)
def test_the_schema_rejects_bad_values_naming_them(args: list[str], message: str) -> None:
    result = helm("template", "fs", str(CHART), "--kube-version", KUBE_VERSION, *args, check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr, result.stderr
