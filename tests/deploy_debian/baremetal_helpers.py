"""Helpers of the bare-metal tests (a module of its own, not conftest.py: `from conftest import` picks
whichever conftest was imported first)."""

from __future__ import annotations

import sys
from pathlib import Path

from health.slurm_local import LocalSlurm

REPO = Path(__file__).resolve().parents[2]

NODES = ["n0001", "n0002", "n0003"]
REAL_API = "http://slurmrestd/slurm/v0.0.38"  # 22.05's newest plugin; the host part is ignored on a socket
SD_REFRESH_S = 2  # Prometheus's http_sd refresh_interval in these tests


class DynamicSlurm(LocalSlurm):
    """LocalSlurm plus what 22.05 needs for nodes added and removed at run time: MaxNodeCount, and
    PrivateData=cloud so that a powered-down CLOUD node is listed (sinfo, slurmrestd) like any other."""

    def write_config(self) -> None:
        super().write_config()
        self.conf.write_text(self.conf.read_text() + "MaxNodeCount=64\nPrivateData=cloud\n")


class HookedSlurm(LocalSlurm):
    """LocalSlurm running FleetSight's HealthCheckProgram (deploy/slurm/healthcheck.py, through a
    wrapper that points it at a settings file the tests rewrite) every ``interval`` seconds."""

    def __init__(self, folder: Path, nodes: list[str], ctld_port: int, interval: int = 2) -> None:
        super().__init__(folder, nodes, ctld_port)
        self.interval = interval
        self.settings = self.folder / "healthcheck.env"
        self.log = self.folder / "healthcheck.log"
        self.program = self.folder / "healthcheck.sh"

    def write_config(self) -> None:
        super().write_config()
        self.settings.touch()
        self.program.write_text(
            # slurmd clears the environment: scontrol finds this slurm.conf through SLURM_CONF (a real
            # node's is at the default path)
            f"#!/bin/sh\nFLEETSIGHT_HEALTHCHECK_CONFIG={self.settings} SLURM_CONF={self.conf} "
            f"exec {sys.executable} {REPO / 'deploy' / 'slurm' / 'healthcheck.py'} 2>>{self.folder}/hc.err\n"
        )
        self.program.chmod(0o755)
        hooks = [
            f"HealthCheckProgram={self.program}",
            f"HealthCheckInterval={self.interval}",
            "HealthCheckNodeState=ANY",
        ]
        self.conf.write_text(self.conf.read_text() + "\n".join(hooks) + "\n")

    def configure(self, **values: str) -> None:
        """The HealthCheckProgram's settings (FLEETSIGHT_* keys), from its next run on."""
        values.setdefault("FLEETSIGHT_HEALTHCHECK_LOG", str(self.log))
        self.settings.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
