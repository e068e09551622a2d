"""The fleet-scale load source (metrics/scale/loadgen.py): every node answers on its own loopback
address with its own name in every series, values move between scrapes, and the file_sd files list
each node once per production job with the stack's labels."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from metrics.scale.capture import Capture
from metrics.scale.loadgen import PATHS, address, load_source_job, node_name
from support import free_port, wait_until

REPO = Path(__file__).resolve().parents[2]
NODES = 5
DCGM = """# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1",Hostname="NODE",hpc_job="5001"} 41.5
# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).
# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",UUID="GPU-1",Hostname="NODE",hpc_job="5001"} 1000000.0
"""
AGENT = (
    "# TYPE fleetsight_bmc_power_consumed_watts gauge\n"
    'fleetsight_bmc_power_consumed_watts{node="NODE"} 812.25\n'
)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("capture")
    nodes = ["n0001", "n0002"]
    Capture(
        dcgm={n: DCGM.replace("NODE", n) for n in nodes},
        node_agent="".join(AGENT.replace("NODE", n) for n in nodes),
        fabric='fleetsight_fabric_port_up{side="host",node="n0001",hca_port="mlx5_0/1"} 1.0\n'
        'fleetsight_fabric_port_up{side="host",node="n0002",hca_port="mlx5_0/1"} 1.0\n',
        node_exporter="node_load1 0.25\n",
        nodes=nodes,
    ).save(folder)
    port, sd = free_port(), folder / "sd"
    process = subprocess.Popen(
        [sys.executable, "-m", "metrics.scale.loadgen", "--capture", str(folder), "--nodes", str(NODES),
         "--port", str(port), "--file-sd", str(sd)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_until(
            lambda: (sd / "node.json").exists() or process.poll() is not None, 60, what="the load source"
        )
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        yield port, sd
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_every_node_answers_on_its_own_address_with_its_own_name(source):
    port, _ = source
    for i in range(NODES):
        body = httpx.get(f"http://{address(i)}:{port}/dcgm", timeout=10).text
        assert f'Hostname="{node_name(i)}"' in body and 'hpc_job="7000"' in body
        assert "n0001" not in body and "n0002" not in body  # the template's names are gone
        agent = httpx.get(f"http://{address(i)}:{port}/node-agent", timeout=10).text
        assert f'node="{node_name(i)}"' in agent
    assert httpx.get(f"http://{address(0)}:{port}/nope", timeout=10).status_code == 404


def test_values_move_between_scrapes_and_counters_do_not_fall(source):
    port, _ = source

    def value(name: str) -> float:
        body = httpx.get(f"http://{address(1)}:{port}/dcgm", timeout=10).text
        return float(next(line for line in body.splitlines() if line.startswith(name)).split()[-1])

    temps = {value("DCGM_FI_DEV_GPU_TEMP") for _ in range(4)}
    assert len(temps) > 1 and all(35 < t < 48 for t in temps)
    energy = [value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") for _ in range(3)]
    assert energy[0] >= 1_000_000.0


def test_file_sd_lists_each_node_once_per_job_with_the_stacks_labels(source):
    port, sd = source
    for path, job in PATHS.items():
        groups = json.loads((sd / f"{job}.json").read_text())
        assert [g["targets"] for g in groups] == [[f"{address(i)}:{port}"] for i in range(NODES)]
        assert {g["labels"]["__metrics_path__"] for g in groups} == {path}
        assert [g["labels"]["node"] for g in groups] == [node_name(i) for i in range(NODES)]
        assert all(g["labels"]["cluster"] and g["labels"]["rack"] == "r001" for g in groups)


def test_prometheus_scrapes_every_node_with_the_production_jobs(source, tmp_path):
    """The bench's Prometheus: metrics/prometheus.yml's jobs through load_source_job (production's TLS and
    basic auth dropped, targets from the load source's files); every node's every exporter is up."""
    _, sd = source
    prometheus = shutil.which("prometheus")
    assert prometheus, "Prometheus is not installed: run `fleetsight setup`"
    production = yaml.safe_load((REPO / "metrics" / "prometheus.yml").read_text())
    jobs = [
        load_source_job(job, sd) for job in production["scrape_configs"] if job["job_name"] in PATHS.values()
    ]
    assert sorted(j["job_name"] for j in jobs) == sorted(PATHS.values())
    for job in jobs:
        job.update(scrape_interval="1s", scrape_timeout="1s")  # production's 60 s for node: too slow here
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({"scrape_configs": jobs}))
    web = free_port()
    process = subprocess.Popen(
        [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{web}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def health() -> dict[str, int] | None:
        assert process.poll() is None, "Prometheus exited"
        try:
            targets = httpx.get(f"http://127.0.0.1:{web}/api/v1/targets", timeout=5).json()["data"]
        except (httpx.HTTPError, ValueError, KeyError):
            return None
        found: dict[str, int] = {}
        for target in targets["activeTargets"]:
            if target["health"] == "unknown":
                return None
            found[target["labels"]["job"]] = found.get(target["labels"]["job"], 0) + (
                target["health"] == "up"
            )
        return found if len(found) == len(PATHS) else None

    try:
        found = wait_until(health, 60, what="every load-source target scraped once")
    finally:
        process.terminate()
        process.wait(timeout=20)
    assert found == {job: NODES for job in PATHS.values()}
