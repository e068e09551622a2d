"""Helpers of the bare-metal tests (a module of its own, not conftest.py: `from conftest import` picks
whichever conftest was imported first)."""

from __future__ import annotations

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
