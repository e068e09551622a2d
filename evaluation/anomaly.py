"""Offline evaluation: the detector and two baselines over the twin's simulated data, scored against the
twin's ground truth.

The twin runs in-process at full speed (anomaly_feed.py); every ``cycle`` seconds the detector, the
static power threshold and the plain z-score each see the same window, and their flags are scored
against the truth's straggler episodes (anomaly_truth.py, anomaly_scoring.py). This module runs the
scenarios and assembles the report; it is the anomaly evaluation's public face (the CLI, the alerts'
evaluation and the tests import from here: ``__all__``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from anomaly.detector import Detector, DetectorConfig, Event
from fleetsight import durations

from .anomaly_feed import TwinFeed
from .anomaly_scoring import rounded, score
from .anomaly_truth import Episode, ScenarioRun
from .baselines import StaticPowerBaseline, ZScoreBaseline

__all__ = [
    "METHODS",
    "Episode",
    "ScenarioRun",
    "evaluate",
    "flag_log",
    "parse_duration",
    "report",
    "run_scenario",
    "score",
]

METHODS: dict[str, Callable[[], Any]] = {
    # The detector is told what each DCGM sample averages (the twin's realism.sample_window), as the
    # service is told dcgm-exporter's collection interval (--dcgm-interval).
    "detector": lambda sample_s=DetectorConfig.sample_average_s: Detector(
        DetectorConfig(sample_average_s=sample_s)
    ),
    "static_power": StaticPowerBaseline,
    "zscore": ZScoreBaseline,
}


def run_scenario(
    path: Path,
    cycle: float = 30.0,
    progress: Callable[[int], None] | None = None,
    duration: float | None = None,
    dcgm_labels: str | None = None,
    sample_window: float | None = None,
    detectors: dict[str, Callable[[float], Any]] | None = None,
) -> ScenarioRun:
    """One scenario through the detector and the baselines; ``duration`` (s) stops the simulation
    early, as the twin's runner does for ``--duration``: the same data up to then. ``sample_window``
    (s) replaces the scenario's realism.sample_window: what each DCGM sample averages. ``detectors``
    (name: a factory told the sample window) replaces the methods: several detector settings fed the
    same simulation (bench/anomaly_sweep.py), each scored under its name."""
    feed = TwinFeed(path, cycle, duration, dcgm_labels, sample_window)
    sample_s = feed.scenario.realism.sample_window
    if detectors is not None:
        methods = {name: factory(sample_s) for name, factory in detectors.items()}
    else:
        methods = {
            name: factory(sample_s) if name == "detector" else factory() for name, factory in METHODS.items()
        }
    events: dict[str, list[Event]] = {name: [] for name in methods}
    cpu: list[float] = []
    for window in feed.windows(progress):
        for name, method in methods.items():
            started = time.process_time()
            result = method.step(window)
            if name == "detector":
                cpu.append(time.process_time() - started)
            events[name].extend(result.events)
    scenario = feed.scenario
    fault_free = all(_benign(f) for f in scenario.faults)
    return ScenarioRun(
        name=scenario.name,
        nodes=len(feed.sim.nodes),
        hours=feed.ticks * feed.tick / 3600.0,
        fault_free=fault_free,
        episodes=[replace(e, job=feed.job_ids.get(e.job, e.job)) for e in feed.episodes()],
        events=events,
        cycle_cpu_s=cpu,
        truth_source=feed.truth_source,
    )


def _benign(fault: Any) -> bool:
    return bool(getattr(fault, "benign", False))


def parse_duration(value: str) -> float:
    """Seconds from a duration as scenarios write it (90s, 5m, 2h) or a plain number of seconds."""
    try:
        seconds = durations.seconds(value)
    except ValueError as exc:
        raise ValueError(f"--duration: {exc}") from None
    if seconds <= 0:
        raise ValueError(f"--duration: must be positive, got {value!r}")
    return float(seconds)


# ----------------------------------------------------------------------------------- report
def report(runs: list[ScenarioRun], cycle: float) -> dict[str, Any]:
    """The detector's figures at the top level, the baselines' under ``baselines``."""
    result = score(runs, "detector")
    result["baselines"] = {name: score(runs, name) for name in METHODS if name != "detector"}
    for figures in result["baselines"].values():  # thousands of wrong flags: only the detector's
        del figures["missed"], figures["wrong"]
    cpu = [c for run in runs for c in run.cycle_cpu_s]
    result["scenarios"] = [
        {
            "name": run.name,
            "nodes": run.nodes,
            "hours": round(run.hours, 2),
            "fault_free": run.fault_free,
            "episodes": len([e for e in run.episodes if e.counted]),
            "neutral_episodes": len([e for e in run.episodes if e.neutral]),
            "benign_events": len([e for e in run.episodes if e.benign]),
            "detector_flags": len([e for e in run.events["detector"] if e.kind == "flag"]),
            "truth_source": run.truth_source,
        }
        for run in runs
    ]
    result["cycle_s"] = cycle
    result["detector_cpu_per_cycle_s"] = {
        "median": rounded(statistics.median(cpu)) if cpu else None,
        "max": rounded(max(cpu)) if cpu else None,
    }
    sources = sorted({run.truth_source for run in runs})
    result["truth_source"] = ", ".join(sources)
    return result


def evaluate(
    paths: list[Path],
    cycle: float = 30.0,
    progress: Callable[[int], None] | None = None,
    duration: float | None = None,
    dcgm_labels: str | None = None,
    sample_window: float | None = None,
) -> dict[str, Any]:
    runs = [run_scenario(path, cycle, progress, duration, dcgm_labels, sample_window) for path in paths]
    return report(runs, cycle)


def flag_log(runs: list[ScenarioRun]) -> list[dict[str, Any]]:
    return [
        {"scenario": run.name, "event": e.kind, "time": e.time, **e.straggler.as_dict()}
        for run in runs
        for e in run.events["detector"]
    ]
