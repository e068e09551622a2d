"""What training itself does, as the twin shows it (issue #42, "Robust to what training does"): a
checkpoint idles every node of its job and the nodes resume seconds apart, an evaluation pass stops the
steps and lowers activity on every node alike, expert routing makes one node the busiest and moves it
every few minutes, a pipeline's first and last stages stay the busiest while every GPU waits in its
bubble, a resized job runs on a new node set in the scheduler's view. Each is a benign truth line; the
scenario loader refuses each kind where its job cannot have it.

The physics runs in-process once per module (dcgm-exporter's values as twin/dcgm.py publishes them, the
Slurm view as twin/render.py serves it); one real `fleetsight twin run` checks the files consumers read.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from twin_helpers import FLEETSIGHT, twin_validate

from fleetsight.settings import REPO_ROOT
from twin import dcgm, render
from twin.fault_kinds import TRAINING_KINDS
from twin.scenario import from_dict
from twin.sim import Simulation, hostlist
from twin.truth import load_truth

START = dt.datetime(2026, 11, 21, 10, tzinfo=dt.UTC)
SHORT = REPO_ROOT / "evaluation" / "scenarios" / "anomaly" / "benign_training_short.yaml"
SCENARIO: dict[str, Any] = {
    "seed": 42,
    "duration": "40m",
    "cluster": {"name": "t", "nodes": 16},
    "realism": {"benign_per_node_hour": 0},  # only the events named here
    "jobs": [
        {"id": "1", "nodes": "n0001-n0008", "profile": "llm-70b", "pipeline_stages": 4},
        {"id": "2", "nodes": "n0009-n0012", "profile": "moe-8x22b", "pipeline_stages": 1},
        {"id": "3", "nodes": "n0013-n0014", "profile": "llm-8b"},
    ],
    "faults": [
        {"kind": "pipeline_bubble", "target": {"job": "1"}, "onset": 0, "duration": "40m"},
        {
            "kind": "checkpoint_stall",
            "target": {"job": "1"},
            "onset": "10m",
            "duration": "60s",
            "magnitude": 8,
        },
        {"kind": "eval_pause", "target": {"job": "1"}, "onset": "20m", "duration": "3m"},
        {"kind": "moe_imbalance", "target": {"job": "2", "every": "3m"}, "onset": "5m", "duration": "35m"},
        {"kind": "job_resize", "target": {"job": "3", "nodes": 4}, "onset": "15m", "duration": "60s"},
    ],
}


@dataclass
class Run:
    """Per tick: the time (unix), each node's GPU means of what dcgm-exporter publishes, each job's
    phase and steps, and the Slurm view of job 3; the truth and the jobs' log lines at the end."""

    sim: Simulation
    unix: list[float] = field(default_factory=list)
    util: list[np.ndarray] = field(default_factory=list)
    tensor: list[np.ndarray] = field(default_factory=list)
    power: list[np.ndarray] = field(default_factory=list)
    phase: list[dict[str, str]] = field(default_factory=list)
    step: list[dict[str, float]] = field(default_factory=list)
    slurm: list[dict[str, Any]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    received: list[np.ndarray] = field(default_factory=list)  # per node: IB bytes received so far

    def truth(self, kind: str) -> dict[str, Any]:
        return next(line for line in self.sim.truth_lines if line["kind"] == kind)

    def ticks(self, start: float, end: float) -> list[int]:
        return [i for i, t in enumerate(self.unix) if start <= t < end]


def _node_means(sim: Simulation, name: str) -> np.ndarray:
    return np.asarray(dcgm.values_by_name(sim, name), dtype=float).mean(axis=1)


@pytest.fixture(scope="module")
def run() -> Run:
    sim = Simulation(from_dict(SCENARIO), START)
    result = Run(sim)
    for _ in range(int(sim.scenario.duration / sim.scenario.tick)):
        sim.advance()
        result.unix.append(sim.unix())
        result.util.append(_node_means(sim, "DCGM_FI_DEV_GPU_UTIL"))
        result.tensor.append(_node_means(sim, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"))
        result.power.append(_node_means(sim, "DCGM_FI_DEV_POWER_USAGE"))
        result.phase.append({job.spec.id: job.phase for job in sim.jobs})
        result.received.append(sim.ib_counters["port_rcv_data"].astype(float).sum(axis=1) * 4.0)
        result.step.append({job.spec.id: job.step for job in sim.jobs})
        result.slurm.append(next(j for j in render.slurm_jobs(sim)["jobs"] if j["job_id"] == 3))
        result.lines += [f"{line.t} {line.job} {line.text}" for line in sim.app_lines if line.rank in (0, 63)]
        sim.app_lines.clear()
        sim.kernel_lines.clear()
    sim.refresh_truth()
    return result


def test_every_training_kind_is_a_benign_truth_line_of_its_job(run: Run) -> None:
    for kind in TRAINING_KINDS:
        line = run.truth(kind)
        assert line["benign"] is True and line["job"] == line["target"]["job"], line
        assert line["nodes"] and not line["job_failed"], line
    assert len(run.truth("pipeline_bubble")["nodes"]) == 8


def test_a_checkpoint_idles_every_node_of_the_job_and_they_resume_seconds_apart(run: Run) -> None:
    line = run.truth("checkpoint_stall")
    nodes = list(range(8))
    during = run.ticks(line["onset_unix"], line["end_unix"])
    assert during and all(run.phase[i]["1"] == "checkpoint" for i in during)
    assert all((run.util[i][nodes] <= 10).all() and (run.tensor[i][nodes] < 0.02).all() for i in during)
    busy_power = np.mean([run.power[i][nodes].mean() for i in range(during[0] - 12, during[0] - 2)])
    assert all((run.power[i][nodes] < 0.4 * busy_power).all() for i in during), busy_power
    assert run.step[during[0]]["1"] == run.step[during[-1]]["1"], "no step while the checkpoint is written"
    resumed = line["resumed"]
    assert sorted(resumed) == [f"n{i:04d}" for i in range(1, 9)]
    times = np.array([resumed[f"n{i + 1:04d}"] for i in nodes])
    assert times.min() == pytest.approx(line["end_unix"]) and np.ptp(times) == pytest.approx(8.0, abs=0.01)
    # Between the first and the last resume, the nodes that resumed wait in NCCL for the others (a
    # resident kernel, no tensor work) while those still writing stay idle: their ends differ.
    split = 0
    for i in run.ticks(times.min(), times.max()):
        back = times <= run.unix[i]
        waiting = (run.util[i][nodes] >= 90) & (run.tensor[i][nodes] < 0.01)
        idle = run.util[i][nodes] <= 10
        assert (waiting == back).all() and (idle == ~back).all(), (run.util[i][nodes], back)
        split += int(back.any() and not back.all())
    assert split >= 1
    assert any("saving checkpoint" in text for text in run.lines)
    assert any("successfully saved checkpoint" in text for text in run.lines)


def test_an_evaluation_pass_stops_the_steps_and_lowers_every_node_alike(run: Run) -> None:
    line = run.truth("eval_pause")
    during = run.ticks(line["onset_unix"], line["end_unix"])
    before = [i for i in range(during[0] - 60, during[0]) if run.phase[i]["1"] == "compute"]
    assert all(run.phase[i]["1"] == "eval" for i in during)
    assert run.step[during[0]]["1"] == run.step[during[-1]]["1"], "no training step while evaluating"
    tensor = np.mean([run.tensor[i][:8] for i in during], axis=0)
    training = np.mean([run.tensor[i][:8] for i in before], axis=0)
    assert 0.3 < tensor.mean() / training.mean() < 0.8, (tensor, training)
    assert tensor.max() / tensor.min() < 1.05, "every node evaluates alike"
    util = np.mean([run.util[i][:8] for i in during])
    assert 40 <= util <= 70
    after = run.ticks(line["end_unix"] + 200, line["end_unix"] + 260)
    assert run.step[after[-1]]["1"] > run.step[during[-1]]["1"], "training resumes"
    assert any("validation loss at iteration" in text and "lm loss PPL" in text for text in run.lines)


def test_expert_routing_makes_one_node_the_busiest_and_moves_it(run: Run) -> None:
    line = run.truth("moe_imbalance")
    busiest = line["busiest"]
    assert len(busiest) >= 10 and len({node for _, node in busiest}) >= 3
    assert all(a[1] != b[1] for a, b in itertools.pairwise(busiest)), "it moves every time"
    assert all(b[0] - a[0] == pytest.approx(180.0) for a, b in itertools.pairwise(busiest))
    nodes = [f"n{i:04d}" for i in range(9, 13)]
    hits, ratios = 0, []
    for (start, hot), (end, _) in itertools.pairwise(busiest):
        ticks = [i for i in run.ticks(start + 30, end) if run.phase[i]["2"] == "compute"]
        mean = np.mean([run.tensor[i][8:12] for i in ticks], axis=0)
        index = nodes.index(hot)
        hits += int(np.argmax(mean) == index)
        ratios.append(mean[index] / np.delete(mean, index).mean())
    assert hits >= 0.7 * (len(busiest) - 1), ratios
    assert np.median(ratios) > 1.04, ratios


def test_the_busiest_experts_node_receives_more_of_the_all_to_all_and_a_dense_jobs_nodes_alike(
    run: Run,
) -> None:
    """The routing's node is sent more tokens: it receives more bytes than its peers while it is the
    busiest (the anomaly detector's routing test reads this); a dense job's nodes receive alike."""
    busiest = run.truth("moe_imbalance")["busiest"]
    nodes = [f"n{i:04d}" for i in range(9, 13)]
    ratios = []
    for (start, hot), (end, _) in itertools.pairwise(busiest):
        ticks = run.ticks(start + 30, end)
        got = run.received[ticks[-1]] - run.received[ticks[0]]
        moe = got[8:12]
        index = nodes.index(hot)
        ratios.append(moe[index] / np.median(np.delete(moe, index)))
        dense = got[0:8]
        assert dense.max() / dense.min() < 1.03, dense  # the pipeline job: every node alike
    assert min(ratios) > 1.0 and np.median(ratios) > 1.04, ratios  # the wander adds to or takes from it


def test_a_pipeline_keeps_its_first_and_last_stage_busiest_and_waits_in_its_bubble(run: Run) -> None:
    line = run.truth("pipeline_bubble")
    assert line["bubble"] == pytest.approx(3 / 11, abs=1e-4)  # 1F1B: (p - 1) / (m + p - 1), 4 stages, 8
    computing = [i for i in range(len(run.unix)) if run.phase[i]["1"] == "compute"]
    tensor = np.mean([run.tensor[i][:8] for i in computing], axis=0)
    stage = tensor.reshape(4, 2).mean(axis=1)  # 2 replicas per stage, Megatron's rank order
    middle = stage[1:3].mean()
    assert stage[3] > stage[0] > middle and stage[3] > 1.03 * middle, stage
    # The bubble is waiting with NCCL's kernel resident: the GPUs look fully busy to GPU_UTIL.
    assert np.mean([run.util[i][:8] for i in computing]) >= 95


def test_a_resized_job_runs_on_a_new_node_set_in_the_scheduler_view(run: Run) -> None:
    line = run.truth("job_resize")
    assert line["from_nodes"] == ["n0013", "n0014"] and len(line["to_nodes"]) == 4
    assert set(line["from_nodes"]) < set(line["to_nodes"]) and sorted(line["nodes"]) == line["to_nodes"]
    before = run.slurm[run.ticks(line["onset_unix"] - 60, line["onset_unix"])[-1]]
    gap = run.slurm[run.ticks(line["onset_unix"], line["end_unix"])[0]]
    after = run.slurm[-1]
    assert before["job_state"] == ["RUNNING"] and before["nodes"] == "n[0013-0014]"
    assert gap["job_state"] == ["PENDING", "REQUEUED"] and gap["nodes"] == ""
    assert after["job_state"] == ["RUNNING"] and after["node_count"]["number"] == 4
    assert after["nodes"] == hostlist(line["to_nodes"])
    allocations = run.sim.jobs[2].allocations
    assert [len(a["nodes"]) for a in allocations] == [2, 4] and allocations[0]["state"] == "REQUEUED"
    assert allocations[1]["start_unix"] >= line["end_unix"]


def test_a_twin_run_writes_them_where_consumers_read_and_names_none_in_its_data(tmp_path: Path) -> None:
    out = tmp_path / "twin"
    subprocess.run(
        [*FLEETSIGHT, "twin", "run", "--scenario", str(SHORT), "--out", str(out), "--duration", "42m"],
        check=True,
        capture_output=True,
        cwd=REPO_ROOT,
        timeout=300,
    )
    truth = load_truth(tmp_path / "twin.truth.jsonl")
    assert {line["kind"] for line in truth if line["benign"]} >= set(TRAINING_KINDS)
    jobs = {job["id"]: job for job in json.loads((out / "meta.json").read_text())["jobs"]}
    first, second = jobs["7103"]["allocations"]  # resized at 40 min, back at 41 min
    assert (len(first["nodes"]), first["state"], len(second["nodes"])) == (4, "REQUEUED", 6)
    assert jobs["7103"]["nodes"] == second["nodes"] and set(first["nodes"]) < set(second["nodes"])
    logs = "".join(p.read_text() for p in (out / "nodes").glob("*/var/log/jobs/7101/rank-*.log"))
    assert "saving checkpoint" in logs and "successfully saved checkpoint" in logs
    logs = "".join(p.read_text() for p in (out / "nodes").glob("*/var/log/jobs/7104/rank-*.log"))
    assert "validation loss at iteration" in logs  # the evaluation from 30 to 35 min
    data = "".join(
        p.read_text(errors="replace") for p in out.rglob("*") if p.is_file() and p.stat().st_size < 1e6
    )
    assert not [kind for kind in TRAINING_KINDS if kind in data], "the data names no event"


BAD = {
    "moe_dense": ("moe_imbalance", '{job: "1"}', "faults[0].target.job", "mixture-of-experts"),
    "bubble_flat": ("pipeline_bubble", '{job: "2"}', "faults[0].target.job", "pipeline-parallel"),
    "bubble_late": ("pipeline_bubble", '{job: "1"}', "faults[0].onset", "set when it launches"),
    "resize_none": ("job_resize", '{job: "1"}', "faults[0].target.nodes", "node count"),
    "resize_odd": ("job_resize", '{job: "1", nodes: 3}', "faults[0].target.nodes", "pipeline stages"),
    "on_a_node": (
        "checkpoint_stall",
        '{job: "1", node: n0001}',
        "faults[0].target.node",
        "acts on a whole job",
    ),
    "no_job": ("eval_pause", "{}", "faults[0].target.job", "needs the id"),
}


def test_validate_refuses_each_kind_where_its_job_cannot_have_it(tmp_path: Path) -> None:
    jobs = (
        "jobs: [{id: '1', nodes: 4, profile: llm-70b, pipeline_stages: 2},"
        " {id: '2', nodes: 2, profile: llm-8b, start: 1m}]"
    )
    files = []
    for name, (kind, target, _, _) in BAD.items():
        path = tmp_path / f"{name}.yaml"
        fault = f"faults: [{{kind: {kind}, target: {target}, onset: 5m}}]"
        path.write_text(f"duration: 1h\ncluster: {{nodes: 8}}\n{jobs}\n{fault}\n")
        files.append(str(path))
    result = twin_validate(*files, str(SHORT))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    lines = result.stdout.splitlines()
    for name, (_, _, key, reason) in BAD.items():
        line = next(line for line in lines if f"{name}.yaml" in line)
        assert line.startswith("INVALID") and key in line and reason in line, line
    assert next(line for line in lines if "benign_training_short" in line).startswith("ok")
