"""Production scrapes the exporters over TLS with basic auth (docs/security.md T4); the local twin stack
does not. metrics/prometheus.yml, docker-compose.yml and the files `logs make-secrets` writes agree."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from fleetsight.settings import Settings
from metrics.local import SCRAPE_SECURITY_KEYS, prometheus_config, without_addresses
from support import FLEETSIGHT, REPO_ROOT

PRODUCTION = yaml.safe_load((REPO_ROOT / "metrics" / "prometheus.yml").read_text())
COMPOSE = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
EXPORTER_JOBS = {"dcgm": "dcgm-exporter", "fleetsight-node": "fleetsight-node", "node": "node-exporter",
                 "fleetsight-fabric": "fleetsight-fabric"}  # fmt: skip
SERVICE_JOBS = ("anomaly", "fleetsight-health", "fleetsight-chatbot", "fleetsight-checks")


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


def services_uncommented() -> str:
    """metrics/prometheus.yml with the services' commented settings switched on, as an operator who
    serves them over TLS does: ``#key`` or ``#  nested``; prose comments have exactly one space."""
    text = (REPO_ROOT / "metrics" / "prometheus.yml").read_text()
    return re.sub(r"^(\s+)#(?=\S|  )", r"\1", text, flags=re.MULTILINE)


def test_the_services_tls_settings_are_ready_to_switch_on(tmp_path: Path) -> None:
    """Uncommented, every service job scrapes over https with the services' CA and a read token from a
    file (bearer, not basic auth: the services refuse basic_auth_users), promtool accepts the file,
    and the local stack still drops those keys."""
    text = services_uncommented()
    assert text != (REPO_ROOT / "metrics" / "prometheus.yml").read_text(), "nothing commented to switch on"
    jobs = {job["job_name"]: job for job in yaml.safe_load(text)["scrape_configs"]}
    for name in SERVICE_JOBS:
        job = jobs[name]
        assert job["scheme"] == "https", name
        assert job["tls_config"]["ca_file"].startswith("/etc/prometheus/secrets/"), name
        assert job["authorization"]["credentials_file"].startswith("/etc/prometheus/secrets/"), name
        assert "credentials" not in job["authorization"] and "basic_auth" not in job, name
        assert not set(without_addresses(job)) & set(SCRAPE_SECURITY_KEYS), name
    assert {k: v for k, v in jobs.items() if k not in SERVICE_JOBS} == {
        job["job_name"]: job for job in PRODUCTION["scrape_configs"] if job["job_name"] not in SERVICE_JOBS
    }, "only the services' jobs have commented settings"
    # promtool opens the token file: the secrets where the replicas mount them, here under tmp_path
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "services-scrape-token").write_text("a-read-token\n")
    config = tmp_path / "prometheus.yml"
    config.write_text(text.replace("/etc/prometheus/secrets/", f"{secrets}/"))
    result = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
