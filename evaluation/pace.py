"""`fleetsight evaluate pace`: the pace check (anomaly/pace.py) scored on the twin's training logs, offline.
The twin runs in-process; its jobs' lines are read back by the check's own reader (anomaly/pace_records.py,
the keys the log pipeline indexes), so no server is needed.

- **Injected**: drawn runs, each one ``slow_nic`` or ``slow_host`` (twin/pace_faults.py) on a drawn job
  (profile, nodes, pipeline stages; its own checkpoints), node, onset and magnitude; plus the fault
  scenarios under evaluation/scenarios/pace/. Found when the job's first straggler episode after onset
  begins while the fault lasts; the cause is right when it is ``communication`` for a slow NIC and
  ``host`` for a slow host; the node is right when it names the fault's node (a slow NIC is not
  localisable from a ring's own timings: its node is scored as not named).
- **Quiet**: every episode on a job before its fault's onset, and on the healthy scenarios' jobs (every
  training kind, checkpoints, evaluations, the twin's drawn disturbances), is a false flag; per job-hour
  of logged steps.

Latency: from the fault's onset to the first step of the window that flags, in steps and seconds of the
job's own log. A service adds its cycle (`anomaly sdc serve --interval`) and the log path's delay.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from anomaly.pace import PaceConfig, PaceVerdict, detect
from anomaly.pace_records import parse_lines
from twin.fault_kinds import PACE_KINDS
from twin.scenario import from_dict
from twin.scenario_model import MODEL_PROFILES
from twin.sim import Simulation

START = dt.datetime(2026, 11, 21, 10, tzinfo=dt.UTC)
SCENARIOS = Path(__file__).resolve().parent / "scenarios" / "pace"
# Job shapes a drawn run takes: (profile, nodes, pipeline stages).
SHAPES = (
    ("vision", 4, 1),
    ("llm-8b", 4, 1),
    ("llm-8b", 8, 1),
    ("llm-20b", 6, 1),
    ("moe-8x22b", 8, 1),
    ("llm-70b", 8, 2),
)
EXPECTED = {"slow_nic": "communication", "slow_host": "host"}
BANDS = ((0.0, 0.05), (0.05, 0.10), (0.10, 0.20), (0.20, 10.0))  # the job's expected slowdown


@dataclass
class Case:
    """One injected fault on one job, and what the check made of it."""

    source: str  # drawn seed or scenario file
    kind: str
    job: str
    node: str
    profile: str
    stages: int
    magnitude: float
    expected_slowdown: float
    logs_from_node: bool  # the node prints lines (the last pipeline stage holds the loss)
    found: bool = False
    cause: str = ""
    named_node: str = ""
    latency_steps: int | None = None
    latency_s: float | None = None
    measured_slowdown: float | None = None
    gpu_hours_lost: float = 0.0


@dataclass
class Report:
    config: PaceConfig
    cases: list[Case] = field(default_factory=list)
    job_hours: float = 0.0
    false_flags: list[dict[str, Any]] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)


def expected_slowdown(kind: str, magnitude: float, profile: str) -> float:
    """What the fault does to the job's step in the twin's physics (twin/workload.py `_step_job`)."""
    share = MODEL_PROFILES[profile]["compute_share"]
    return (1 - share) * (magnitude - 1) if kind == "slow_nic" else magnitude


def _run(raw: dict[str, Any], until: float | None = None) -> Simulation:
    parsed = from_dict(raw)
    sim = Simulation(parsed, START)
    end = parsed.duration if until is None else min(until, parsed.duration)
    while sim.t + parsed.tick < end:
        sim.advance()
    return sim


def score(sim: Simulation, source: str, report: Report) -> None:
    """Every replica-logging job of a finished run: its injected faults scored, its false flags counted."""
    faults = [t for t in sim.truth_lines if t["kind"] in PACE_KINDS]
    for job in sim.jobs:
        if not job.spec.replica_log:
            continue
        lines = [(sim.unix(line.t), line.text) for line in sim.app_lines if line.job == job.spec.id]
        lines = [(t, text) for t, text in lines if "fleetsight-train" in text]
        if not lines:
            continue
        when: dict[int, float] = {}
        for t, text in lines:
            step = int(text.split("step=", 1)[1].split(" ", 1)[0])
            when.setdefault(step, t)
        verdict = detect(parse_lines([text for _, text in lines]), job.spec.id, report.config)
        report.job_hours += (lines[-1][0] - lines[0][0]) / 3600.0
        mine = [f for f in faults if f.get("job") == job.spec.id]
        onset = min((f["onset_unix"] for f in mine), default=math.inf)
        for episode in verdict.episodes:
            if when.get(episode.step, math.inf) < onset:
                report.false_flags.append({"run": source, "job": job.spec.id, **episode.as_dict()})
        for fault in mine:
            report.cases.append(_case(sim, job, fault, verdict, when, source))


def _case(
    sim: Simulation,
    job: Any,
    fault: dict[str, Any],
    verdict: PaceVerdict,
    when: dict[int, float],
    source: str,
) -> Case:
    node = str(fault["target"]["node"])
    stages = job.spec.pipeline_stages
    position = (
        [sim.nodes[i] for i in job.nodes].index(node) if node in [sim.nodes[i] for i in job.nodes] else 0
    )
    replicas = max(1, len(job.nodes) // max(stages, 1))
    case = Case(
        source,
        fault["kind"],
        job.spec.id,
        node,
        job.spec.profile,
        stages,
        float(fault["magnitude"]),
        expected_slowdown(fault["kind"], float(fault["magnitude"]), job.spec.profile),
        position // replicas == stages - 1,
        measured_slowdown=verdict.slowdown_ratio,
        gpu_hours_lost=verdict.gpu_hours_lost,
    )
    onset, end = fault["onset_unix"], fault["end_unix"]
    onset_step = min((s for s, t in when.items() if t >= onset), default=None)
    for episode in verdict.episodes:
        t = when.get(episode.step, math.inf)
        if onset <= t <= end and onset_step is not None:
            case.found, case.cause, case.named_node = True, episode.cause, episode.node
            case.latency_steps, case.latency_s = episode.step - onset_step, round(t - onset, 1)
            break
    return case


def drawn(seed: int, report: Report) -> None:
    """One drawn run: a job of a drawn shape, its own checkpoints, one pace fault."""
    rng = random.Random(seed)
    profile, nodes, stages = rng.choice(SHAPES)
    kind = rng.choice(PACE_KINDS)
    if kind == "slow_nic":
        share = MODEL_PROFILES[profile]["compute_share"]
        slowdown = math.exp(rng.uniform(math.log(0.03), math.log(0.4)))
        magnitude = round(1 + slowdown / (1 - share), 3)
    else:
        magnitude = round(math.exp(rng.uniform(math.log(0.03), math.log(0.4))), 3)
    onset = rng.uniform(20 * 60, 30 * 60)
    scenario = {
        "seed": seed,
        "duration": "2h",
        "cluster": {"name": "pace", "nodes": nodes},
        "jobs": [
            {
                "id": "1",
                "nodes": nodes,
                "profile": profile,
                "pipeline_stages": stages,
                "replica_log": True,
                "checkpoint_interval": f"{rng.randint(10, 20)}m",
            }
        ],
        "faults": [
            {
                "kind": kind,
                "target": {"node": f"n{rng.randrange(nodes) + 1:04d}"},
                "onset": round(onset),
                "duration": "1h",
                "magnitude": magnitude,
            }
        ],
    }
    score(_run(scenario, until=onset + 15 * 60), f"drawn:{seed}", report)


def evaluate(cases: int, seed: int = 1, scenarios: bool = True, config: PaceConfig | None = None) -> Report:
    report = Report(config or PaceConfig())
    for i in range(cases):
        drawn(seed * 100_000 + i, report)
        report.runs.append(f"drawn:{seed * 100_000 + i}")
    if scenarios:
        for path in sorted(SCENARIOS.glob("*.yaml")):
            score(_run(yaml.safe_load(path.read_text())), path.name, report)
            report.runs.append(path.name)
    return report


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def table(report: Report) -> list[dict[str, Any]]:
    """Rows per kind and band of the job's expected slowdown (and all), the logging node's cases only
    where a row says so."""
    rows = []
    for kind in PACE_KINDS:
        for low, high in (*BANDS, (0.0, 100.0)):
            cases = [c for c in report.cases if c.kind == kind and low <= c.expected_slowdown < high]
            if not cases:
                continue
            found = [c for c in cases if c.found]
            steps = [float(c.latency_steps) for c in found if c.latency_steps is not None]
            seconds = [c.latency_s for c in found if c.latency_s is not None]
            rows.append(
                {
                    "kind": kind,
                    "slowdown": "all"
                    if high == 100.0
                    else f"{low:.0%}-{high:.0%}"
                    if high < 10
                    else f">={low:.0%}",
                    "runs": len(cases),
                    "found": len(found),
                    "recall": round(len(found) / len(cases), 3),
                    "cause_right": sum(c.cause == EXPECTED[kind] for c in found),
                    "node_right": sum(c.named_node == c.node for c in found),
                    "node_logs": sum(c.logs_from_node for c in cases),
                    "latency_steps_median": statistics.median(steps) if steps else None,
                    "latency_steps_p95": _quantile(steps, 0.95),
                    "latency_s_median": round(statistics.median(seconds), 1) if seconds else None,
                    "latency_s_p95": _quantile(seconds, 0.95),
                }
            )
    return rows


def summary(report: Report) -> dict[str, Any]:
    return {
        "config": report.config.__dict__,
        "runs": len(report.runs),
        "injected": table(report),
        "quiet": {
            "job_hours": round(report.job_hours, 1),
            "false_flags": len(report.false_flags),
            "per_job_hour": round(len(report.false_flags) / max(report.job_hours, 1e-9), 4),
            "flags": report.false_flags,
        },
        "cases": [c.__dict__ for c in report.cases],
    }
