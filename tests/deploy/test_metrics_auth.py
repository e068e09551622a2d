"""The chart ships the exporters' TLS and basic auth switched on (values: metricsAuth; docs/security.md T4):
the Secret the chart makes on a real API server holds a certificate, a password and a web configuration
that the real node agent serves with and a real Prometheus scrapes with, exactly as the chart's
PodMonitor tells prometheus-operator to; an upgrade keeps the Secret; the operator's monitors and the
pods' probes match; switching it off leaves plain HTTP."""

from __future__ import annotations

import base64
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import httpx
import pytest
import yaml
from kube import CHART, NAMESPACE, RELEASE, Cluster, helm
from test_chart import FULL, render

from support import Process, free_port

SECRET = f"{RELEASE}-fleetsight-metrics-auth"
MOUNT = "/etc/fleetsight/metrics-auth"
KEYS = {"ca.crt", "tls.crt", "tls.key", "username", "password", "web-config.yml"}


def by_name(objects: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(suffix))


def decoded(secret: dict[str, Any]) -> dict[str, str]:
    return {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}


def certificate_names(secret: dict[str, str]) -> str:
    """The server certificate's subject alternative names, once openssl has verified it against the CA."""
    with tempfile.TemporaryDirectory() as folder:
        ca, cert = Path(folder, "ca.crt"), Path(folder, "tls.crt")
        ca.write_text(secret["ca.crt"])
        cert.write_text(secret["tls.crt"])
        subprocess.run(["openssl", "verify", "-CAfile", str(ca), str(cert)], check=True, capture_output=True)
        names = subprocess.run(
            ["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", str(cert)],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
    return names.splitlines()[-1].strip()


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def test_the_defaults_serve_metrics_over_tls_with_basic_auth() -> None:
    objects = render()
    secret = decoded(by_name(objects, "Secret", "-metrics-auth"))
    assert set(secret) == KEYS
    web = yaml.safe_load(secret["web-config.yml"])
    assert web["tls_server_config"] == {"cert_file": f"{MOUNT}/tls.crt", "key_file": f"{MOUNT}/tls.key"}
    hashed = web["basic_auth_users"][secret["username"]]
    assert bcrypt.checkpw(secret["password"].encode(), hashed.encode()), "the hash is the password's"
    assert secret["password"] not in secret["web-config.yml"]
    assert certificate_names(secret) == "DNS:fleetsight-exporter"

    agent = by_name(objects, "DaemonSet", "-node-agent")
    container = pod_spec(agent)["containers"][0]
    assert f"--web.config.file={MOUNT}/web-config.yml" in container["args"]
    assert {"name": "metrics-auth", "mountPath": MOUNT, "readOnly": True} in container["volumeMounts"]
    volume = next(v for v in pod_spec(agent)["volumes"] if v["name"] == "metrics-auth")
    assert volume["secret"]["secretName"] == "fs-fleetsight-metrics-auth"
    # the password must not go into the pod spec, so the probes only open the port
    assert "tcpSocket" in container["readinessProbe"] and "tcpSocket" in container["livenessProbe"]
    assert agent["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scheme"] == "https"


def test_promtool_accepts_the_generated_web_config(tmp_path: Path) -> None:
    secret = decoded(by_name(render(), "Secret", "-metrics-auth"))
    for key, value in secret.items():
        (tmp_path / key).write_text(value)
    web = tmp_path / "web-config.yml"
    web.write_text(secret["web-config.yml"].replace(MOUNT, str(tmp_path)))
    result = subprocess.run(["promtool", "check", "web-config", str(web)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_operator_monitors_scrape_the_exporters_with_the_secret() -> None:
    objects = render("-f", str(FULL))
    secret = "fleetsight-metrics-auth"  # full-values.yaml names an existing Secret
    assert not [o for o in objects if o["kind"] == "Secret"], "an existing Secret is only referenced"
    expected = {
        "scheme": "https",
        "tlsConfig": {"serverName": "fleetsight-exporter",
                      "ca": {"secret": {"name": secret, "key": "ca.crt"}}},
        "basicAuth": {"username": {"name": secret, "key": "username"},
                      "password": {"name": secret, "key": "password"}},
    }  # fmt: skip
    monitors = {
        "node agent": by_name(objects, "PodMonitor", "-node-agent")["spec"]["podMetricsEndpoints"][0],
        "dcgm-exporter": by_name(objects, "PodMonitor", "-dcgm-exporter")["spec"]["podMetricsEndpoints"][0],
        "fabric exporter": by_name(objects, "ServiceMonitor", "-fabric-exporter")["spec"]["endpoints"][0],
    }
    for name, endpoint in monitors.items():
        assert {key: endpoint.get(key) for key in expected} == expected, name
    # the services answer with their own token scheme, not this credential
    anomaly = by_name(objects, "ServiceMonitor", "-anomaly")["spec"]["endpoints"][0]
    assert "basicAuth" not in anomaly and "scheme" not in anomaly
    dcgm = pod_spec(by_name(objects, "DaemonSet", "-dcgm-exporter"))
    env = {e["name"]: e.get("value") for e in dcgm["containers"][0]["env"]}
    assert env["DCGM_EXPORTER_WEB_CONFIG_FILE"] == f"{MOUNT}/web-config.yml"
    assert next(v for v in dcgm["volumes"] if v["name"] == "metrics-auth")["secret"]["secretName"] == secret


def test_switched_off_it_is_plain_http() -> None:
    objects = render("--set", "metricsAuth.enabled=false")
    # No metrics credential; the health webhook's token (templates/health-events-token.yaml) and the
    # checks' results token (templates/checks-results-token.yaml) stay.
    secrets = sorted(o["metadata"]["name"] for o in objects if o["kind"] == "Secret")
    assert secrets == [f"{RELEASE}-fleetsight-checks-results", f"{RELEASE}-fleetsight-health-events"], secrets
    agent = by_name(objects, "DaemonSet", "-node-agent")
    container = pod_spec(agent)["containers"][0]
    assert not [a for a in container["args"] if a.startswith("--web.config.file")]
    assert container["readinessProbe"]["httpGet"]["path"] == "/metrics"
    assert "prometheus.io/scheme" not in agent["spec"]["template"]["metadata"]["annotations"]


def installed_secret(cluster: Cluster) -> dict[str, str]:
    return decoded(cluster.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{SECRET}"))


def test_an_upgrade_keeps_the_secret(release: Cluster) -> None:
    before = installed_secret(release)
    assert set(before) == KEYS
    helm("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reuse-values", cluster=release)
    assert installed_secret(release) == before, "a new password would lock Prometheus out"


@pytest.fixture(scope="module")
def agent_with_the_release_secret(
    release: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict]:
    """The real node agent serving with the files of the Secret the release made, as the pod mounts them."""
    folder = tmp_path_factory.mktemp("metrics-auth")
    secret = installed_secret(release)
    for key, value in secret.items():
        (folder / key).write_text(value)
    (folder / "web-config.yml").write_text(secret["web-config.yml"].replace(MOUNT, str(folder)))
    empty_root = folder / "host"
    empty_root.mkdir()
    port = free_port()
    command = [
        sys.executable, "-m", "fleetsight.cli", "exporter", "node", "--node", "gpu-a",
        "--no-nvml", "--no-state",
        "--listen", f"127.0.0.1:{port}", f"--web.config.file={folder / 'web-config.yml'}",
        "--sysfs-root", str(empty_root), "--procfs-root", str(empty_root),
    ]  # fmt: skip
    process = Process("node-agent", command, folder / "agent.log")
    ca = str(folder / "ca.crt")

    def refuses_anonymous() -> bool:
        try:  # the certificate names fleetsight-exporter, not 127.0.0.1: only the status is looked at
            return httpx.get(f"https://127.0.0.1:{port}/metrics", verify=False, timeout=2).status_code == 401
        except httpx.HTTPError:
            return False

    try:
        process.wait_for(refuses_anonymous, what="the node agent over TLS")
        yield {"port": port, "folder": folder, "ca": ca, "secret": secret}
    finally:
        process.stop()


def test_prometheus_scrapes_the_agent_as_the_podmonitor_says(agent_with_the_release_secret: dict) -> None:
    prometheus = shutil.which("prometheus")
    assert prometheus, "Prometheus is not installed: run `fleetsight setup`"
    agent = agent_with_the_release_secret
    folder: Path = agent["folder"]
    (folder / "prometheus-password").write_text("not the password")

    def job(name: str, password_file: Path, server_name: str = "fleetsight-exporter") -> dict[str, Any]:
        # what prometheus-operator writes for the PodMonitor's tlsConfig and basicAuth
        return {"job_name": name, "scrape_interval": "1s", "scrape_timeout": "1s", "scheme": "https",
                "tls_config": {"ca_file": agent["ca"], "server_name": server_name},
                "basic_auth": {"username": agent["secret"]["username"], "password_file": str(password_file)},
                "static_configs": [{"targets": [f"127.0.0.1:{agent['port']}"]}]}  # fmt: skip

    config = {"scrape_configs": [
        job("release-secret", folder / "password"),
        job("wrong-password", folder / "prometheus-password"),
        job("wrong-server-name", folder / "password", server_name="someone-else"),
    ]}  # fmt: skip
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    process = Process(
        "prometheus",
        [prometheus, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        folder / "prometheus.log",
    )  # fmt: skip

    def health() -> dict[str, str] | None:
        try:
            targets = httpx.get(f"http://127.0.0.1:{port}/api/v1/targets", timeout=5).json()
        except (httpx.HTTPError, ValueError):  # not ready yet: a plain-text 503
            return None
        found = {t["labels"]["job"]: t["health"] for t in targets["data"]["activeTargets"]}
        # bcrypt's first check can make a first scrape slow on a loaded machine: wait for a good one
        settled = found.get("release-secret") == "up" and all(v != "unknown" for v in found.values())
        return found if settled and len(found) == 3 else None

    try:
        found = process.wait_for(health, what="Prometheus scraping the agent with the release's secret")
    finally:
        process.stop()
    assert found == {"release-secret": "up", "wrong-password": "down", "wrong-server-name": "down"}
