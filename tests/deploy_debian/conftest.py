"""Real servers for the bare-metal tests, started once per session: a real Slurm 22.05 on loopback that
allows dynamic nodes (``scontrol create/delete``), the health service reading it through the real
slurmrestd, and a real Prometheus discovering its targets from the health service (http_sd)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "health"))  # the health tests' helpers
from baremetal_helpers import NODES, SD_REFRESH_S, DynamicSlurm, slurm_health
from health_helpers import slurm_cluster

from support import prometheus_server, stopping, wait_until


@pytest.fixture(scope="session")
def slurm() -> Iterator[DynamicSlurm]:
    with slurm_cluster(DynamicSlurm, NODES, "fleetsight-test-baremetal-") as cluster:
        yield cluster


@pytest.fixture(scope="session")
def health(slurm: DynamicSlurm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The health service reading the real slurmrestd; refresh every 0.3 s."""
    process, url = slurm_health(tmp_path_factory.mktemp("health"), slurm)
    with stopping(process):
        wait_until(
            lambda: set(NODES) <= {n["node"] for n in httpx.get(f"{url}/v1/nodes").json()["nodes"]},
            timeout=20,
            what="the Slurm nodes to be known",
        )
        yield url


@pytest.fixture(scope="session")
def prometheus(health: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    job = {
        "job_name": "fleetsight-node",
        "scrape_interval": "5s",
        "scrape_timeout": "1s",
        "http_sd_configs": [
            {"url": f"{health}/v1/targets/fleetsight-node", "refresh_interval": f"{SD_REFRESH_S}s"}
        ],
    }
    with prometheus_server(tmp_path_factory.mktemp("prometheus"), {"scrape_configs": [job]}) as url:
        yield url
