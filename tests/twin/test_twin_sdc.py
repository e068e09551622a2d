"""The twin's silent data corruption (``sdc_training``) and per-replica training lines (``replica_log``),
in-process: what a job logs per replica and step, what the corruption does to its replica and to the job,
the truth line that scores it, the ordinary spikes of healthy training, and the scenario checks."""

from __future__ import annotations

import datetime as dt
import re
import statistics
from typing import Any

import pytest

from anomaly.sdc_records import parse_lines
from twin.scenario import ScenarioError, from_dict
from twin.sim import Simulation

START = dt.datetime(2026, 11, 21, 10, tzinfo=dt.UTC)
LINE = re.compile(
    r"^fleetsight-train step=(\d+) replica=(\d+) node=(n\d{4}) loss=([0-9.]+) grad_norm=([0-9.]+) "
    r"step_time_ms=([0-9.]+)( data_ms=[0-9.]+ compute_ms=[0-9.]+ comm_ms=[0-9.]+)?$"
)


def scenario(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "seed": 11,
        "duration": "25m",
        "cluster": {"name": "t", "nodes": 10},
        "jobs": [
            {"id": "1", "nodes": "n0001-n0004", "profile": "llm-8b", "replica_log": True},
            {"id": "2", "nodes": "n0005-n0010", "profile": "llm-20b", "pipeline_stages": 2},
        ],
        "faults": [
            {
                "kind": "sdc_training",
                "target": {"node": "n0003"},
                "onset": "12m",
                "duration": "1h",
                "magnitude": 0.5,
            }
        ],
    }
    return {**base, **changes}


def run(raw: dict[str, Any]) -> Simulation:
    parsed = from_dict(raw)
    sim = Simulation(parsed, START)
    while sim.t + parsed.tick < parsed.duration:
        sim.advance()
    return sim


@pytest.fixture(scope="module")
def sim() -> Simulation:
    return run(scenario())


def replica_lines(sim: Simulation, job: str) -> list[tuple[Any, re.Match[str]]]:
    return [
        (line, LINE.match(line.text))
        for line in sim.app_lines
        if line.job == job and "fleetsight-train" in line.text
    ]


def test_a_replica_logging_job_writes_one_line_per_replica_and_step_from_the_replica_node(
    sim: Simulation,
) -> None:
    lines = replica_lines(sim, "1")
    assert lines and all(m is not None for _, m in lines), [line.text for line, m in lines if m is None][:3]
    steps: dict[int, set[int]] = {}
    for line, match in lines:
        step, replica, node = int(match[1]), int(match[2]), match[3]
        steps.setdefault(step, set()).add(replica)
        assert node == sim.nodes[line.node] == f"n{replica + 1:04d}"  # one node per replica (no pipeline)
        assert line.rank == replica * 8  # the replica's first rank logs it
    assert all(replicas == {0, 1, 2, 3} for replicas in steps.values())
    assert sorted(steps) == list(range(1, max(steps) + 1)), "every step, none skipped"
    assert not replica_lines(sim, "2"), "a job without replica_log keeps its Megatron line only"


def test_the_corrupt_replica_deviates_without_nan_and_the_truth_names_it(sim: Simulation) -> None:
    truth = next(t for t in sim.truth_lines if t["kind"] == "sdc_training")
    assert truth["replica"] == 2 and truth["jobs"] == ["1"] and truth["nodes"] == ["n0003"]
    assert truth["benign"] is False and "hardware" not in truth
    onset = truth["onset_step"]
    records = [
        r
        for r in parse_lines(line.text for line in sim.app_lines if line.job == "1")
        if r.replica is not None
    ]
    assert all(r.loss == r.loss and r.grad_norm == r.grad_norm for r in records), "no NaN"

    def ratio(step_filter: Any) -> float:
        ratios = []
        for step in {r.step for r in records if step_filter(r.step)}:
            at = {r.replica: r.grad_norm for r in records if r.step == step}
            ratios.append(at[2] / statistics.median([at[0], at[1], at[3]]))
        return statistics.median(ratios)

    assert ratio(lambda s: s < onset) == pytest.approx(1.0, abs=0.03)
    assert ratio(lambda s: s >= onset) == pytest.approx(1.5, abs=0.05)
    job_wide = [
        r for r in parse_lines(line.text for line in sim.app_lines if line.job == "1") if r.replica is None
    ]
    before = statistics.median(r.grad_norm for r in job_wide if r.step < onset)
    after = statistics.median(r.grad_norm for r in job_wide if r.step >= onset)
    assert after / before == pytest.approx(1 + 0.5 / 4, abs=0.06), "the all-reduce spreads a quarter of it"


def test_a_job_without_replica_lines_still_shows_the_corruption_in_its_megatron_line() -> None:
    raw = scenario(
        faults=[
            {
                "kind": "sdc_training",
                "target": {"node": "n0006", "job": "2"},
                "onset": "10m",
                "magnitude": 2.0,
            }
        ]
    )
    truth = next(t for t in run(raw).truth_lines if t["kind"] == "sdc_training")
    assert truth["jobs"] == ["2"] and truth["replica"] == 1  # position 1 of 6 nodes, 3 replicas x 2 stages
    sim = run(raw)
    onset = truth["onset_step"]
    job_wide = parse_lines(line.text for line in sim.app_lines if line.job == "2")
    assert job_wide and all(r.replica is None for r in job_wide)
    before = statistics.median(r.grad_norm for r in job_wide if r.step < onset)
    after = statistics.median(r.grad_norm for r in job_wide if r.step >= onset)
    assert after / before == pytest.approx(1 + 2.0 / 3, abs=0.15)


def test_healthy_training_has_ordinary_spikes_on_every_replica_that_recover() -> None:
    raw = scenario(
        duration="3h",
        cluster={"name": "t", "nodes": 4},
        jobs=[{"id": "1", "nodes": 4, "profile": "vision", "replica_log": True, "checkpoint_interval": "4h"}],
        faults=[],
    )
    sim = run(raw)
    spikes = sim.__dict__["_replica_logs"]["1"].spikes
    assert len(spikes) >= 2, "an ordinary spike every ~2,000 steps"
    records = [r for r in parse_lines(line.text for line in sim.app_lines) if r.replica is not None]
    loss = {(r.step, r.replica): r.loss for r in records}
    for step in spikes:
        if (step + 40, 0) not in loss:
            continue
        baseline = statistics.median(loss[(step - 5, k)] for k in range(4))
        peak = [loss[(step + 1, k)] / baseline for k in range(4)]
        after = [loss[(step + 40, k)] / baseline for k in range(4)]
        assert min(peak) > 1.01, ("every replica carries the spike's update", peak)
        assert max(after) < 1.05, ("recovered", after)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"jobs": [{"id": "1", "nodes": 2, "replica_log": "yes"}]}, "replica_log: expected true or false"),
        ({"faults": [{"kind": "sdc_training", "target": {"job": "1"}}]}, "needs a node"),
        (
            {"faults": [{"kind": "sdc_training", "target": {"node": "n0001"}, "magnitude": 9}]},
            "outside physics",
        ),
    ],
)
def test_the_scenario_refuses_what_cannot_be(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        from_dict(scenario(**change))
