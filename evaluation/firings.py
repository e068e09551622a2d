"""Alert firings and detector flags as Prometheus series, and back: Prometheus's alert state machine
applied to a range query's result (:func:`firing_episodes`), the ``ALERTS`` series its rule evaluation
would have written for those episodes (:func:`alerts_series`), and the anomaly service's
``fleetsight_straggler`` samples for the detector's flags (:func:`straggler_samples`).

Its own module: pure transforms of data, no process and no HTTP, that the alerts' and the dashboards'
evaluations share and the tests exercise on hand-made input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rules.ruleset import Rule

ANOMALY_CYCLE_S = 30.0  # the anomaly service's detection cycle, and how often Prometheus scrapes it


@dataclass
class Episode:
    """One alert instance (label set) firing from start to end (seconds)."""

    alertname: str
    labels: dict[str, str]
    start: float
    end: float
    fault: str | None = None


def firing_episodes(rule: Rule, series: list[dict[str, Any]], step: float) -> list[Episode]:
    """Prometheus's alert state machine on a range-query result: pending at the first evaluation where
    the expression has the series, firing once it has held for `for:`, resolved at the first
    evaluation without it."""
    episodes = []
    for item in series:
        labels = {k: v for k, v in item["metric"].items() if k != "__name__"}
        labels.update(rule.labels)
        stamps = [float(t) for t, _ in item["values"]]
        run_start = previous = None
        for stamp in [*stamps, math.inf]:
            if previous is not None and stamp - previous > step * 1.5:
                if previous - run_start >= rule.for_seconds:
                    episodes.append(Episode(rule.name, labels, run_start + rule.for_seconds, previous + step))
                run_start = None
            if run_start is None:
                run_start = stamp
            previous = stamp
    return episodes


def series_text(name: str, labels: dict[str, str]) -> str:
    """`name{a="1",b="2"}` with OpenMetrics escaping (a label value may hold a quote or backslash)."""

    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return name + "{" + ",".join(f'{k}="{escape(v)}"' for k, v in sorted(labels.items())) + "}"


def alerts_series(
    episodes: list[Episode], for_seconds: dict[str, float], end: float, step: float
) -> dict[str, list[float]]:
    """Prometheus's own `ALERTS` series for the episodes, as its rule evaluation writes them every
    `step`: `alertstate="pending"` during the `for:` wait, then `alertstate="firing"` until the
    first evaluation without the condition. The alert's labels are the expression's result labels
    and the rule's static labels (Episode.labels), plus alertname."""
    series: dict[str, list[float]] = {}
    for episode in episodes:
        labels = {**episode.labels, "alertname": episode.alertname}
        wait = for_seconds.get(episode.alertname, 0.0)
        pending = series_text("ALERTS", {**labels, "alertstate": "pending"})
        firing = series_text("ALERTS", {**labels, "alertstate": "firing"})
        stamp = episode.start - wait
        while stamp < min(episode.end, end + step / 2):
            series.setdefault(pending if stamp < episode.start else firing, []).append(stamp)
            stamp += step
    return series


def straggler_samples(
    events: list[dict[str, Any]], begin: float, end: float, cluster: str
) -> list[tuple[str, float]]:
    """`fleetsight_straggler{hpc_job,node,cause} 1` as Prometheus would have scraped it from the
    service every cycle while a flag stood (its cause may change while it stands)."""
    standing: dict[tuple[str, str], tuple[str, float]] = {}
    spans: list[tuple[str, str, str, float, float]] = []
    for event in sorted(events, key=lambda e: float(e["time"])):
        key, at = (str(event["hpc_job"]), str(event["node"])), float(event["time"])
        if key in standing:
            cause, since = standing.pop(key)
            spans.append((*key, cause, since, at))
        if event["event"] in ("flag", "cause"):
            standing[key] = (str(event.get("cause") or "unknown"), at)
    spans += [(*key, cause, since, end) for key, (cause, since) in standing.items()]
    samples = []
    for job, node, cause, since, until in spans:
        labels = (
            f'fleetsight_straggler{{hpc_job="{job}",node="{node}",cause="{cause}",'
            f'cluster="{cluster}",instance="twin-backfill:anomaly",job="anomaly"}}'
        )
        stamp = math.ceil(max(since, begin) / ANOMALY_CYCLE_S) * ANOMALY_CYCLE_S
        while stamp < min(until, end):
            samples.append((labels, stamp))
            stamp += ANOMALY_CYCLE_S
    return samples
