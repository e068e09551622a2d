"""The health service in the local stack: it reads the stack's Alertmanager pair and Prometheus (and the
twin's slurmrestd-style jobs endpoint), and Prometheus scrapes its ``fleetsight_node_health_state``."""

from __future__ import annotations

import os
from pathlib import Path

from fleetsight.components import Component, fleetsight_command, http_ok, scrape_own_port
from fleetsight.settings import Settings
from fleetsight.setup import apt_step


def serve_command(
    listen: str,
    state_dir: Path,
    *,
    policy: Path | None = None,
    cluster: str | None = None,
    alertmanagers: list[str] | None = None,
    prometheus: str | None = None,
    scheduler: str | None = None,
    events_token_file: Path | None = None,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """`fleetsight health serve` with the given sources: the one place its command line is built (the
    local stack, the evaluation's twin check, tests and benches)."""
    options = {
        "--policy": str(policy) if policy else None,
        "--listen": listen,
        "--alertmanager-url": ",".join(alertmanagers) if alertmanagers else None,
        "--prometheus-url": prometheus,
        "--scheduler-url": scheduler,
        "--state-dir": str(state_dir),
        "--cluster": cluster,
        "--events-token-file": str(events_token_file) if events_token_file else None,
    }
    flags = [item for key, value in options.items() if value for item in (key, value)]
    return fleetsight_command("health", "serve", *flags, *extra)


def command(settings: Settings) -> list[str]:
    return serve_command(
        f"127.0.0.1:{settings.port('health')}",
        settings.data_dir("health"),
        cluster="demo",
        alertmanagers=[settings.url("alertmanager"), settings.url("alertmanager_b")],
        prometheus=settings.url("prometheus"),
        scheduler=settings.url("twin", "/slurm/v0.0.40"),
        events_token_file=events_token_file(settings),
    )


def events_token_file(settings: Settings) -> Path:
    """The Alertmanager pair's webhook token (alerting/component.py writes it before either replica
    starts; FLEETSIGHT_ALERTMANAGER_SECRETS_DIR moves it as it moves every Alertmanager secret)."""
    folder = os.environ.get("FLEETSIGHT_ALERTMANAGER_SECRETS_DIR")
    return (
        Path(folder).expanduser() if folder else settings.config_dir("alertmanager")
    ) / "health_events_token"


COMPONENTS = [
    Component(
        name="health",
        description="Health service: one state per node with reasons, REST API for Slurm/LSF",
        command=command,
        ready=lambda s: http_ok(s.url("health", "/-/ready")),
        urls=lambda s: {"api": s.url("health", "/v1/nodes"), "docs": s.url("health", "/docs")},
        scrape_configs=scrape_own_port("fleetsight-health", "health"),
        depends_on=("alertmanager", "alertmanager-b"),
        ready_timeout_s=30.0,
    ),
]

# health 141; `fleetsight health slurm-local`: slurmctld 160 (its slurmd take free ports; 161-169 are
# kept for more Slurm daemons).
PORTS = {"health": 141, "slurmctld": 160}
CLI = {"health": (".cli", "the node health service, Slurm/LSF sync and the prolog check")}
INSTALL_STEPS = [
    apt_step(
        "slurm",
        "Slurm 22.05 (slurmctld, slurmd, slurmrestd, client) and munge: the health tests run a real Slurm",
        "health",
        {
            "slurmctld": "slurmctld",
            "slurmd": "slurmd",
            "slurmrestd": "slurmrestd",
            "slurm-client": "scontrol",
            "munge": "munged",
        },
        eta="~40 s",
    )
]
START_PRIORITY = 60
