"""The pace check (anomaly/pace.py) on the twin's own lines, in-process: a slow host found and named
``host`` on its node, a slow NIC found and named ``communication``, a healthy job doing what training
does (its checkpoints, a checkpoint stall, an evaluation pass, a data-loader hiccup) silent; the
GPU-hours lost against the twin's physics; blind is not broken (no split keys, no step times, no lines);
and the twin's split itself (twin/pace_faults.py)."""

from __future__ import annotations

import datetime as dt
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from anomaly.pace import PaceVerdict, detect
from anomaly.pace_records import from_documents, parse_line, parse_lines
from fleetsight.settings import REPO_ROOT
from twin.scenario import from_dict
from twin.sim import Simulation

START = dt.datetime(2026, 11, 21, 10, tzinfo=dt.UTC)
HOST_ONSET, NIC_ONSET = 20 * 60, 22 * 60
SCENARIO: dict[str, Any] = {
    "seed": 17,
    "duration": "35m",
    "cluster": {"name": "t", "nodes": 12},
    "jobs": [
        {"id": "1", "nodes": "n0001-n0004", "profile": "llm-8b", "replica_log": True},
        {"id": "2", "nodes": "n0005-n0008", "profile": "llm-20b", "pipeline_stages": 1, "replica_log": True},
        {
            "id": "3",
            "nodes": "n0009-n0012",
            "profile": "llm-8b",
            "replica_log": True,
            "checkpoint_interval": "8m",
        },
    ],
    "faults": [
        {
            "kind": "slow_host",
            "target": {"node": "n0002"},
            "onset": HOST_ONSET,
            "duration": "1h",
            "magnitude": 0.2,
        },
        {
            "kind": "slow_nic",
            "target": {"node": "n0007"},
            "onset": NIC_ONSET,
            "duration": "1h",
            "magnitude": 2.0,
        },
        {
            "kind": "checkpoint_stall",
            "target": {"job": "3"},
            "onset": "14m",
            "duration": "90s",
            "magnitude": 8,
        },
        {"kind": "eval_pause", "target": {"job": "3"}, "onset": "24m", "duration": "3m", "magnitude": 0.5},
        {
            "kind": "dataloader_hiccup",
            "target": {"node": "n0010"},
            "onset": "18m",
            "duration": "20s",
            "magnitude": 15,
        },
    ],
}


@pytest.fixture(scope="module")
def sim() -> Simulation:
    parsed = from_dict(SCENARIO)
    simulation = Simulation(parsed, START)
    while simulation.t + parsed.tick < parsed.duration:
        simulation.advance()
    return simulation


def lines(sim: Simulation, job: str) -> list[tuple[float, str]]:
    return [(sim.unix(a.t), a.text) for a in sim.app_lines if a.job == job and "fleetsight-train" in a.text]


def first_step_after(sim: Simulation, job: str, onset: float) -> int:
    start = sim.unix(0.0)
    return min(int(re.search(r"step=(\d+)", text)[1]) for t, text in lines(sim, job) if t >= start + onset)


def verdict(sim: Simulation, job: str) -> PaceVerdict:
    return detect(parse_lines([text for _, text in lines(sim, job)]), job)


def test_a_slow_host_is_named_host_on_its_node_soon_after_onset(sim: Simulation) -> None:
    v = verdict(sim, "1")
    onset_step = first_step_after(sim, "1", HOST_ONSET)
    assert v.flagged and v.status == "straggler"
    assert (v.straggler.cause, v.straggler.node) == ("host", "n0002")
    assert [(e.cause, e.node) for e in v.episodes] == [("host", "n0002")], "one episode, nothing before"
    assert onset_step <= v.episodes[0].step <= onset_step + 30, (onset_step, v.episodes[0].step)
    # 20 % of a healthy step added by the host: the job's slowdown, measured against its own pace.
    assert 0.15 <= v.slowdown_ratio <= 0.25, v.slowdown_ratio
    assert v.straggler.excess_ms == pytest.approx(0.2 * 2500, rel=0.25)


def test_a_slow_nic_is_named_communication(sim: Simulation) -> None:
    v = verdict(sim, "2")
    onset_step = first_step_after(sim, "2", NIC_ONSET)
    assert v.flagged and v.straggler.cause == "communication"
    # A ring is paced by its slowest link and every rank waits on it alike: no node is named.
    assert v.straggler.node == "" and v.straggler.replica is None
    assert onset_step <= v.episodes[0].step <= onset_step + 30
    # llm-20b: 12 % of its step is exposed communication; doubled, the job is ~12 % slower.
    assert 0.08 <= v.slowdown_ratio <= 0.16, v.slowdown_ratio


def test_a_healthy_job_with_checkpoints_an_eval_and_a_hiccup_is_silent(sim: Simulation) -> None:
    v = verdict(sim, "3")
    texts = [text for _, text in lines(sim, "3")]
    took = [parse_line(t).step_ms for t in texts]
    assert max(took) > 3 * statistics.median(took), "the holds are in the lines (loop-to-loop step times)"
    assert not v.flagged and v.episodes == [] and v.status == "ok", v.as_dict()
    assert abs(v.slowdown_ratio) < 0.03 and v.gpu_hours_lost == 0.0


def test_the_gpu_hours_lost_follow_the_jobs_gpus_and_extra_time(sim: Simulation) -> None:
    v = verdict(sim, "1")
    steps = [int(re.search(r"step=(\d+)", text)[1]) for _, text in lines(sim, "1")]
    after = max(steps) - first_step_after(sim, "1", HOST_ONSET)
    expected = 32 * after * (v.step_ms - v.healthy_ms) / 3.6e6  # 4 nodes x 8 GPUs x the extra per step
    assert v.gpus == 32 and v.gpu_hours_lost == pytest.approx(expected, rel=0.25)
    assert verdict(sim, "3").gpu_hours_lost == 0.0


def test_blind_is_not_broken(sim: Simulation) -> None:
    """Lines without the split: the slowdown and its cost are measured, nobody is named. Lines without a
    step time, or no lines: unknown, nothing flagged."""
    bare = [re.sub(r" data_ms=\S+ compute_ms=\S+ comm_ms=\S+", "", text) for _, text in lines(sim, "1")]
    v = detect(parse_lines(bare), "1")
    assert not v.flagged and v.status == "slow" and "no per-rank split keys" in v.reason
    assert v.slowdown_ratio > 0.15 and v.gpu_hours_lost > 0
    no_time = [re.sub(r" step_time_ms=.*$", "", text) for text in bare]
    assert detect(parse_lines(no_time), "1").status == "unknown"
    assert not detect(parse_lines(no_time), "1").flagged
    empty = detect([], "9")
    assert (empty.status, empty.flagged, empty.slowdown_ratio) == ("unknown", False, None)


def test_megatron_progress_lines_alone_measure_the_slowdown(sim: Simulation) -> None:
    """Every rank prints the job-wide line: as indexed, one document per rank and step, whose hosts give
    the job's GPUs (for its cost)."""
    megatron = [a for a in sim.app_lines if a.job == "1" and "elapsed time per iteration" in a.text]
    v = detect(parse_lines([a.text for a in megatron]), "1")
    assert v.ranks == 0 and not v.flagged
    assert v.slowdown_ratio is not None and v.slowdown_ratio > 0.1
    docs = []
    for a in megatron:
        record = parse_line(a.text)
        training = {"step": record.step, "step_time_ms": record.step_ms}
        docs.append({"host": {"name": sim.nodes[a.node]}, "training": training})
    indexed = detect(from_documents(docs), "1")
    assert indexed.gpus == 32 and indexed.slowdown_ratio == pytest.approx(v.slowdown_ratio)
    assert indexed.gpu_hours_lost > 0


def test_the_twin_splits_each_step_into_its_parts(sim: Simulation) -> None:
    records = parse_lines([text for _, text in lines(sim, "2")])
    onset = first_step_after(sim, "2", NIC_ONSET)
    for record in records[200:240]:
        parts = record.data_ms + record.compute_ms + record.comm_ms
        assert parts == pytest.approx(record.step_ms, abs=1.0) or record.step_ms > parts  # a hold: more
    healthy = [r.comm_ms for r in records if onset - 200 <= r.step < onset - 10]
    slow = [r.comm_ms for r in records if r.step > onset + 30]
    # Every rank's all-reduce slower alike: its least comm (the last to arrive: the transfer alone) too.
    assert min(slow) > 1.5 * min(healthy)


def test_the_cli_reads_log_files_and_exits_1_on_a_straggler(sim: Simulation, tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    log.write_text("\n".join(text for _, text in lines(sim, "1")) + "\n")
    command = [sys.executable, "-m", "fleetsight.cli", "anomaly", "pace", "check", "--file", str(log)]
    result = subprocess.run([*command, "--job", "1", "--json"], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.returncode == 1, result.stderr
    out = json.loads(result.stdout)
    assert out["straggler"]["cause"] == "host" and out["straggler"]["node"] == "n0002"
    assert out["gpu_hours_lost"] > 0 and out["slowdown_ratio"] > 0.15
    healthy = tmp_path / "rank-8.log"
    healthy.write_text("\n".join(text for _, text in lines(sim, "3")) + "\n")
    quiet = subprocess.run(
        [sys.executable, "-m", "fleetsight.cli", "anomaly", "pace", "check", "--file", str(healthy)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    assert quiet.returncode == 0 and quiet.stdout.startswith("job file: ok"), quiet.stdout + quiet.stderr
