"""Dashboards and the executive report: CLI verbs and what `fleetsight setup` installs to check them.

docker-compose.yml provisions the JSON files of this folder into Grafana 12. Locally a Grafana built from
the Go module proxy (dashboards/grafana.py, 10.0.0-preview, backend only) reads the same provisioning
files; the dashboards are also checked with Grafana's TypeScript types and a real Prometheus.
"""

from __future__ import annotations

from fleetsight.components import Component
from fleetsight.settings import Settings
from fleetsight.setup import InstallStep, apt_step

from . import grafana
from .npm import install_npm, npm_installed


def grafana_env(settings: Settings) -> dict[str, str]:
    # The logs datasource points at the local OpenSearch, which speaks Elasticsearch's API.
    return grafana.environment(
        settings,
        settings.port("grafana"),
        settings.data_dir("grafana"),
        settings.url("thanos_query"),
        settings.url("opensearch"),
    )


COMPONENTS = [
    Component(
        name="grafana",
        description="Grafana 10.0.0-preview (backend, HTTP API) provisioned from dashboards/provisioning",
        command=grafana.command,
        env=grafana_env,
        ready=lambda s: (
            grafana.ready(s.url("grafana"))
            and grafana.provisioned(s.url("grafana"), grafana.dashboard_uids(grafana.DASHBOARDS_DIR))
        ),
        urls=lambda s: {"api": s.url("grafana", "/api/health"), "search": s.url("grafana", "/api/search")},
        missing=grafana.missing,
        depends_on=("thanos-query",),
        ready_timeout_s=90.0,
    ),
]
PORTS = {"grafana": 145}

CLI = {
    "dashboards": (".cli", "persona dashboards as code: build, list, verify"),
    "report": (".report_cli", "the weekly executive report (HTML with plots, and JSON)"),
}
INSTALL_STEPS = [
    apt_step(
        "chromium",
        "Debian's Chromium and ChromeDriver, headless, for browser tests (report, web chat)",
        "report and chatbot browser tests",
        {"chromium": "chromium", "chromium-driver": "chromedriver"},
        eta="~40 s",
    ),
    InstallStep(
        name="grafana-schema",
        description="TypeScript and Grafana's dashboard types (@grafana/schema) from npm",
        needed_by="dashboard type checks",
        check=npm_installed,
        install=install_npm,
        eta="~10 s",
    ),
    grafana.INSTALL_STEP,
]
