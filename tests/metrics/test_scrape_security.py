"""Production scrapes the exporters over TLS with basic auth (docs/security.md T4); the local twin stack
does not. metrics/prometheus.yml, docker-compose.yml and the files `logs make-secrets` writes agree."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from fleetsight.settings import Settings
from metrics.local import SCRAPE_SECURITY_KEYS, prometheus_config
from support import FLEETSIGHT, REPO_ROOT

PRODUCTION = yaml.safe_load((REPO_ROOT / "metrics" / "prometheus.yml").read_text())
COMPOSE = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
EXPORTER_JOBS = {"dcgm": "dcgm-exporter", "fleetsight-node": "fleetsight-node", "node": "node-exporter",
                 "fleetsight-fabric": "fleetsight-fabric"}  # fmt: skip


def test_production_scrapes_every_exporter_over_tls_with_basic_auth() -> None:
    jobs = {job["job_name"]: job for job in PRODUCTION["scrape_configs"]}
    mounted = {
        secret["target"]
        for name in ("prometheus-a", "prometheus-b")
        for secret in COMPOSE["services"][name]["secrets"]
    }
    for name in EXPORTER_JOBS:
        job = jobs[name]
        assert job["scheme"] == "https", name
        assert job["tls_config"]["ca_file"] in mounted and job["tls_config"]["server_name"]
        assert job["basic_auth"]["username"] == "prometheus"
        assert job["basic_auth"]["password_file"] in mounted, "the password comes from a secret file"
        assert "password" not in job["basic_auth"], "never the password itself"


def test_compose_exporters_serve_the_web_configuration() -> None:
    services = COMPOSE["services"]
    for service_name in EXPORTER_JOBS.values():
        service = services[service_name]
        command = " ".join(service.get("command", []))
        configured = "--web.config.file=/etc/fleetsight/web-config.yml" in command or (
            service.get("environment", {}).get("DCGM_EXPORTER_WEB_CONFIG_FILE")
            == "/etc/fleetsight/web-config.yml"
        )
        assert configured, service_name
        targets = {secret["target"] for secret in service["secrets"]}
        assert "/etc/fleetsight/web-config.yml" in targets, service_name


def test_the_local_stack_scrapes_plain_http(tmp_path: Path) -> None:
    local = prometheus_config(Settings(run_dir=tmp_path))
    for job in local["scrape_configs"]:
        assert not set(job) & set(SCRAPE_SECURITY_KEYS), job["job_name"]


def test_generated_web_configuration_passes_promtool(tmp_path: Path) -> None:
    out = tmp_path / "secrets"
    subprocess.run([*FLEETSIGHT, "logs", "make-secrets", "--out", str(out)], check=True, capture_output=True)
    web = out / "exporters-web-config.yml"
    text = web.read_text().replace("/etc/fleetsight/", f"{out}/")  # where compose mounts them
    web.write_text(text)
    result = subprocess.run(["promtool", "check", "web-config", str(web)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    password = (out / "exporters-scrape-password").read_text().strip()
    assert password not in text, "the web configuration holds only the bcrypt hash"
    assert all(path.stat().st_mode & 0o077 == 0 for path in out.iterdir())
