"""Silent data corruption from a job's training records: flag a job whose updates turn anomalous without
a NaN, and name the data-parallel replica (and its node) that disagrees with the others.

Pure: records in, a verdict out; where the records come from is anomaly/sdc_records.py (log lines) and
anomaly/sdc_source.py (the log store). Two checks, step by step, each robust to what healthy training
does (docs/anomaly.md, "Silent data corruption"):

- **Replicas disagree** (per-replica records, three replicas or more): each replica's log loss and log
  gradient norm against the median of the *other* replicas at the same step, in units of the residuals'
  spread over the preceding steps. A replica whose mean residual over the last ``window`` steps (each
  clipped, so one bad batch cannot carry it) stands ``z`` spreads out, with its median on the same
  side, trips the check, for either metric or for both summed (Stouffer). A bad batch spikes one
  replica for a step, then every replica alike: neither is a persistent disagreement.
- **The job leaves its trend** (job-wide records, or the replicas' mean): every one of the last
  ``trend_window`` values of the log loss or log gradient norm above the preceding ``trend_history``
  values' median by ``trend_k`` robust spreads, and not decaying (an ordinary spike falls back within a
  few steps; corruption stays). The level, not a fitted line, is the reference: loss falls during
  training, so the level errs on the quiet side.

A non-finite loss flags too (``TrainingLossNaN`` already alerts on it), but it is not the trigger these
checks wait for: NaN/Inf is about 1 % of SDC outcomes.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .robust import leave_one_out_median

METRICS = ("loss", "grad_norm")
SPREAD = 1.4826  # MAD to standard deviation under a normal
REFRESH = 10  # steps between two measures of a spread


class SdcInputError(ValueError):
    """Records the detector cannot read: says which and why."""


@dataclass(frozen=True)
class Record:
    """One logged training step: the job-wide values (``replica`` None) or one replica's local ones."""

    step: int
    loss: float | None
    grad_norm: float | None = None
    replica: int | None = None
    node: str = ""


@dataclass(frozen=True)
class Config:
    window: int = 8  # steps a disagreement or an excursion must last
    history: int = 200  # steps of residuals the replicas' robust spread is measured over
    min_history: int = 30  # steps of history before any decision
    z: float = 6.0  # the window's mean residual, in spreads / sqrt(window), that flags a replica
    median_z: float = 1.5  # ... with the window's median residual at least this far on the same side
    clip: float = 4.0  # a single step's residual counts at most this many spreads
    trend_window: int = 30  # job-wide values an excursion must last (longer than an ordinary spike)
    trend_history: int = 50  # job-wide values the level and spread are measured over, before them
    trend_k: float = 4.0  # spreads above the level every value of the window must be
    keep_ratio: float = 0.7  # the median of the window's last third keeps this share of its first's
    floor: float = 1e-3  # least spread (log units): a perfectly quiet series is not infinitely sure


@dataclass(frozen=True)
class Suspect:
    replica: int
    node: str
    metric: str
    score: float  # the window's mean residual x sqrt(window), in robust spreads
    step: int  # the step it was first named at
    median: float = 0.0  # the window's median residual, in spreads (unclipped)

    def as_dict(self) -> dict[str, object]:
        return {
            "replica": self.replica,
            "node": self.node,
            "metric": self.metric,
            "score": round(self.score, 2),
            "step": self.step,
        }


@dataclass
class Verdict:
    job: str
    flagged: bool = False
    step: int | None = None  # the step the job was first flagged at
    reason: str = ""  # replicas_disagree, job_trend or nonfinite_loss
    suspects: list[Suspect] = field(default_factory=list)
    steps: int = 0  # steps read
    replicas: int = 0  # most replicas seen at one step
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "job": self.job,
            "flagged": self.flagged,
            "step": self.step,
            "reason": self.reason,
            "suspects": [s.as_dict() for s in self.suspects],
            "steps": self.steps,
            "replicas": self.replicas,
            "notes": self.notes,
        }


def winsorised_spread(residuals: np.ndarray, cap: float = 4.0) -> float:
    """The residuals' standard deviation with each capped at ``cap`` robust spreads (1.4826 MAD): a bad
    batch's step cannot inflate it, and unlike the MAD alone it is not fooled by the leave-one-out
    residuals' shape (the middle replicas' residuals pair up near 0, the outer ones' do not)."""
    mad = SPREAD * float(np.median(np.abs(residuals)))
    capped = np.clip(residuals, -cap * mad, cap * mad)
    return float(np.sqrt(np.mean(capped**2)))


def check_record(record: object, index: int) -> Record:
    """The record, or SdcInputError naming what is wrong with it."""
    if not isinstance(record, Record):
        raise SdcInputError(f"record {index}: expected a Record, got {type(record).__name__}")
    if isinstance(record.step, bool) or not isinstance(record.step, int) or record.step < 0:
        raise SdcInputError(f"record {index}: step {record.step!r} is not a non-negative integer")
    for name in METRICS:
        value = getattr(record, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise SdcInputError(f"record {index} (step {record.step}): {name} {value!r} is not a number")
    if record.replica is not None and (not isinstance(record.replica, int) or record.replica < 0):
        raise SdcInputError(f"record {index} (step {record.step}): replica {record.replica!r} is not >= 0")
    return record


def by_step(records: list[Record]) -> list[tuple[int, list[Record]]]:
    """The records grouped by step, in step order (a job may log them out of order across files)."""
    steps: dict[int, list[Record]] = {}
    for index, record in enumerate(records):
        checked = check_record(record, index)
        steps.setdefault(checked.step, []).append(checked)
    return sorted(steps.items())


def detect(records: list[Record], job: str = "", config: Config | None = None) -> Verdict:
    """The verdict over a job's records: flagged at the first step a check fires (or not at all)."""
    if not isinstance(records, list | tuple):
        raise SdcInputError(f"expected a list of records, got {type(records).__name__}")
    if not records:
        raise SdcInputError(f"job {job or '?'}: no training records (is the job logging steps?)")
    detector = SdcDetector(job, config or Config())
    for step, group in by_step(list(records)):
        if detector.add(step, group):
            break
    return detector.verdict()


def _combined(windows: list[dict[int, list[float]]], clip: float) -> dict[int, list[float]]:
    """Per replica in every window, its residuals of all metrics summed per step over sqrt(metrics)
    (Stouffer's sum: one unit of spread again under no fault). Each is clipped first (the check's
    clip), so one metric's spike cannot carry it. A fault that moves the loss and the gradient norm
    a little each shows sooner in the sum than in either."""
    common = set.intersection(*(set(w) for w in windows))
    root = math.sqrt(len(windows))
    return {
        replica: [
            sum(min(max(v, -clip), clip) for v in values) / root
            for values in zip(*(w[replica] for w in windows), strict=True)
        ]
        for replica in sorted(common)
    }


class SdcDetector:
    """The streaming form: ``add`` one step's records at a time; True once the job is flagged."""

    def __init__(self, job: str = "", config: Config | None = None) -> None:
        self.config = config or Config()
        self.result = Verdict(job=job)
        keep = self.config.history + self.config.window
        # Per metric: per step, {replica: residual} and the replicas' nodes; job-wide log values.
        self.residuals = {m: deque(maxlen=keep) for m in METRICS}
        self.trend = {m: deque(maxlen=self.config.trend_history + self.config.trend_window) for m in METRICS}
        self.nodes: dict[int, str] = {}
        self.spreads: dict[str, float] = {}
        self.levels: dict[str, tuple[float, float]] = {}
        self.age: dict[str, int] = {}

    def verdict(self) -> Verdict:
        return self.result

    def add(self, step: int, records: list[Record]) -> bool:
        result = self.result
        if result.flagged:
            return True
        result.steps += 1
        replicas = {r.replica: r for r in records if r.replica is not None}
        whole = [r for r in records if r.replica is None]
        result.replicas = max(result.replicas, len(replicas))
        if len(replicas) == 2 and not result.notes:
            result.notes.append("two replicas: a disagreement cannot say which is odd; job trend only")
        for record in replicas.values():
            if record.node:
                self.nodes[record.replica] = record.node
        if any(r.loss is not None and not math.isfinite(r.loss) for r in records):
            return self._flag(step, "nonfinite_loss", [])
        suspects = self._replica_check(step, replicas)
        if suspects:
            return self._flag(step, "replicas_disagree", suspects)
        if self._trend_check(whole, replicas):
            return self._flag(step, "job_trend", [])
        return False

    def _flag(self, step: int, reason: str, suspects: list[Suspect]) -> bool:
        self.result.flagged, self.result.step, self.result.reason = True, step, reason
        self.result.suspects = suspects
        return True

    # ------------------------------------------------------------------------------- replicas
    def _replica_check(self, step: int, replicas: dict[int, Record]) -> list[Suspect]:
        windows: dict[str, dict[int, list[float]]] = {}
        for metric in METRICS:
            values = {k: getattr(r, metric) for k, r in replicas.items()}
            values = {k: v for k, v in values.items() if v is not None and v > 0}
            if len(values) < 3:
                continue  # two replicas disagree with each other: neither is the odd one
            keys = sorted(values)
            logs = np.log(np.array([values[k] for k in keys], dtype=float))
            residual = logs - leave_one_out_median(logs)
            self.residuals[metric].append(dict(zip(keys, residual.tolist(), strict=True)))
            window = self._window(metric)
            if window:
                windows[metric] = window
        suspects = [s for metric, window in windows.items() for s in self._suspects(step, metric, window)]
        if len(windows) == len(METRICS):
            suspects += self._suspects(
                step, "+".join(METRICS), _combined(list(windows.values()), self.config.clip)
            )
        if not any(self._crossed(s) for s in suspects):
            return []
        # The odd one out is the replica furthest out by its unclipped median, crossed or not: it drags
        # the others' reference, so they lean the other way (with three replicas by half as much) and may
        # cross first; they are not suspects. Others that crossed on its side are.
        top = max(suspects, key=lambda s: abs(s.median))
        named: dict[int, Suspect] = {top.replica: top}
        for suspect in sorted(suspects, key=lambda s: -abs(s.median)):
            if self._crossed(suspect) and suspect.median * top.median > 0 and suspect.replica not in named:
                named[suspect.replica] = suspect
        return list(named.values())

    def _window(self, metric: str) -> dict[int, list[float]]:
        """Per replica present at each of the last ``window`` steps, its residuals there in spreads."""
        cfg = self.config
        history = list(self.residuals[metric])
        if len(history) < cfg.min_history + cfg.window:
            return {}
        recent = history[-cfg.window :]
        spread = self._spread(metric, history[: -cfg.window])
        return {
            replica: [row[replica] / spread for row in recent]
            for replica in recent[-1]
            if all(replica in row for row in recent)
        }

    def _suspects(self, step: int, metric: str, window: dict[int, list[float]]) -> list[Suspect]:
        cfg = self.config
        found = []
        for replica, raw in window.items():
            score = sum(min(max(z, -cfg.clip), cfg.clip) for z in raw) / math.sqrt(cfg.window)
            median = statistics.median(raw)
            found.append(Suspect(replica, self.nodes.get(replica, ""), metric, score, step, median))
        return found

    def _crossed(self, suspect: Suspect) -> bool:
        cfg = self.config
        score, median = suspect.score, suspect.median
        return abs(score) >= cfg.z and abs(median) >= cfg.median_z and score * median > 0

    def _spread(self, metric: str, reference: list[dict[int, float]]) -> float:
        """The residuals' spread over the reference steps, measured again every ``REFRESH`` steps (it
        moves slowly; measuring it every step was most of the check's cost)."""
        self.age[metric] = self.age.get(metric, 0) + 1
        if metric not in self.spreads or self.age[metric] >= REFRESH:
            pooled = np.array([v for row in reference for v in row.values()])
            self.spreads[metric] = max(winsorised_spread(pooled), self.config.floor)
            self.age[metric] = 0
        return self.spreads[metric]

    # ------------------------------------------------------------------------------- job trend
    def _trend_check(self, whole: list[Record], replicas: dict[int, Record]) -> bool:
        cfg = self.config
        for metric in METRICS:
            values = [getattr(r, metric) for r in whole]
            if not values:  # no job-wide line this step: the replicas' mean is the job's
                values = [getattr(r, metric) for r in replicas.values()]
                values = [float(np.mean(values))] if values and None not in values else []
            values = [v for v in values if v is not None and v > 0]
            if not values:
                continue
            series = self.trend[metric]
            series.append(math.log(values[0]))
            if len(series) < cfg.min_history + cfg.trend_window:
                continue
            ordered = list(series)
            level, spread = self._level(metric, ordered[: -cfg.trend_window])
            excess = (np.array(ordered[-cfg.trend_window :]) - level) / spread
            if excess.min() < cfg.trend_k:
                continue
            third = max(1, cfg.trend_window // 3)
            first, last = float(np.median(excess[:third])), float(np.median(excess[-third:]))
            if last >= cfg.keep_ratio * first:  # an ordinary spike decays; corruption stays
                return True
        return False

    def _level(self, metric: str, reference: list[float]) -> tuple[float, float]:
        """The job-wide series' level (median) and robust spread, measured again every REFRESH steps."""
        key = f"trend:{metric}"
        self.age[key] = self.age.get(key, 0) + 1
        if key not in self.levels or self.age[key] >= REFRESH:
            values = np.array(reference)
            level = float(np.median(values))
            spread = max(SPREAD * float(np.median(np.abs(values - level))), self.config.floor)
            self.levels[key], self.age[key] = (level, spread), 0
        return self.levels[key]
