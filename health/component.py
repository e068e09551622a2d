"""The health service in the local stack: it reads the stack's Alertmanager pair and Prometheus (and the
twin's slurmrestd-style jobs endpoint), and Prometheus scrapes its ``fleetsight_node_health_state``."""

from __future__ import annotations

import sys

from fleetsight.components import Component, http_ok, scrape_own_port
from fleetsight.settings import Settings
from fleetsight.setup import apt_step


def command(settings: Settings) -> list[str]:
    return [
        sys.executable,
        "-m",
        "fleetsight.cli",
        "health",
        "serve",
        "--listen",
        f"127.0.0.1:{settings.port('health')}",
        "--alertmanager-url",
        f"{settings.url('alertmanager')},{settings.url('alertmanager_b')}",
        "--prometheus-url",
        settings.url("prometheus"),
        "--scheduler-url",
        settings.url("twin", "/slurm/v0.0.40"),
        "--state-dir",
        str(settings.data_dir("health")),
        "--cluster",
        "demo",
    ]


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
