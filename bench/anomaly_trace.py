"""One job's windows through the straggler detector, one line per window and node: why a node was (or
was not) flagged. For each counted window of the job it prints, per chosen node, the node's top GPU's
robust z, its residual (deviation from the peers minus its learnt offset), the scale z divides by, the
node's mean learnt offset (mu, after the window's learning), its slow-path mean, whether it counts as
drifting (and so no longer learns), the job's drift gauge and whether the job counts as wandering
(expert routing), and the flags and clears of that window (a flag with its cause, z and the path that
raised it: fast, strong, slow, long, persistent, ...).

Each variant (`name:key=value,...`, DetectorConfig overrides as in bench/anomaly_sweep.py) is fed the same
simulation, so two settings can be compared window by window. Without --node it prints the job's top node
by z in each window, and every node that is flagged.

Times are minutes since the scenario's start. The first windows of a day take a few seconds each on a
2-core machine; --to stops the simulation there.

Examples:
    python bench/anomaly_trace.py evaluation/scenarios/anomaly/benign_day_4433.yaml --job 84333 \\
        --node n0020 --from 60m --to 150m --sample-window 5s --variant base --variant thaw:wander_thaw=true
    python bench/anomaly_trace.py evaluation/scenarios/anomaly/moe_gray_x12_4n.yaml --job 7 --to 40m
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from anomaly_sweep import parse_variant  # bench/, beside this file

import evaluation.anomaly as ev
from anomaly.detector import Detector, DetectorConfig
from anomaly.job_model import drifting
from anomaly.paths import wanders
from anomaly.robust import pooled_spread
from anomaly.state import Candidate, Event
from anomaly.window import Window
from evaluation.anomaly_feed import TwinFeed
from fleetsight import durations

HEADER = (
    f"{'min':>7} {'variant':<8} {'node':<7} {'z':>6} {'resid':>7} {'scale':>6} {'mu':>7} "
    f"{'slow':>7} {'drift':>5} {'gauge':>6} {'wander':>6}  events"
)


@dataclass
class Line:
    minute: float
    variant: str
    node: str
    values: dict[str, float]
    drifting: bool
    gauge: float
    wandering: bool
    events: list[str] = field(default_factory=list)

    def text(self) -> str:
        v = self.values
        return (
            f"{self.minute:7.1f} {self.variant:<8} {self.node:<7} {v['z']:6.2f} {v['resid']:7.3f} "
            f"{v['scale']:6.3f} {v['mu']:7.3f} {v['slow']:7.3f} {'yes' if self.drifting else '-':>5} "
            f"{self.gauge:6.3f} {'yes' if self.wandering else '-':>6}  {' '.join(self.events)}"
        )


class TracingDetector(Detector):
    """The detector, noting after each window of one job what it saw of the chosen nodes."""

    def __init__(
        self, config: DetectorConfig, variant: str, job: str, nodes: list[str], start: float
    ) -> None:
        super().__init__(config)
        self.variant, self.job, self.nodes, self.start = variant, job, nodes, start
        self.lines: list[Line] = []

    def _persist(
        self,
        candidate: Candidate,
        outlier: np.ndarray,
        window: Window,
        scores: list[tuple[str, str, int, float]],
        events: list[Event],
    ) -> None:
        before = len(events)
        super()._persist(candidate, outlier, window, scores, events)
        if candidate.job != self.job:
            return
        mine = events[before:]
        self.lines.extend(self._lines(candidate, window, mine))

    def _lines(self, candidate: Candidate, window: Window, mine: list[Event]) -> list[Line]:
        cfg, state = self.config, self.jobs[candidate.job]
        names = [window.nodes[i] for i in candidate.window_nodes]
        z = np.where(np.isfinite(candidate.z), candidate.z, -np.inf)
        flagged = {name for name, node in state.node_state.items() if node.flag is not None}
        chosen = set(self.nodes) if self.nodes else {names[int(np.argmax(z.max(axis=1)))]} | flagged
        gauge = pooled_spread(state.drift)
        wandering = wanders(cfg, state)
        slow = state.slow_mean if state.slow_mean is not None else np.full(candidate.z.shape, np.nan)
        drifts = drifting(cfg, state)  # the learning rule's own test (job_model.learn)
        lines = []
        for pos, name in enumerate(names):
            if name not in chosen:
                continue
            gpu = int(np.argmax(z[pos]))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                values = {
                    "z": float(candidate.z[pos, gpu]),
                    "resid": float(candidate.resid[pos, gpu]),
                    "scale": float(candidate.scale[pos, gpu]),
                    "mu": float(np.nanmean(state.mu[pos])),
                    "slow": float(slow[pos, gpu]),
                }
            is_drifting = bool(drifts[pos, gpu])
            notes = [_event_text(e) for e in mine if e.straggler.node == name]
            minute = (window.end - self.start) / 60.0
            lines.append(Line(minute, self.variant, name, values, is_drifting, gauge, wandering, notes))
        return lines


def _event_text(event: Event) -> str:
    """A flag, clear or cause change with its cause, z and the path that raised the flag."""
    flag = event.straggler
    return f"{event.kind}({flag.cause},z={flag.score:.1f},{flag.evidence.get('path', '-')})"


def main() -> int:
    intro, examples = __doc__.split("Examples:")
    parser = argparse.ArgumentParser(
        description=intro, epilog="Examples:" + examples, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("scenario", type=Path, help="a scenario file (evaluation/scenarios/anomaly/*.yaml)")
    add("--job", required=True, help="the job's id as the detector names it (the Slurm id in flags)")
    add("--node", action="append", default=[], help="a node to trace (repeat); default: each window's top")
    add("--from", dest="start", help="print from this time since the start (e.g. 60m); default: the start")
    add("--to", help="stop the simulation here (e.g. 150m); default: the scenario's end")
    add("--sample-window", help="what each DCGM sample averages (1s, 5s); default: the scenario's")
    add("--variant", action="append", type=parse_variant, help="name[:key=value,...] (repeat); default: base")
    args = parser.parse_args()
    if not args.scenario.is_file():
        parser.error(f"no such scenario file: {args.scenario}")
    try:
        first = float(durations.seconds(args.start)) if args.start else 0.0  # 0: the start itself
        until = ev.parse_duration(args.to) if args.to else None
        sample = ev.parse_duration(args.sample_window) if args.sample_window else None
    except ValueError as exc:  # parse_duration names --duration; say which value was wrong
        parser.error(f"--from {args.start}, --to {args.to}, --sample-window {args.sample_window}: {exc}")
    if until is not None and first >= until:
        parser.error(f"--from {args.start} is not before --to {args.to}: nothing would be printed")
    feed = TwinFeed(args.scenario, 30.0, until, None, sample)
    start = feed.scenario.start.timestamp()
    sample_s = feed.scenario.realism.sample_window
    variants: dict[str, dict[str, Any]] = dict(args.variant or [("base", {})])
    detectors = [
        TracingDetector(
            DetectorConfig(sample_average_s=sample_s, **overrides), name, args.job, args.node, start
        )
        for name, overrides in variants.items()
    ]
    print(HEADER)
    shown = 0
    for window in feed.windows():
        for detector in detectors:
            detector.step(window)
        for detector in detectors:
            for line in detector.lines:
                if line.minute >= first / 60.0:
                    print(line.text(), flush=True)
                    shown += 1
            detector.lines.clear()
    if shown == 0:
        known = sorted({*feed.job_ids.values(), *feed.job_ids})
        print(
            f"job {args.job!r} was never scored in that span; the scenario's jobs: {', '.join(known)}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
