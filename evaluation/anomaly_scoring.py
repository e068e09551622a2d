"""Scoring a method's flags against the twin's straggler episodes: precision, recall, recall within 15
minutes, F1 and latency overall, per fault kind, per slowdown band and per cause, the cause's accuracy,
and false flags per 1,000 node-hours on fault-free scenarios; with the missed episodes and the wrong
flags, for the detector's report.

Its own module: what counts as a right, wrong or neutral flag is the evaluation's policy, apart from how
the runs are made (anomaly.py) and from the twin's feed (anomaly_feed.py).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from anomaly.detector import Event

from .anomaly_truth import Episode, ScenarioRun

EXPECTED_CAUSE = {
    "psu_failure": "power_brake",
    "thermal_throttle": "thermal",
    "pcie_downgrade": "pcie",
    "gray_slow_node": "unknown",
    "ib_link_flap": "network",
}
# The targets: these kinds of fault, down to a 10 % slowdown of the job. Episodes from 5 %
# (NEUTRAL_SLOWDOWN) count in the figures too; ``at_target`` gives recall over the targets' own set.
TARGET_KINDS = frozenset({"psu_failure", "thermal_throttle", "pcie_downgrade", "gray_slow_node"})
TARGET_SLOWDOWN = 0.10
# The bands (issue 42: 5 %, 10 %, 20 %, 40 %), each named for the target it is judged by. The
# edges lie halfway between the names, so each band is judged by the stricter target at its edges: a
# 7.5-10 % straggler by 10 %'s 120 s, a 15-20 % one by the >= 20 % fast path's 30 s. The first edge is
# NEUTRAL_SLOWDOWN: below it an episode is neutral and counts for no band; a wrong flag raised while such
# an episode, a benign disturbance or nothing paced the job is tallied in BELOW (episodes 0), not in a
# band's precision (the overall precision counts it).
BANDS = (("5%", 0.05, 0.075), ("10%", 0.075, 0.15), ("20%", 0.15, 0.30), ("40%", 0.30, math.inf))
BELOW = "<5%"
# The latency goal for the smallest band: found within 15 minutes of straggling.
WITHIN_S = 900.0


def band_of(slowdown: float) -> str:
    for name, low, high in BANDS:
        if low <= slowdown < high:
            return name
    return BELOW


def cause_of_kind(kind: str) -> str:
    """The cause a right flag names for a fault kind (the rows per cause); kinds with no expected
    cause (a slow OST, a host crash) are ``other``. The twin has no kind whose right cause is
    ``clocks`` (clocks set low without a throttle reason): no row of it until it has."""
    return EXPECTED_CAUSE.get(kind, "other")


@dataclass
class _Tally:
    tp: int = 0
    fp: int = 0
    episodes: int = 0
    detected: int = 0
    latencies: list[float] = field(default_factory=list)
    within: int = 0  # episodes found within WITHIN_S of straggling
    cause_right: int = 0

    def figures(self) -> dict[str, Any]:
        precision = self.tp / (self.tp + self.fp) if self.tp + self.fp else None
        recall = self.detected / self.episodes if self.episodes else None
        recall_15min = self.within / self.episodes if self.episodes else None
        f1 = (
            2 * precision * recall / (precision + recall)
            if precision is not None and recall is not None and precision + recall
            else None
        )
        lat = sorted(self.latencies)
        return {
            "episodes": self.episodes,
            "detected": self.detected,
            "true_flags": self.tp,
            "wrong_flags": self.fp,
            "precision": rounded(precision),
            "recall": rounded(recall),
            "recall_15min": rounded(recall_15min),
            "f1": rounded(f1),
            "latency_median_s": rounded(statistics.median(lat)) if lat else None,
            "latency_p95_s": rounded(float(np.percentile(lat, 95))) if lat else None,
            "cause_accuracy": rounded(self.cause_right / self.tp) if self.tp else None,
        }


def rounded(value: float | None) -> float | None:
    return None if value is None else round(float(value), 4)


def score(runs: list[ScenarioRun], method: str) -> dict[str, Any]:
    """Precision, recall, recall within 15 minutes, F1 and latency overall, per fault kind, per slowdown
    band and per cause (and per kind or cause and band); false flags per 1,000 node-hours on the
    fault-free scenarios."""
    overall = _Tally()
    at_target = _Tally()
    by_kind: dict[str, _Tally] = {}
    by_band: dict[str, _Tally] = {}
    by_kind_band: dict[tuple[str, str], _Tally] = {}
    by_cause: dict[str, _Tally] = {}
    by_cause_band: dict[tuple[str, str], _Tally] = {}
    false_free = 0
    free_hours = 0.0
    missed: list[dict[str, Any]] = []
    wrong: list[dict[str, Any]] = []
    held_into = 0

    def tallies(episode: Episode) -> list[_Tally]:
        targeted = episode.kind in TARGET_KINDS and episode.slowdown >= TARGET_SLOWDOWN
        band = band_of(episode.slowdown)
        cause = "benign" if episode.benign else cause_of_kind(episode.kind)
        return [
            overall,
            by_kind.setdefault(episode.kind, _Tally()),
            by_band.setdefault(band, _Tally()),
            by_kind_band.setdefault((episode.kind, band), _Tally()),
            by_cause.setdefault(cause, _Tally()),
            by_cause_band.setdefault((cause, band), _Tally()),
            *([at_target] if targeted else []),
        ]

    for run in runs:
        flags = [e for e in run.events[method] if e.kind == "flag"]
        if run.fault_free:
            false_free += len(flags)
            free_hours += run.nodes * run.hours
        for episode in run.episodes:
            if episode.counted:
                for tally in tallies(episode):
                    tally.episodes += 1
        first_flag: dict[int, tuple[float, float]] = {}  # episode -> (flag time, its pacing start)
        for event in flags:
            s = event.straggler
            if _masked(run.episodes, s.job, s.node, event.time):
                continue  # the node's fault waits for a slower node: no one could see it, no one is wrong
            match = _matching(run.episodes, s.job, s.node, event.time)
            if match is not None and match.neutral:
                continue  # the fault slowed the job too little to call it a straggler
            if match is not None and match.counted:
                for tally in tallies(match):
                    tally.tp += 1
                    tally.cause_right += int(EXPECTED_CAUSE.get(match.kind) == s.cause)
                span = match.pacing_at(event.time)
                key = id(match)
                if key not in first_flag or event.time < first_flag[key][0]:
                    first_flag[key] = (event.time, span[0] if span else match.onset)
                continue
            # A wrong flag: blame the episode pacing the same job at the time (a peer blamed for the
            # straggler), else count it against no fault at all.
            active = [e for e in run.episodes if e.job == s.job and e.pacing_at(event.time)]
            wrong.append(
                {"scenario": run.name, "job": s.job, "node": s.node, "time": event.time, "cause": s.cause}
                | {"during": active[0].fault_id if active else None}
            )
            if active:
                for tally in tallies(active[0]):
                    tally.fp += 1
            else:  # no fault at all paced the job: no kind, no cause, no band's slowdown
                overall.fp += 1
                by_kind.setdefault("none", _Tally()).fp += 1
                by_cause.setdefault("none", _Tally()).fp += 1
                by_band.setdefault(BELOW, _Tally()).fp += 1
        held = _held_flags(run.events[method])
        for episode in run.episodes:
            if episode.counted and id(episode) in first_flag:
                flagged, since = first_flag[id(episode)]
                soon = _paced_before(episode, flagged) <= WITHIN_S
                for tally in tallies(episode):
                    tally.detected += 1
                    tally.within += int(soon)
                    tally.latencies.append(flagged - since)
            elif episode.counted and _held_into(held, episode):
                # The node was already flagged (for an earlier fault of it) when this one started
                # setting the pace, and stayed flagged: the operator saw it. No latency to report;
                # found at once, so within 15 minutes too.
                held_into += 1
                for tally in tallies(episode):
                    tally.detected += 1
                    tally.within += 1
            elif episode.counted:
                missed.append(_describe(run.name, episode))
    result = overall.figures()
    target = at_target.figures()
    result["at_target"] = {key: target[key] for key in ("episodes", "detected", "recall", "latency_median_s")}
    result["false_flags"] = rounded(1000.0 * false_free / free_hours) if free_hours else None
    result["false_flag_count"] = false_free
    result["fault_free_node_hours"] = round(free_hours, 1)
    result["detected_by_held_flag"] = held_into
    result["missed"] = missed
    result["wrong"] = wrong
    result["by_kind"] = {kind: tally.figures() for kind, tally in sorted(by_kind.items())}
    order = [BELOW, *(band for band, _, _ in BANDS)]
    result["by_band"] = {band: by_band[band].figures() for band in order if band in by_band}
    result["by_kind_band"] = [
        {"kind": kind, "band": band, **tally.figures()}
        for (kind, band), tally in sorted(by_kind_band.items(), key=lambda item: _band_key(*item[0]))
    ]
    result["by_cause"] = {cause: tally.figures() for cause, tally in sorted(by_cause.items())}
    result["by_cause_band"] = [
        {"cause": cause, "band": band, **tally.figures()}
        for (cause, band), tally in sorted(by_cause_band.items(), key=lambda item: _band_key(*item[0]))
    ]
    return result


def _band_key(name: str, band: str) -> tuple[str, int]:
    """Rows by kind (or cause), then band from the smallest slowdown up."""
    order = [BELOW, *(b for b, _, _ in BANDS)]
    return name, order.index(band)


def _paced_before(episode: Episode, time: float) -> float:
    """How long the fault had set its job's pace before ``time``: the straggling an operator sat through
    before the flag. A fault that paced, was masked by a louder node and paced again is timed over its
    pacing spans alone, not from its onset (masked, it cost the job nothing of its own)."""
    return sum(max(0.0, min(b, time) - a) for a, b in episode.pacing if a <= time)


def _matching(episodes: list[Episode], job: str, node: str, time: float) -> Episode | None:
    """The episode a flag belongs to: same node and job, raised while the fault set the job's pace
    (or just after)."""
    hits = [e for e in episodes if e.node == node and e.job == job and e.pacing_at(time)]
    if not hits:
        return None
    counted = [e for e in hits if e.counted] or [e for e in hits if e.neutral] or hits
    return max(counted, key=lambda e: e.slowdown)


def _held_flags(events: list[Event]) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """Per (job, node): the spans from each flag to its clear (open-ended while still flagged)."""
    spans: dict[tuple[str, str], list[tuple[float, float]]] = {}
    raised: dict[tuple[str, str], float] = {}
    for event in events:
        key = (event.straggler.job, event.straggler.node)
        if event.kind == "flag":
            raised[key] = event.time
        elif event.kind == "clear" and key in raised:
            spans.setdefault(key, []).append((raised.pop(key), event.time))
    for key, since in raised.items():
        spans.setdefault(key, []).append((since, math.inf))
    return spans


def _held_into(held: dict[tuple[str, str], list[tuple[float, float]]], episode: Episode) -> bool:
    """A flag of the episode's node, raised before the fault started setting the pace, still held
    at the start of one of its pacing spans."""
    return any(
        raised < start <= cleared
        for raised, cleared in held.get((episode.job, episode.node), [])
        for start, _ in episode.pacing
    )


def _describe(scenario: str, episode: Episode) -> dict[str, Any]:
    return {
        "scenario": scenario,
        "fault_id": episode.fault_id,
        "kind": episode.kind,
        "job": episode.job,
        "node": episode.node,
        "slowdown": round(episode.slowdown, 4),
        "pacing_s": round(episode.pacing_s, 1),
        "masked_s": round(sum(b - a for a, b in episode.masked), 1),
    }


def _masked(episodes: list[Episode], job: str, node: str, time: float) -> bool:
    """The node has a fault that a slower node masks and none that sets the job's pace."""
    mine = [e for e in episodes if e.node == node and e.job == job and not e.benign]
    return any(e.masked_at(time) for e in mine) and not any(e.pacing_at(time) for e in mine)
