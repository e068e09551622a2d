"""The two baselines the evaluation scores beside the detector, on the same windows.

- ``static_power``: what operators do by hand: a GPU of a running job drawing less than a fixed power
  (200 W) flags its node. No peers, no persistence.
- ``zscore``: a plain per-job z-score of each node's tensor activity (mean and standard deviation of
  the job's nodes), flagged above 2, in every window on its own: no history, no persistence, no
  robust statistics.

Both report the same events as the detector (a flag when a node starts being flagged, a clear when it
stops), so that the scorer treats all three alike.
"""

from __future__ import annotations

import warnings

import numpy as np

from anomaly.detector import CycleResult, Event, Straggler
from anomaly.window import Window

POWER_THRESHOLD_W = 200.0
Z_THRESHOLD = 2.0


class _Stateless:
    """Turns a per-window flagged set into flag/clear events."""

    name = "baseline"

    def __init__(self) -> None:
        self.active: dict[tuple[str, str], Straggler] = {}

    def flagged_now(self, window: Window) -> dict[tuple[str, str], float]:
        raise NotImplementedError

    def step(self, window: Window) -> CycleResult:
        now = self.flagged_now(window)
        events: list[Event] = []
        for key, score in now.items():
            if key not in self.active:
                straggler = Straggler(key[0], key[1], "unknown", 0, score, window.end, {}, window.end)
                self.active[key] = straggler
                events.append(Event("flag", window.end, straggler))
        for key in [k for k in self.active if k not in now]:
            events.append(Event("clear", window.end, self.active.pop(key)))
        return CycleResult(scores=[], events=events, counted_jobs=len(window.jobs), quiet_jobs=0)


class StaticPowerBaseline(_Stateless):
    name = "static_power"

    def flagged_now(self, window: Window) -> dict[tuple[str, str], float]:
        out: dict[tuple[str, str], float] = {}
        for job, node_idx in window.jobs.items():
            for i in node_idx:
                power = window.power[i]
                if np.isfinite(power).any() and np.nanmin(power) < POWER_THRESHOLD_W:
                    out[(job, window.nodes[i])] = float(np.nanmin(power))
        return out


class ZScoreBaseline(_Stateless):
    name = "zscore"

    def flagged_now(self, window: Window) -> dict[tuple[str, str], float]:
        out: dict[tuple[str, str], float] = {}
        for job, node_idx in window.jobs.items():
            if len(node_idx) < 3:
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                level = np.nanmean(window.tensor[node_idx], axis=1)
            std = float(np.nanstd(level))
            if not np.isfinite(std) or std == 0.0:
                continue
            z = (level - np.nanmean(level)) / std
            for pos, i in enumerate(node_idx):
                if np.isfinite(z[pos]) and z[pos] > Z_THRESHOLD:
                    out[(job, window.nodes[i])] = float(z[pos])
        return out
