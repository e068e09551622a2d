"""`fleetsight evaluate sdc`: the silent-corruption check (anomaly/sdc.py) scored on the twin's training
logs, offline. The twin runs in-process; its jobs' lines are read back as records by the detector's own
reader (anomaly/sdc_records.py, which follows the log pipeline's patterns), so no server is needed.

- **Injected**: many runs, each one ``sdc_training`` on a drawn job (profile, replicas, pipeline stages),
  seed, magnitude and onset. Detected when the job is flagged at most ``within`` steps after the first
  corrupt step (the truth's ``onset_step``); named right when the suspects name the corrupt replica.
  Each run is read twice: with the per-replica lines and with the job-wide Megatron lines only.
- **Healthy**: long runs of replica-logging jobs with ordinary loss spikes and the twin's benign
  disturbances; every flag is a false one.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from dataclasses import dataclass, field
from typing import Any

from anomaly.sdc import Config, Verdict, detect
from anomaly.sdc_records import parse_lines
from twin.scenario import from_dict
from twin.sim import Simulation

START = dt.datetime(2026, 11, 21, 10, tzinfo=dt.UTC)
# Job shapes an injected run draws from: (profile, nodes, pipeline stages) -> replicas = nodes / stages.
SHAPES = (
    ("vision", 3, 1),
    ("vision", 4, 1),
    ("llm-8b", 5, 1),
    ("llm-8b", 8, 1),
    ("llm-20b", 6, 2),
    ("moe-8x22b", 8, 2),
    ("llm-70b", 12, 4),
)
MAGNITUDE = (0.05, 1.0)  # log-uniform: a corrupt replica's relative gradient error
HEALTHY_JOBS = (
    {"id": "h1", "nodes": "n0001-n0004", "profile": "vision"},
    {"id": "h2", "nodes": "n0005-n0007", "profile": "vision"},
    {"id": "h3", "nodes": "n0008-n0012", "profile": "llm-8b"},
    {"id": "h4", "nodes": "n0013-n0016", "profile": "llm-20b", "pipeline_stages": 1},
)


@dataclass
class Case:
    seed: int
    profile: str
    replicas: int
    stages: int
    magnitude: float
    onset_step: int = -1
    replica: int = -1
    with_replicas: Verdict | None = None
    job_wide: Verdict | None = None


@dataclass
class Report:
    within: int
    cases: list[Case] = field(default_factory=list)
    healthy_steps: int = 0
    healthy_jobs: int = 0
    healthy_flags: list[Verdict] = field(default_factory=list)
    healthy_spikes: int = 0


def _run(scenario: dict[str, Any], until: float | None = None) -> Simulation:
    parsed = from_dict(scenario)
    sim = Simulation(parsed, START)
    end = parsed.duration if until is None else min(until, parsed.duration)
    while sim.t + parsed.tick < end:
        sim.advance()
    return sim


def _lines(sim: Simulation, job: str) -> list[str]:
    return [line.text for line in sim.app_lines if line.job == job]


def injected_case(seed: int) -> Case:
    """One drawn run with its corruption; the corrupt node is drawn among the job's."""
    rng = random.Random(seed)
    profile, nodes, stages = rng.choice(SHAPES)
    magnitude = math.exp(rng.uniform(math.log(MAGNITUDE[0]), math.log(MAGNITUDE[1])))
    onset = rng.uniform(10 * 60, 20 * 60)  # after start-up and the check's 38 steps of history
    bad = rng.randrange(nodes) + 1
    scenario = {
        "seed": seed,
        "duration": "3h",
        "cluster": {"name": "sdc", "nodes": nodes},
        "jobs": [
            {
                "id": "1",
                "nodes": nodes,
                "profile": profile,
                "pipeline_stages": stages,
                "replica_log": True,
                "checkpoint_interval": "30m",
            }
        ],
        "faults": [
            {
                "kind": "sdc_training",
                "target": {"node": f"n{bad:04d}", "job": "1"},
                "onset": round(onset),
                "duration": "2h",
                "magnitude": round(magnitude, 4),
            }
        ],
    }
    case = Case(seed, profile, nodes // stages, stages, round(magnitude, 4))
    step_time = {"vision": 0.8, "llm-8b": 2.5, "llm-20b": 4.0, "moe-8x22b": 6.0, "llm-70b": 7.5}[profile]
    sim = _run(scenario, until=onset + 60 + 40 * step_time)  # onset_step + a few dozen steps
    truth = next(t for t in sim.truth_lines if t["kind"] == "sdc_training")
    case.onset_step, case.replica = int(truth.get("onset_step", -1)), int(truth.get("replica", -1))
    records = parse_lines(_lines(sim, "1"))
    case.with_replicas = detect(records, "1")
    case.job_wide = detect([r for r in records if r.replica is None], "1")
    return case


def healthy(seed: int, hours: float) -> tuple[int, list[Verdict], int]:
    """(steps, flags, ordinary spikes) of the healthy jobs over ``hours``."""
    scenario = {
        "seed": seed,
        "duration": f"{hours}h",
        "cluster": {"name": "healthy", "nodes": 16},
        "jobs": [{**job, "replica_log": True} for job in HEALTHY_JOBS],
        "faults": [],
    }
    sim = _run(scenario)
    steps, flags = 0, []
    for job in HEALTHY_JOBS:
        records = parse_lines(_lines(sim, job["id"]))
        steps += len({r.step for r in records})
        while records:  # after a flag, a fresh detector on the rest: every false flag counts
            verdict = detect(records, job["id"])
            if not verdict.flagged or verdict.step is None:
                break
            flags.append(verdict)
            records = [r for r in records if r.step > verdict.step]
    spikes = sum(len(model.spikes) for model in sim.__dict__.get("_replica_logs", {}).values())
    return steps, flags, spikes


def evaluate(cases: int, healthy_hours: float, seed: int = 1, within: int = 10) -> Report:
    report = Report(within)
    report.cases = [injected_case(seed * 100_000 + i) for i in range(cases)]
    for run in range(max(1, math.ceil(healthy_hours / 12.0))):
        hours = min(12.0, healthy_hours - run * 12.0)
        steps, flags, spikes = healthy(seed * 100_000 + 50_000 + run, hours)
        report.healthy_steps += steps
        report.healthy_flags += flags
        report.healthy_spikes += spikes
        report.healthy_jobs += len(HEALTHY_JOBS)
    return report


def caught(case: Case, verdict: Verdict | None, within: int) -> tuple[bool, bool, bool]:
    """(flagged in time, flagged before the corruption began, named the corrupt replica)."""
    if verdict is None or not verdict.flagged or verdict.step is None:
        return False, False, False
    early = verdict.step < case.onset_step
    in_time = not early and verdict.step - case.onset_step <= within
    named = any(s.replica == case.replica for s in verdict.suspects) and all(
        s.replica == case.replica for s in verdict.suspects
    )
    return in_time, early, named


def table(report: Report) -> list[dict[str, Any]]:
    """Rows: injected runs by magnitude band and by what the detector read, then the healthy runs."""
    bands = ((0.05, 0.1), (0.1, 0.2), (0.2, 0.5), (0.5, 1.0001))
    rows = []
    for mode in ("with_replicas", "job_wide"):
        for low, high in (*bands, (0.0, 10.0)):
            cases = [c for c in report.cases if low <= c.magnitude < high]
            if not cases:
                continue
            marks = [caught(c, getattr(c, mode), report.within) for c in cases]
            lags = [getattr(c, mode).step - c.onset_step for c, m in zip(cases, marks, strict=True) if m[0]]
            rows.append(
                {
                    "records": "per-replica" if mode == "with_replicas" else "job-wide only",
                    "magnitude": "all" if high == 10.0 else f"{low:g}-{min(high, 1.0):g}",
                    "runs": len(cases),
                    "flagged_in_time": sum(m[0] for m in marks),
                    "share": round(sum(m[0] for m in marks) / len(cases), 3),
                    "named_right": sum(m[2] for m in marks if m[0]),
                    "flagged_before_onset": sum(m[1] for m in marks),
                    "median_lag_steps": sorted(lags)[len(lags) // 2] if lags else None,
                }
            )
    return rows


def summary(report: Report) -> dict[str, Any]:
    rows = table(report)
    overall = next(r for r in rows if r["records"] == "per-replica" and r["magnitude"] == "all")
    return {
        "within_steps": report.within,
        "config": Config().__dict__,
        "injected": rows,
        "healthy": {
            "jobs": report.healthy_jobs,
            "steps": report.healthy_steps,
            "ordinary_spikes": report.healthy_spikes,
            "false_flags": len(report.healthy_flags),
            "flags": [v.as_dict() for v in report.healthy_flags],
        },
        "targets": {
            "flagged_within_10_steps": {"target": 0.9, "measured": overall["share"]},
            "false_flags_per_100k_healthy_steps": {
                "target": 0,
                "measured": round(len(report.healthy_flags) * 100_000 / max(report.healthy_steps, 1), 2),
            },
        },
    }
