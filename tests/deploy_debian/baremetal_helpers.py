"""Helpers of the bare-metal tests (a module of its own, not conftest.py: `from conftest import` picks
whichever conftest was imported first)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from health_helpers import fast_policy, start_health

from health.slurm_local import LocalSlurm
from support import Process

REPO = Path(__file__).resolve().parents[2]

NODES = ["n0001", "n0002", "n0003"]
REAL_API = "http://slurmrestd/slurm/v0.0.38"  # 22.05's newest plugin; the host part is ignored on a socket
SD_REFRESH_S = 2  # Prometheus's http_sd refresh_interval in these tests


def slurm_health(folder: Path, slurm: LocalSlurm, tokens: str | None = None) -> tuple[Process, str]:
    """The health service reading the real slurmrestd (refresh every 0.3 s), its breaker never holding."""
    policy = fast_policy(circuit_breaker={"max_cluster_fraction": 1.0, "max_unit_fraction": 1.0})
    args = ["--scheduler-url", REAL_API, "--scheduler-socket", str(slurm.rest_socket)]
    return start_health(folder, policy, args, tokens)


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


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: run `fleetsight setup`")
    return found


def built_debs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`make deb`'s packages, built once per session whichever test module asks first (a session
    fixture defined in two modules would build twice): package name -> .deb."""
    out = tmp_path_factory.getbasetemp() / "deb"
    done = out / ".built"
    if not done.exists():
        for name in ("dpkg-buildpackage", "dh", "lintian"):
            tool(name)
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "deploy.debian.build", "--out", str(out)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        print(f"\nmake deb: {time.monotonic() - started:.0f} s")
        print("\n".join(line for line in result.stdout.splitlines() if line.startswith("deb:")))
        done.touch()
    return {p.name.split("_")[0]: p for p in out.glob("*.deb")}


def unpack(debs: Iterable[Path], folder: Path) -> Path:
    """The packages' files under folder as dpkg would install them (no maintainer scripts run)."""
    for deb in debs:
        subprocess.run([tool("dpkg-deb"), "-x", str(deb), str(folder)], check=True, timeout=300)
    return folder
