"""The checks service in the local stack: it keeps the active checks' results and Prometheus scrapes its
``fleetsight_check_passed`` / ``fleetsight_check_last_run_timestamp_seconds``. The checks themselves run
on the nodes (a timer for the light ones, scheduler jobs for the intrusive ones: docs/checks.md)."""

from __future__ import annotations

from fleetsight.components import Component, fleetsight_command, http_ok, scrape_own_port
from fleetsight.settings import Settings


def command(settings: Settings) -> list[str]:
    return fleetsight_command(
        "checks",
        "serve",
        "--listen",
        f"127.0.0.1:{settings.port('checks')}",
        "--state-dir",
        str(settings.data_dir("checks")),
        "--cluster",
        "demo",
    )


COMPONENTS = [
    Component(
        name="checks",
        description="Active health checks: results per node and check, validation policy",
        command=command,
        ready=lambda s: http_ok(s.url("checks", "/-/ready")),
        urls=lambda s: {"results": s.url("checks", "/v1/results"), "docs": s.url("checks", "/docs")},
        scrape_configs=scrape_own_port("fleetsight-checks", "checks"),
        ready_timeout_s=30.0,
    ),
]
PORTS = {"checks": 143}
CLI = {"checks": (".cli", "active health checks: catalogue, run, results service, Slurm/Kubernetes passes")}
INSTALL_STEPS: list = []  # type: ignore[type-arg]
