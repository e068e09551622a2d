"""The checks service in the local stack: it keeps the active checks' results and Prometheus scrapes its
``fleetsight_check_passed`` / ``fleetsight_check_last_run_timestamp_seconds``. The checks themselves run
on the nodes (a timer for the light ones, scheduler jobs for the intrusive ones: docs/checks.md).

A post of results needs a token with scope ``results``: the stack writes one (kept across restarts) to
``<run dir>/config/checks/checks_token``, which the service checks (--results-token-file) and a local check
sends (FLEETSIGHT_CHECKS_TOKEN_FILE)."""

from __future__ import annotations

import secrets
from pathlib import Path

from fleetsight.components import Component, fleetsight_command, http_ok, scrape_own_port
from fleetsight.settings import Settings

TOKEN_FILE = "checks_token"


def token_file(settings: Settings) -> Path:
    """The bare token (scope results) the service checks (--results-token-file) and a local check or
    test posts with (FLEETSIGHT_CHECKS_TOKEN_FILE)."""
    return settings.config_dir("checks") / TOKEN_FILE


def prepare(settings: Settings) -> None:
    """Write the stack's token once: kept across restarts, as the Alertmanager pair's events token."""
    bare = token_file(settings)
    if not bare.exists():
        bare.parent.mkdir(parents=True, exist_ok=True)
        bare.touch(mode=0o600)
        bare.write_text(secrets.token_urlsafe(32) + "\n")


def command(settings: Settings) -> list[str]:
    return fleetsight_command(
        "checks",
        "serve",
        "--listen",
        f"127.0.0.1:{settings.port('checks')}",
        "--state-dir",
        str(settings.data_dir("checks")),
        "--cluster",
        settings.cluster,
        "--results-token-file",
        str(token_file(settings)),
    )


COMPONENTS = [
    Component(
        name="checks",
        description="Active health checks: results per node and check, validation policy",
        command=command,
        prepare=prepare,
        ready=lambda s: http_ok(s.url("checks", "/-/ready")),
        urls=lambda s: {"results": s.url("checks", "/v1/results"), "docs": s.url("checks", "/docs")},
        scrape_configs=scrape_own_port("fleetsight-checks", "checks"),
        ready_timeout_s=30.0,
    ),
]
PORTS = {"checks": 143}
CLI = {"checks": (".cli", "active health checks: catalogue, run, results service, Slurm/Kubernetes passes")}
INSTALL_STEPS: list = []  # type: ignore[type-arg]
