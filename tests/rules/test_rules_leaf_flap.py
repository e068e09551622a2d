"""A leaf switch that flaps under two multi-node jobs (issue 35): the twin's `case_13` backfilled into a
real Prometheus that loads the repo's rules and evaluates them itself, so the `jobs` annotation is
Prometheus's own template expansion. The leaf's hosts get their InfiniBand alerts, which name exactly
the two jobs behind the leaf (a Slurm job and a Kubernetes JobSet) and never the third job, which runs
on the other scalable unit's leaves.

`fleetsight_job_node_info` / `fleetsight_node_jobs_info` come from the anomaly service, which a backfill
does not run: they are written here from the twin's own job placement through the service's code path,
`anomaly.jobs.from_series` over the twin's dcgm-exporter job labels (hpc_job for Slurm, the JobSet's pod
labels on Kubernetes) and `anomaly.service.job_families`, published every 30 s cycle as it would be.

Prometheus evaluates rules only at the current time, so the scenario is backfilled to end now; the job
series run on to the moment Prometheus starts (the service never stopped), and nothing lies in the
future, where it would push the head's first valid time past the rules' own output.
"""

from __future__ import annotations

import datetime as dt
import math
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from anomaly.jobs import JobIdentity, from_series
from anomaly.service import JobNode, job_families
from evaluation.backfill import CaptureOptions, backfill_blocks
from evaluation.firings import series_text
from evaluation.replay import write_openmetrics_blocks
from fleetsight.procs import stop_process
from rules.ruleset import rule_files
from support import free_port, wait_until
from twin import dcgm
from twin.scenario import SHIPPED_DIR, Scenario, load
from twin.sim import Simulation
from twin.truth import load_truth

SCENARIO = SHIPPED_DIR / "case_13.yaml"
LEAF = "leaf-su01-rail3"
# The jobs as the anomaly service names them: a Slurm id, a JobSet's <namespace>/<name>.
BEHIND_LEAF = {"n0001": "7301", "n0002": "7301", "n0003": "team-m/pretrain-m2", "n0004": "team-m/pretrain-m2"}
ELSEWHERE = "7303"
CYCLE_S = 30.0  # the anomaly service's publishing cycle


def job_pairs(sim: Simulation, cluster: str) -> list[JobNode]:
    """The (job, node) pairs the service would find now: its job identity read from the job labels
    the twin's dcgm-exporter puts on each node's GPUs."""
    settings, identity = sim.scenario.dcgm, JobIdentity()
    series = []
    for i, node in enumerate(sim.nodes):
        job = sim.jobs[int(sim.node_job[i])] if sim.node_job[i] >= 0 else None
        labels, attributes = dcgm.workload_labels(sim, i, settings, job)
        series.append((node, {**labels, **attributes}))
    found = from_series(identity, series)
    return [JobNode(cluster, node, found.refs[job]) for job, nodes in found.nodes.items() for node in nodes]


def job_series(scenario: Scenario, start: dt.datetime, until: float) -> dict[str, list[float]]:
    """Both job series, one sample per cycle from the scenario's start to ``until``, stepping the twin
    again from the same seed and start (the backfill's placement)."""
    sim = Simulation(scenario, start)
    cluster = scenario.cluster.name
    scrape = {"instance": "twin-backfill:anomaly", "job": "anomaly"}
    out: dict[str, list[float]] = {}
    stamp = math.ceil(start.timestamp() / CYCLE_S) * CYCLE_S
    pairs: list[JobNode] = []
    while stamp <= until:
        # Past the scenario's end the twin stops; the service would go on seeing the last placement.
        while sim.t < scenario.duration and sim.unix() < stamp:
            sim.advance()
            sim.kernel_lines.clear()
            sim.app_lines.clear()
            pairs = job_pairs(sim, cluster)
        for family in job_families(pairs):
            for sample in family.samples:
                out.setdefault(series_text(sample.name, {**sample.labels, **scrape}), []).append(stamp)
        stamp += CYCLE_S
    return out


@pytest.fixture
def prometheus_with_rules(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """Backfilled blocks, then a Prometheus evaluating rules/*.yml over them; yields (URL, truth file)."""
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus is not installed: run `fleetsight setup` (Debian prometheus)")
    scenario = load(SCENARIO)
    blocks = tmp_path / "blocks"
    end = dt.datetime.now(dt.UTC).replace(microsecond=0)
    result = backfill_blocks(scenario, blocks, end=end, capture=CaptureOptions(agent_step=30.0))
    start = end - dt.timedelta(seconds=scenario.duration)
    until = dt.datetime.now(dt.UTC).timestamp()
    write_openmetrics_blocks(
        job_series(scenario, start, until), tmp_path / "jobs", blocks, until - start.timestamp()
    )
    config = tmp_path / "prometheus.yml"
    files = "".join(f"  - {path}\n" for path in rule_files())
    config.write_text(f"global:\n  evaluation_interval: 5s\nrule_files:\n{files}")
    port = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={blocks}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=100y"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}", Path(result.truth)
    finally:
        stop_process(process, timeout_s=30)
        log.close()


def alerts(url: str) -> list[dict[str, Any]]:
    try:
        return httpx.get(f"{url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    except (httpx.HTTPError, ValueError, KeyError):
        return []  # not up yet


@pytest.mark.stack
def test_a_leaf_port_flap_lists_both_jobs_behind_that_leaf_and_none_other(
    prometheus_with_rules: tuple[str, Path],
) -> None:
    url, truth = prometheus_with_rules
    [flap] = [line for line in load_truth(truth) if line["kind"] == "leaf_flap"]
    assert flap["target"] == {"switch": LEAF} and flap["nodes"] == sorted(BEHIND_LEAF)
    assert sorted(flap["jobs"]) == ["7301", "7302"] and not flap["job_failed"]

    def flapping() -> list[dict[str, Any]] | None:
        # The job label comes from a recording rule of another group: wait for the evaluation that
        # has it on every host (the first may run before node:hpc_job:info exists).
        found = [a for a in alerts(url) if a["labels"]["alertname"] == "InfiniBandLinkFlapping"]
        labelled = {a["labels"]["node"] for a in found if "hpc_job" in a["labels"]}
        return found if labelled >= set(BEHIND_LEAF) else None

    found = wait_until(flapping, timeout=120, interval=1.0, what="InfiniBandLinkFlapping on the leaf's hosts")
    assert {(a["labels"]["node"], a["labels"]["device"], a["labels"]["port"]) for a in found} == {
        (node, "mlx5_3", "1") for node in BEHIND_LEAF
    }
    assert {a["labels"]["node"]: a["annotations"]["jobs"] for a in found} == BEHIND_LEAF
    assert {a["labels"]["node"]: a["labels"]["hpc_job"] for a in found} == BEHIND_LEAF
    # No alert of any kind, pending or firing, on any host, names the job on the other leaves.
    every = alerts(url)
    named = {a["annotations"].get("jobs", "") for a in every} | {
        a["labels"].get("hpc_job", "") for a in every
    }
    assert ELSEWHERE not in ",".join(named), every
    infiniband = [a for a in every if a["labels"]["alertname"].startswith("InfiniBand")]
    assert {a["labels"]["node"] for a in infiniband} == set(BEHIND_LEAF), infiniband
