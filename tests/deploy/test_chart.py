"""The Helm chart offline: it lints (strict) and renders for its defaults and for every part switched on;
every rendered built-in object validates against Kubernetes 1.31's schemas (kubernetes-validate); the
PrometheusRules are rules/*.yml as they are (promtool checks them) and the dashboards dashboards/*.json;
the schema rejects bad values with a message that names the value; RBAC is least privilege."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml
from kube import CHART, helm

from anomaly.jobs import DEFAULT_POD_LABEL_KEYS
from checks import runner
from support import REPO_ROOT, Process, free_port

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


@pytest.fixture(scope="module")
def with_dcgm() -> list[dict[str, Any]]:
    """The defaults with the chart's own dcgm-exporter (TLS and basic auth on, as by default)."""
    return render("--set", "dcgmExporter.enabled=true")


def test_defaults_render_the_services_without_the_operator(default: list[dict[str, Any]]) -> None:
    found = kinds(default)
    # dcgmExporter.enabled "auto" with no cluster to look in (helm template): the chart's own exporter,
    # and the light checks that read it
    assert sorted(found["DaemonSet"]) == [
        "fs-fleetsight-checks-light",
        "fs-fleetsight-dcgm-exporter",
        "fs-fleetsight-node-agent",
    ]
    assert sorted(found["Deployment"]) == [
        "fs-fleetsight-anomaly",
        "fs-fleetsight-chatbot",
        "fs-fleetsight-checks",
        "fs-fleetsight-health",
    ]
    assert found["CronJob"] == ["fs-fleetsight-checks-scheduler"]
    assert not OPERATOR_KINDS & set(found)
    pods = [o for o in default if o["kind"] in ("DaemonSet", "Deployment")]
    for workload in [p for p in pods if p["metadata"]["name"] != "fs-fleetsight-checks-light"]:
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true", workload["metadata"]["name"]


def test_full_values_render_every_part(full: list[dict[str, Any]]) -> None:
    found = kinds(full)
    assert sorted(found["DaemonSet"]) == [
        "fs-fleetsight-checks-light",
        "fs-fleetsight-dcgm-exporter",
        "fs-fleetsight-node-agent",
    ]
    assert "fs-fleetsight-fabric-exporter" in found["Deployment"]
    assert len(found["PrometheusRule"]) == len(list((REPO_ROOT / "rules").glob("*.yml")))
    monitored = ("anomaly", "chatbot", "checks", "fabric-exporter", "fleet", "health")
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
        assert config_map["metadata"]["annotations"]["grafana_folder"] == "FleetSight"
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
    assert volumes["events-token"]["secret"]["secretName"] == "fleetsight-health-events"
    checks = next(o for o in full if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-checks"))
    volumes = {v["name"]: v for v in checks["spec"]["template"]["spec"]["volumes"]}
    assert volumes["results-token"]["secret"]["secretName"] == "fleetsight-checks-results"
    cron = workload(full, "CronJob", "fs-fleetsight-checks-scheduler")
    args = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--token-secret=fleetsight-checks-results" in args


def test_the_results_token_is_one_secret_for_the_checks_service_and_its_posters(
    with_dcgm: list[dict[str, Any]],
) -> None:
    """Issue 36: a posted PASS resumes a drained node, so the service asks a token of every post; the
    chart makes it once, the service checks it, the light-check DaemonSet and the check Jobs send it."""
    (secret,) = [
        o for o in with_dcgm if o["kind"] == "Secret" and o["metadata"]["name"].endswith("-checks-results")
    ]
    assert secret["metadata"]["name"] == "fs-fleetsight-checks-results"
    assert len(secret["data"]["token"]) >= 48
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    service = workload(with_dcgm, "Deployment", "fs-fleetsight-checks")["spec"]["template"]["spec"]
    light = workload(with_dcgm, "DaemonSet", "fs-fleetsight-checks-light")["spec"]["template"]["spec"]
    cycle = workload(with_dcgm, "CronJob", "fs-fleetsight-checks-scheduler")["spec"]["jobTemplate"]["spec"]
    cycle = cycle["template"]["spec"]  # the pass posts its scan report (/v1/scans) itself
    for pod in (service, light, cycle):
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["results-token"]["secret"]["secretName"] == "fs-fleetsight-checks-results"
        mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
        assert mounts["results-token"] == {
            "name": "results-token",
            "mountPath": "/etc/fleetsight/results",
            "readOnly": True,
        }
    assert "--results-token-file=/etc/fleetsight/results/token" in service["containers"][0]["args"]
    for pod in (light, cycle):
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["FLEETSIGHT_CHECKS_TOKEN_FILE"] == "/etc/fleetsight/results/token"
    cron = workload(with_dcgm, "CronJob", "fs-fleetsight-checks-scheduler")
    args = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--token-secret=fs-fleetsight-checks-results" in args  # the Jobs' FLEETSIGHT_CHECKS_TOKEN


def test_the_events_token_is_one_secret_mounted_by_health_and_anomaly(default: list[dict[str, Any]]) -> None:
    # the chart makes the Secret when none is named; health checks it, anomaly sends it
    secrets = [o for o in default if o["kind"] == "Secret"]
    (secret,) = [o for o in secrets if o["metadata"]["name"].endswith("-health-events")]
    assert len(secret["data"]["token"]) >= 48
    deployments = [o for o in default if o["kind"] == "Deployment"]
    pods = {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in deployments}
    for name in ("fs-fleetsight-health", "fs-fleetsight-anomaly"):
        volumes = {v["name"]: v for v in pods[name]["volumes"]}
        assert volumes["events-token"]["secret"]["secretName"] == secret["metadata"]["name"], name
    (health,) = [c for c in pods["fs-fleetsight-health"]["containers"] if c["name"] == "health"]
    assert "--events-token-file=/etc/fleetsight/events/token" in health["args"]
    (anomaly,) = pods["fs-fleetsight-anomaly"]["containers"]
    env = {e["name"]: e["value"] for e in anomaly["env"]}
    assert env == {
        "FLEETSIGHT_ANOMALY_HEALTH_URL": "http://fs-fleetsight-health:9441",
        "FLEETSIGHT_ANOMALY_HEALTH_TOKEN_FILE": "/etc/fleetsight/events/token",
    }


def test_two_health_replicas_elect_one_writer_on_a_lease(default: list[dict[str, Any]]) -> None:
    health = "fs-fleetsight-health"
    (deployment,) = [o for o in default if o["kind"] == "Deployment" and o["metadata"]["name"] == health]
    assert deployment["spec"]["replicas"] == 2
    # one pod at a time: the survivor holds the state while the other is replaced
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    (container,) = [c for c in pod["containers"] if c["name"] == "health"]
    assert "--leader-election-namespace=fleetsight" in container["args"]
    assert f"--leader-election-name={health}" in container["args"]
    env = {e["name"]: e.get("valueFrom") for e in container["env"]}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    (role,) = [o for o in default if o["kind"] == "Role" and o["metadata"]["name"] == f"{health}-leader"]
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [health],
            "verbs": ["get", "update"],
        },
    ]
    bindings = [o for o in default if o["kind"] == "RoleBinding"]
    (binding,) = [o for o in bindings if o["roleRef"]["name"] == role["metadata"]["name"]]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": health, "namespace": "fleetsight"}]


def test_persistence_is_for_one_health_replica() -> None:
    args = ("--set", "health.persistence.enabled=true")
    result = helm("template", "fs", str(CHART), "--kube-version", KUBE_VERSION, *args, check=False)
    assert result.returncode != 0 and "health.persistence is for one replica" in result.stderr


def test_only_the_health_service_dcgm_exporter_anomaly_and_checks_scheduler_get_api_rights(
    full: list[dict[str, Any]],
) -> None:
    roles = {o["metadata"]["name"]: o["rules"] for o in full if o["kind"] == "ClusterRole"}
    # the intrusive-check scheduler: Jobs in its own namespace only, pods read, node labels
    scheduler = "fs-fleetsight-checks-scheduler"
    jobs = [o for o in full if o["kind"] == "Role"]
    assert [(o["metadata"]["name"], o["metadata"]["namespace"], o["rules"]) for o in jobs] == [
        (
            scheduler,
            "fleetsight",
            [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "create"]}],
        )
    ]
    binding = next(o for o in full if o["kind"] == "RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": scheduler, "namespace": "fleetsight"}]
    assert roles.pop(scheduler) == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
    ]
    assert roles == {
        "fs-fleetsight-health": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
            {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
        ],
        # pod labels: dcgm-exporter gets the pod of each GPU, nothing more
        "fs-fleetsight-dcgm-exporter": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
        # pod owners: the anomaly service gets a GPU pod and the Job or StatefulSet above it
        "fs-fleetsight-anomaly": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
            {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get"]},
            {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["get"]},
        ],
    }
    subjects = {o["roleRef"]["name"]: o["subjects"] for o in full if o["kind"] == "ClusterRoleBinding"}
    roles[scheduler] = []
    assert subjects == {
        name: [{"kind": "ServiceAccount", "name": name, "namespace": "fleetsight"}] for name in roles
    }
    accounts = {
        o["metadata"]["name"]: o["automountServiceAccountToken"]
        for o in full
        if o["kind"] == "ServiceAccount"
    }
    assert sorted(name for name, mounted in accounts.items() if mounted) == sorted(roles)


def dcgm_exporter(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return next(
        o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"].endswith("dcgm-exporter")
    )


def test_dcgm_exporter_maps_gpus_to_pods_and_their_training_job_labels(full: list[dict[str, Any]]) -> None:
    """--kubernetes with the kubelet's pod-resources socket, pod labels limited to the training-job
    controllers' keys the anomaly service reads (anomaly/jobs.py), NODE_NAME for `Hostname`."""
    pod = dcgm_exporter(full)["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["DCGM_EXPORTER_KUBERNETES"] == "true"
    assert env["DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS"] == "true"
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    allowlist = [re.compile(p) for p in env["DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX"].split(",")]
    for key in DEFAULT_POD_LABEL_KEYS:
        assert any(p.search(key) for p in allowlist), key
    for other in ("app", "pod-template-hash", "jobset.sigs.k8s.io/job-key", "controller-uid"):
        assert not any(p.search(other) for p in allowlist), other
    mount = next(m for m in container["volumeMounts"] if m["name"] == "pod-resources")
    assert (mount["mountPath"], mount["readOnly"]) == ("/var/lib/kubelet/pod-resources", True)
    volume = next(v for v in pod["volumes"] if v["name"] == "pod-resources")
    assert volume["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert pod["automountServiceAccountToken"] is True


def test_dcgm_exporter_without_kubernetes_mapping_has_no_rights_and_no_socket() -> None:
    objects = render("--set", "dcgmExporter.enabled=true", "--set", "dcgmExporter.kubernetes.enabled=false")
    pod = dcgm_exporter(objects)["spec"]["template"]["spec"]
    names = {e["name"] for e in pod["containers"][0]["env"]}
    assert not {n for n in names if n.startswith("DCGM_EXPORTER_KUBERNETES")}
    assert "pod-resources" not in {v["name"] for v in pod["volumes"]}
    assert pod["automountServiceAccountToken"] is False
    assert "fs-fleetsight-dcgm-exporter" not in kinds(objects).get("ClusterRole", [])


def test_the_dcgm_pod_monitor_labels_series_with_node(full: list[dict[str, Any]]) -> None:
    """The rules join on `node`: the PodMonitor relabels dcgm-exporter's Hostname to node, as
    metrics/prometheus.yml does for the dcgm job, and gives the target its node for `up`."""
    monitor = next(
        o for o in full if o["kind"] == "PodMonitor" and o["metadata"]["name"].endswith("dcgm-exporter")
    )
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["relabelings"] == [
        {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}
    ]
    production = yaml.safe_load((REPO_ROOT / "metrics" / "prometheus.yml").read_text())
    dcgm_job = next(j for j in production["scrape_configs"] if j["job_name"] == "dcgm")
    expected = [
        {
            "sourceLabels": [r["source_labels"][0]],
            "regex": r["regex"],
            "targetLabel": r["target_label"],
            "replacement": r["replacement"],
        }
        for r in dcgm_job["metric_relabel_configs"]
    ]
    assert endpoint["metricRelabelings"] == expected


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "nodeAgent.port=99999"], "nodeAgent.port"),
        (["--set", "health.kubernetesSync.interval=0"], "health.kubernetesSync.interval"),
        (["--set", "fabricExporter.enabled=true"], "ufmUrl"),
        (["--set", "nodeAgnet.enabled=false"], "nodeAgnet"),
        (["--set", "nodeAgent.resources.requests.memory=lots"], "nodeAgent.resources.requests.memory"),
        (["--set", "image.pullPolicy=Sometimes"], "image.pullPolicy"),
        (["--set", "checks.light.checks={dcgm_diag_r3}"], "checks.light.checks"),
        (["--set", "checks.light.interval=5"], "checks.light.interval"),
        (
            ["--set", "checks.light.externalDcgmExporter.url=dcgm:9400"],
            "checks.light.externalDcgmExporter.url",
        ),
        (["--set", "checks.images.dcgmi.withFleetSight=maybe"], "checks.images.dcgmi.withFleetSight"),
        (["--set", "cluster=prod a"], "cluster"),
    ],
    ids=[
        "port",
        "interval",
        "fabric-without-ufm",
        "typo",
        "quantity",
        "pull-policy",
        "intrusive-light",
        "busy",
        "exporter-url",
        "image-kind",
        "cluster-name",
    ],
)
def test_the_schema_rejects_bad_values_naming_them(args: list[str], message: str) -> None:
    result = helm("template", "fs", str(CHART), "--kube-version", KUBE_VERSION, *args, check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr, result.stderr


def workload(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def test_the_light_checks_run_on_every_gpu_node_and_report_to_the_checks_service(
    with_dcgm: list[dict[str, Any]],
) -> None:
    light = workload(with_dcgm, "DaemonSet", "fs-fleetsight-checks-light")["spec"]["template"]
    agent = workload(with_dcgm, "DaemonSet", "fs-fleetsight-node-agent")["spec"]["template"]
    assert light["spec"]["nodeSelector"] == agent["spec"]["nodeSelector"]
    assert light["spec"]["tolerations"] == agent["spec"]["tolerations"]  # FleetSight's taint too
    assert light["spec"]["automountServiceAccountToken"] is False
    args = light["spec"]["containers"][0]["args"]
    assert args[:2] == ["checks", "run"] and "--node=$(NODE_NAME)" in args and "--every=900" in args
    assert "--report=http://fs-fleetsight-checks:9443" in args
    assert [a for a in args if a.startswith("--check=")] == [
        "--check=row_remap",
        "--check=power_brake",
        "--check=link_errors",
    ]
    service = workload(with_dcgm, "Service", "fs-fleetsight-checks")
    assert service["spec"]["ports"][0]["port"] == 9443
    assert service["metadata"]["labels"]["fleetsight.io/job"] == "fleetsight-checks"


def test_the_scheduler_cycles_on_a_cron_with_the_health_gate_and_leaf_map(full: list[dict[str, Any]]) -> None:
    cron = workload(full, "CronJob", "fs-fleetsight-checks-scheduler")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"  # one pass at a time: the budget holds
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "fs-fleetsight-checks-scheduler"
    args = pod["containers"][0]["args"]
    assert args[:2] == ["checks", "kube-cycle"]
    assert "--checks-url=http://fs-fleetsight-checks:9443" in args
    assert "--health-url=http://fs-fleetsight-health:9441" in args
    assert "--leaf-map=/etc/fleetsight/checks/leaf-map.yml" in args and "--budget=2" in args
    config = workload(full, "ConfigMap", "fs-fleetsight-checks-config")
    assert yaml.safe_load(config["data"]["leaf-map.yml"]) == {
        "gpu-0": "leaf-a",
        "gpu-1": ["leaf-a", "leaf-b"],
    }
    health = workload(full, "Deployment", "fs-fleetsight-health")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "FLEETSIGHT_CHECKS_URL", "value": "http://fs-fleetsight-checks:9443"} in health["env"]


def test_without_the_checks_nothing_of_them_renders() -> None:
    objects = render("--set", "checks.enabled=false")
    assert not [o["metadata"]["name"] for o in objects if "checks" in o["metadata"]["name"]]
    health = workload(objects, "Deployment", "fs-fleetsight-health")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert "FLEETSIGHT_CHECKS_URL" not in {e["name"] for e in health.get("env", [])}


# -- issue 41: checks that can run where they are deployed ---------------------------------------------------


def light_tools(objects: list[dict[str, Any]]) -> dict[str, Any]:
    config = workload(objects, "ConfigMap", "fs-fleetsight-checks-config")
    return yaml.safe_load(config["data"]["tools.yml"])["tools"]


def light_checks(objects: list[dict[str, Any]]) -> list[str]:
    """The checks the light DaemonSet runs; none when it is not rendered."""
    found = [
        o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"].endswith("-checks-light")
    ]
    if not found:
        return []
    (light,) = found
    args = light["spec"]["template"]["spec"]["containers"][0]["args"]
    return [a.removeprefix("--check=") for a in args if a.startswith("--check=")]


def catalog() -> dict[str, Any]:
    return yaml.safe_load((REPO_ROOT / "checks" / "catalog.yml").read_text())["checks"]


def test_without_a_dcgm_exporter_no_light_check_reads_one() -> None:
    """No dcgm-exporter of the chart's, none named: no light-check DaemonSet that would read an exporter
    nobody runs; the tools file names no dcgm_metrics."""
    without = render("--set", "dcgmExporter.enabled=false")
    assert "fs-fleetsight-checks-light" not in kinds(without)["DaemonSet"]
    assert "dcgm_metrics" not in light_tools(without)
    # a check whose source the chart does deploy still runs: h2d_bandwidth reads the chart's node agent
    objects = render(
        "--set",
        "dcgmExporter.enabled=false",
        "--set",
        "checks.light.checks={row_remap,h2d_bandwidth,dcgm_diag_r1}",
    )
    assert light_checks(objects) == ["h2d_bandwidth"]


@pytest.mark.parametrize(
    "args",
    [
        ["--set", "dcgmExporter.enabled=true"],
        ["-f", str(FULL)],
        ["--set", "checks.light.externalDcgmExporter.url=http://${HOST_IP}:9400/metrics"],
        ["--set", "dcgmExporter.enabled=true", "--set", "nodeAgent.enabled=false",
         "--set", "checks.light.checks={row_remap,h2d_bandwidth,dcgm_diag_r1}"],
    ],
    ids=["own-exporter", "full", "external-exporter", "no-agent"],
)  # fmt: skip
def test_every_light_check_that_runs_has_its_tool(args: list[str]) -> None:
    """Each check the DaemonSet runs reads a tool (as checks/catalog.yml names it) the tools file has,
    and every listed check whose tool is there runs."""
    objects = render(*args)
    tools, entries = light_tools(objects), catalog()
    running = light_checks(objects)
    assert running
    values = yaml.safe_load((CHART / "values.yaml").read_text())["checks"]["light"]["checks"]
    for arg in args:
        if arg.startswith("checks.light.checks="):
            values = arg.split("=", 1)[1].strip("{}").split(",")
    values = yaml.safe_load(FULL.read_text())["checks"]["light"]["checks"] if str(FULL) in args else values
    assert running == [n for n in values if entries[n]["tool"] in tools]
    for name in running:
        assert entries[name]["kind"] == "light"
        assert entries[name]["tool"] in tools, name


def url_parts(url: str) -> tuple[str, str, int, str]:
    match = re.fullmatch(r"(https?)://([^/:]+):(\d+)(/.*)", url)
    assert match, url
    return match[1], match[2], int(match[3]), match[4]


def test_the_light_checks_read_the_charts_dcgm_exporter_where_and_as_it_serves(
    with_dcgm: list[dict[str, Any]],
) -> None:
    """The URL is the exporter's node-local Service (a pod reaches its own node's exporter, never another's),
    over https with the chart's CA, the name its certificate is issued for and the scrape credential, all
    mounted from the Secret the exporter serves with."""
    entry = light_tools(with_dcgm)["dcgm_metrics"]
    scheme, host, port, path = url_parts(entry["url"])
    assert (scheme, path) == ("https", "/metrics")
    # the Service the URL names selects the exporter's pods and forwards to the port it listens on
    name, namespace, svc = host.split(".")
    assert (namespace, svc) == ("fleetsight", "svc")
    service = workload(with_dcgm, "Service", name)
    assert service["spec"]["internalTrafficPolicy"] == "Local"
    (service_port,) = [p for p in service["spec"]["ports"] if p["port"] == port]
    exporter = dcgm_exporter(with_dcgm)
    pod_labels = exporter["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    container = exporter["spec"]["template"]["spec"]["containers"][0]
    (listening,) = [p for p in container["ports"] if p["name"] == service_port["targetPort"]]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DCGM_EXPORTER_LISTEN"] == f":{listening['containerPort']}"
    # it serves TLS and basic auth from the metrics-auth Secret, the one the light pod reads the CA from
    assert env["DCGM_EXPORTER_WEB_CONFIG_FILE"] == "/etc/fleetsight/metrics-auth/web-config.yml"
    served = next(v for v in exporter["spec"]["template"]["spec"]["volumes"] if v["name"] == "metrics-auth")
    light = workload(with_dcgm, "DaemonSet", "fs-fleetsight-checks-light")["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in light["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in light["volumes"]}
    for key in ("ca_file", "password_file"):
        folder, file = entry[key].rsplit("/", 1)
        secret = volumes[mounts[folder]]["secret"]
        assert secret["secretName"] == served["secret"]["secretName"]
        assert {"key": file, "path": file} in secret["items"]
    (auth,) = [
        o for o in with_dcgm if o["kind"] == "Secret" and o["metadata"]["name"].endswith("-metrics-auth")
    ]
    assert entry["username"] == base64.b64decode(auth["data"]["username"]).decode()
    assert entry["server_name"] == "fleetsight-exporter"


def test_the_light_checks_credentials_open_the_charts_exporter_tls(
    with_dcgm: list[dict[str, Any]], tmp_path: Path
) -> None:
    """End to end, with a real exporter-toolkit web configuration: the node agent (the chart's other
    exporter, served with the same Secret as dcgm-exporter) serving the rendered Secret's files, and the
    light checks' runner reading it with the tools entry the chart wrote. The URL's host is a Service
    name here unresolvable, so the entry is pointed at loopback: the certificate is checked against
    server_name, not the host, as in the pod."""
    (auth,) = [
        o for o in with_dcgm if o["kind"] == "Secret" and o["metadata"]["name"].endswith("-metrics-auth")
    ]
    secret = {k: base64.b64decode(v).decode() for k, v in auth["data"].items()}
    for key, value in secret.items():
        (tmp_path / key).write_text(value)
    web = tmp_path / "web-config.yml"
    web.write_text(secret["web-config.yml"].replace("/etc/fleetsight/metrics-auth", str(tmp_path)))
    (tmp_path / "host").mkdir()
    port = free_port()
    command = [
        sys.executable, "-m", "fleetsight.cli", "exporter", "node", "--node", "gpu-a", "--no-nvml",
        "--no-state", "--listen", f"127.0.0.1:{port}", f"--web.config.file={web}",
        "--sysfs-root", str(tmp_path / "host"), "--procfs-root", str(tmp_path / "host"),
    ]  # fmt: skip
    entry = dict(light_tools(with_dcgm)["dcgm_metrics"])
    for key in ("ca_file", "password_file"):
        entry[key] = str(tmp_path / entry[key].rsplit("/", 1)[1])
    entry["url"] = f"https://127.0.0.1:{port}/metrics"
    process = Process("node-agent", command, tmp_path / "agent.log")

    def answers() -> bool:
        try:
            return httpx.get(f"https://127.0.0.1:{port}/metrics", verify=False, timeout=2).status_code == 401
        except httpx.HTTPError:
            return False

    try:
        process.wait_for(answers, what="the node agent over TLS")
        assert "# TYPE" in runner.Tools({"dcgm_metrics": entry}).read("dcgm_metrics", "gpu-a")
        for wrong, reason in (
            ({"server_name": "someone-else"}, "tls"),
            ({"username": "nobody"}, "unauthorised"),
        ):
            with pytest.raises(runner.Blind) as blind:
                runner.Tools({"dcgm_metrics": {**entry, **wrong}}).read("dcgm_metrics", "gpu-a")
            assert blind.value.reason == reason
    finally:
        process.stop()


def test_an_external_exporter_is_read_with_its_own_ca_and_password() -> None:
    ext = "checks.light.externalDcgmExporter"
    objects = render(
        "--set", f"{ext}.url=https://fleetsight-gpu-metrics.gpu-operator.svc:9400/metrics",
        "--set", f"{ext}.caSecret=gpu-operator-ca", "--set", f"{ext}.serverName=nvidia-dcgm-exporter",
        "--set", f"{ext}.username=scraper", "--set", f"{ext}.passwordSecret=gpu-operator-scrape",
    )  # fmt: skip
    entry = light_tools(objects)["dcgm_metrics"]
    assert entry["url"] == "https://fleetsight-gpu-metrics.gpu-operator.svc:9400/metrics"
    assert (entry["server_name"], entry["username"]) == ("nvidia-dcgm-exporter", "scraper")
    light = workload(objects, "DaemonSet", "fs-fleetsight-checks-light")["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in light["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v["secret"] for v in light["volumes"] if "secret" in v}
    for key, secret_name in (("ca_file", "gpu-operator-ca"), ("password_file", "gpu-operator-scrape")):
        folder, file = entry[key].rsplit("/", 1)
        assert volumes[mounts[folder]]["secretName"] == secret_name
        assert volumes[mounts[folder]]["items"] == [{"key": file, "path": file}]
    assert "fs-fleetsight-metrics-auth" not in {s["secretName"] for s in volumes.values()}
    assert light_checks(objects) == ["row_remap", "power_brake", "link_errors"]


def test_the_intrusive_checks_jobs_run_in_the_images_of_values(
    default: list[dict[str, Any]], full: list[dict[str, Any]]
) -> None:
    """checks.images, as the scheduler reads it (jobs.yml, named to the CronJob): every intrusive check's
    tool has an image entry; dcgmi runs in NVIDIA's DCGM image, the GPU probe in FleetSight's, perftest
    only where the operator named an image."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())["checks"]["images"]
    assert {c["tool"] for c in catalog().values() if c["kind"] == "intrusive"} <= set(values)
    full_values = yaml.safe_load(FULL.read_text())
    for objects, fleetsight, perftest in (
        (default, "fleetsight:0.1.0", None),
        (full, "registry.example.org/fleetsight:0.1.0", "registry.example.org/fleetsight-perftest:0.1.0"),
    ):
        config = workload(objects, "ConfigMap", "fs-fleetsight-checks-config")
        jobs = yaml.safe_load(config["data"]["jobs.yml"])
        dcgm = values["dcgmi"]
        assert jobs["images"]["dcgmi"] == {
            "image": f"{dcgm['repository']}:{dcgm['tag']}",
            "fleetsight": False,
        }
        assert dcgm["repository"] == "nvcr.io/nvidia/cloud-native/dcgm" and dcgm["tag"].endswith(
            "-ubuntu22.04"
        )
        assert jobs["tools"]["dcgmi"] == values["dcgmi"]["command"]
        assert jobs["images"]["gpu_probe"] == {"image": fleetsight, "fleetsight": True}
        if perftest is None:
            assert "ib_write_bw" not in jobs["images"] and "ib_write_bw" not in jobs["tools"]
        else:
            assert jobs["images"]["ib_write_bw"] == {"image": perftest, "fleetsight": True}
            assert jobs["tools"]["ib_write_bw"] == full_values["checks"]["images"]["ib_write_bw"]["command"]
        cron = workload(objects, "CronJob", "fs-fleetsight-checks-scheduler")
        pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
        assert env["FLEETSIGHT_CHECKS_JOBS_CONFIGMAP"] == config["metadata"]["name"]
        folder, file = env["FLEETSIGHT_CHECKS_JOBS_FILE"].rsplit("/", 1)
        (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == folder]
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume["configMap"]["name"] == config["metadata"]["name"] and file in config["data"]


def test_one_value_names_the_cluster_for_every_service() -> None:
    # the top-level `cluster` reaches both services that label what they answer (the health records, the
    # checks' series); the old checks.cluster, where someone set it, still wins for the checks service
    def cluster_args(*values: str) -> dict[str, list[str]]:
        found = {}
        for obj in render(*values):
            if obj["kind"] == "Deployment":
                for container in obj["spec"]["template"]["spec"]["containers"]:
                    found[container["name"]] = [
                        a for a in container.get("args", []) if a.startswith("--cluster")
                    ]
        return found

    named = cluster_args("--set", "cluster=vela-2")
    assert named["health"] == named["checks"] == ["--cluster=vela-2"], named
    assert cluster_args()["health"] == ["--cluster=default"]
    assert cluster_args("--set", "cluster=a", "--set", "checks.cluster=b")["checks"] == ["--cluster=b"]


def test_the_global_layer_reads_the_clusters_file_the_chart_writes(
    full: list[dict[str, Any]], tmp_path: Path
) -> None:
    # the ConfigMap's clusters file is what `fleetsight fleet serve` reads (its own reader, here), each
    # token file lies in the mount of the cluster's Secret, and the monitor keeps the series' cluster
    from fleet.clusters import load_clusters

    layer = workload(full, "Deployment", "fs-fleetsight-fleet")["spec"]["template"]["spec"]
    (container,) = layer["containers"]
    assert "--clusters-file=/etc/fleetsight/fleet/clusters.yml" in container["args"]
    config = next(
        o
        for o in full
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "fs-fleetsight-fleet-clusters"
    )
    text = config["data"]["clusters.yml"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in layer["volumes"] if "secret" in v}
    token_file = "/etc/fleetsight/fleet/tokens/vela/token"
    assert secrets[mounts["/etc/fleetsight/fleet/tokens/vela"]] == "fleet-vela-read" and token_file in text
    (tmp_path / "token").write_text("t0k3n\n")
    (tmp_path / "clusters.yml").write_text(text.replace(token_file, str(tmp_path / "token")))
    clusters = load_clusters(tmp_path / "clusters.yml")
    assert [(c.name, c.health, c.token) for c in clusters] == [
        ("vela", "https://health.vela.example.org:9441", "t0k3n"),
        ("blue-vela", "http://health.bluevela.example.org:9441", None),
    ]
    (monitor,) = [
        o for o in full if o["kind"] == "ServiceMonitor" and o["metadata"]["name"] == "fs-fleetsight-fleet"
    ]
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    refused = helm("template", "fs", str(CHART), "--set", "fleet.enabled=true", check=False)
    assert refused.returncode != 0 and "fleet.enabled needs fleet.clusters" in refused.stderr


def test_the_silent_corruption_watch_is_off_by_default_and_needs_its_log_store() -> None:
    """trainingSdc (docs/anomaly.md "Silent data corruption"): no log store in the chart, so off by
    default; on, it reads the store given (read-only user, password and CA from Secrets), serves /metrics
    scraped as job training-sdc; on without a store is refused with what to set."""
    assert "fs-fleetsight-training-sdc" not in kinds(render()).get("Deployment", [])
    objects = render(
        "--set", "trainingSdc.enabled=true", "--set", "trainingSdc.logsUrl=https://logs:9200",
        "--set", "trainingSdc.logsUser=reader", "--set", "trainingSdc.logsPasswordSecret=sdc-pw",
        "--set", "trainingSdc.logsCaSecret=logs-ca", "--set", "monitoring.operator.enabled=true",
    )  # fmt: skip
    pod = workload(objects, "Deployment", "fs-fleetsight-training-sdc")["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[:3] == ["anomaly", "sdc", "serve"]
    assert {"--logs-url=https://logs:9200", "--logs-user=reader", "--listen=0.0.0.0:9146"} <= set(args)
    assert "--logs-password-file=/etc/fleetsight/logs/password" in args
    assert "--logs-ca-file=/etc/fleetsight/logs-ca/ca.crt" in args
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["logs-password"]["secret"]["secretName"] == "sdc-pw"
    assert volumes["logs-ca"]["secret"]["secretName"] == "logs-ca"
    (monitor,) = [
        o for o in objects if o["kind"] == "ServiceMonitor" and "training-sdc" in o["metadata"]["name"]
    ]
    assert monitor["spec"]["endpoints"][0]["port"] == "http"
    assert "fs-fleetsight-training-sdc" in kinds(objects)["Service"]
    for obj in objects:
        if obj["kind"] not in OPERATOR_KINDS and obj["metadata"]["name"] == "fs-fleetsight-training-sdc":
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    refused = helm(
        "template",
        "fs",
        str(CHART),
        "--namespace",
        "fleetsight",
        "--set",
        "trainingSdc.enabled=true",
        check=False,
    )
    assert refused.returncode != 0 and "trainingSdc.logsUrl" in refused.stderr
