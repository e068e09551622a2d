"""Real servers for the bare-metal tests, started once per session: a real Slurm 22.05 on loopback that
allows dynamic nodes (``scontrol create/delete``), the health service reading it through the real
slurmrestd, and a real Prometheus discovering its targets from the health service (http_sd)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "health"))  # the health tests' helpers
from baremetal_helpers import NODES, REAL_API, SD_REFRESH_S, DynamicSlurm
from health_helpers import Process, fast_policy, slurm_cluster, start_health

from support import free_port, wait_until


@pytest.fixture(scope="session")
def slurm() -> Iterator[DynamicSlurm]:
    with slurm_cluster(DynamicSlurm, NODES, "fleetsight-test-baremetal-") as cluster:
        yield cluster


@pytest.fixture(scope="session")
def health(slurm: DynamicSlurm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The health service reading the real slurmrestd; refresh every 0.3 s."""
    process, url = start_health(
        tmp_path_factory.mktemp("health"),
        fast_policy(circuit_breaker={"max_cluster_fraction": 1.0, "max_unit_fraction": 1.0}),
        ["--scheduler-url", REAL_API, "--scheduler-socket", str(slurm.rest_socket)],
    )
    try:
        wait_until(
            lambda: len(httpx.get(f"{url}/v1/nodes").json()["nodes"]) >= len(NODES),
            timeout=20,
            what="the Slurm nodes to be known",
        )
        yield url
    finally:
        process.stop()


@pytest.fixture(scope="session")
def prometheus(health: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed: run `fleetsight setup`")
    folder = tmp_path_factory.mktemp("prometheus")
    job = {
        "job_name": "fleetsight-node",
        "scrape_interval": "5s",
        "scrape_timeout": "1s",
        "http_sd_configs": [
            {"url": f"{health}/v1/targets/fleetsight-node", "refresh_interval": f"{SD_REFRESH_S}s"}
        ],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump({"scrape_configs": [job]}))
    port = free_port()
    process = Process(
        "prometheus",
        [
            binary,
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        folder / "prometheus.log",
    )
    url = f"http://127.0.0.1:{port}"
    try:
        process.wait_ready(f"{url}/-/ready")
        yield url
    finally:
        process.stop()
