"""Dashboards and the executive report: CLI verbs and what `fleetsight setup` installs to check them.

docker-compose.yml provisions the JSON files of this folder into Grafana 12 (the official image: running it
is the operator's choice; Grafana's Go module is AGPL, so the project never fetches or builds it). Here the
dashboards are checked without Grafana: every panel's query through the project's own runner, with
Grafana's documented macro and variable semantics, against the real Prometheus and OpenSearch, and the JSON
against Grafana's TypeScript types (@grafana/schema).
"""

from __future__ import annotations

from fleetsight.setup import InstallStep, apt_step

from .npm import install_npm, npm_installed

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
]
