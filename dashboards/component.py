"""Dashboards and the executive report: CLI verbs and what `fleetsight setup` installs to check them.

docker-compose.yml provisions the JSON files of this folder into Grafana 12 (the official image: running it
is the operator's choice; Grafana's Go module is AGPL, so the project never fetches or builds it). Here the
dashboards are checked without Grafana: every panel's query through the project's own runner, with
Grafana's documented macro and variable semantics, against the real Prometheus and OpenSearch, and the JSON
against Grafana's TypeScript types (@grafana/schema).
"""

from __future__ import annotations

from fleetsight.components import Component, fleetsight_command, http_ok
from fleetsight.settings import Settings
from fleetsight.setup import InstallStep, apt_step

from .npm import echarts_file, echarts_installed, install_echarts, install_npm, npm_installed


def viewer_command(settings: Settings) -> list[str]:
    """The viewer on the stack's Thanos Query (the dashboards' datasource), its OpenSearch and chat page."""
    return fleetsight_command(
        "dashboards", "serve", "--listen", f"{settings.host}:{settings.port('dashboards')}",
        "--prometheus", settings.url("thanos_query"), "--logs", settings.url("opensearch"),
        "--chat-url", settings.url("chatbot"),
    )  # fmt: skip


def viewer_missing(settings: Settings) -> str | None:
    return None if echarts_installed(settings) else f"{echarts_file(settings)} missing (fleetsight setup)"


COMPONENTS = [
    Component(
        name="dashboards",
        description="Dashboard viewer: persona dashboards and a fleet overview, drawn from the Grafana JSON",
        command=viewer_command,
        ready=lambda s: http_ok(s.url("dashboards", "/healthz")),
        urls=lambda s: {"home": s.url("dashboards", "/"), "overview": s.url("dashboards", "/overview")},
        missing=viewer_missing,
        depends_on=("thanos-query",),
        ready_timeout_s=30.0,
    ),
]
PORTS = {"dashboards": 144}
START_PRIORITY = 95

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
    InstallStep(
        name="echarts",
        description="Apache ECharts (Apache-2.0) from npm, for the local dashboard viewer's charts",
        needed_by="dashboards viewer (make up) and its browser tests",
        check=echarts_installed,
        install=install_echarts,
        eta="~10 s",
    ),
]
