"""A job's own pace from its training logs: how much slower it runs than its own recent healthy pace, the
GPU-hours that has cost, and the straggler no GPU signal shows (a slow host, a slow NIC).

Pure: records in (anomaly/pace_records.py), a verdict out. Per step the job's step time is the ranks'
median; where ranks split their step (``data_ms``, ``compute_ms``, ``comm_ms``) the split says why:

- **Slowdown**: the median step time over the last ``window`` steps against the job's healthy pace, the
  fastest median of the non-overlapping ``window``-step blocks before them since the job last changed
  its nodes. Medians: a checkpoint, an evaluation or one rank's long step moves one step, not a median.
- **GPU-hours lost**: over every window whose pace is ``min_slowdown`` above the healthy one, the extra
  time per step x the job's GPUs (its nodes x ``gpus_per_node``).
- **Where it went**: in a synchronous all-reduce no rank leaves before the last one enters, so a rank's
  ``comm_ms`` is its wait for the last arrival (``latest (data + compute) - own``) plus the transfer.
  The transfer (``comm_ms`` less that wait) is the rank's own communication. A rank whose ``data_ms``
  stands out from its peers' keeps them all waiting: cause ``host`` (its data loader or CPU). A rank
  whose own transfer stands out: cause ``communication`` on its node. Every rank's transfer up from
  the healthy blocks' with nobody late: cause ``communication`` with no node (a ring is paced by its
  slowest link, which every rank waits on alike). A rank whose ``compute_ms`` stands out is reported
  (``compute``) but not flagged: that is the GPU signal's to judge (anomaly/detector.py), and training
  moves compute between nodes by design (MoE routing).

"Stands out": its window median of the per-step excess over the ranks' median is at least ``min_share``
of the step and ``z`` robust spreads of the ranks' excesses. Without split keys the job's slowdown and
cost are still measured; without step times it is unknown, and nothing is flagged.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from .pace_records import PaceRecord

SPREAD = 1.4826  # MAD to standard deviation under a normal
CAUSES = ("host", "communication")


@dataclass(frozen=True)
class PaceConfig:
    window: int = 30  # steps of a median: the recent pace, and each healthy block's
    min_blocks: int = 1  # healthy blocks needed before a slowdown is measured
    min_slowdown: float = 0.03  # a window this much slower than healthy counts as slow
    min_share: float = 0.03  # a rank's excess must be this share of the healthy step to stand out
    z: float = 6.0  # ... and this many robust spreads of the ranks' excesses
    min_ranks: int = 3  # ranks needed to tell one from its peers
    gpus_per_node: int = 8
    stride: int = 5  # steps between two evaluations of the scan


@dataclass(frozen=True)
class Straggler:
    node: str
    replica: int | None
    cause: str  # host, communication or compute (compute: reported, never flagged)
    excess_ms: float  # its window-median excess over the ranks' median
    step: int  # the step it was first named at, in this episode

    def as_dict(self) -> dict[str, object]:
        return {
            "node": self.node,
            "replica": self.replica,
            "cause": self.cause,
            "excess_ms": round(self.excess_ms, 1),
            "step": self.step,
        }


@dataclass
class PaceVerdict:
    job: str
    status: str = "unknown"  # unknown, ok, slow, straggler
    reason: str = ""
    steps: int = 0
    first_step: int = 0  # the first step measured (since the job last changed its nodes)
    ranks: int = 0
    gpus: int = 0
    step_ms: float | None = None  # the last window's median
    healthy_ms: float | None = None
    slowdown_ratio: float | None = None
    gpu_hours_lost: float = 0.0
    lost_by_step: dict[int, float] = field(default_factory=dict)  # GPU-hours per evaluated window end
    straggler: Straggler | None = None  # flagged now (host or communication)
    compute_outlier: Straggler | None = None  # reported only
    first_flag_step: int | None = None  # the first step any straggler was flagged at, in the records
    episodes: list[Straggler] = field(default_factory=list)  # each flagged episode, as it began

    @property
    def flagged(self) -> bool:
        return self.straggler is not None

    @property
    def flag_steps(self) -> list[int]:
        return [e.step for e in self.episodes]

    def as_dict(self) -> dict[str, object]:
        def r(value: float | None, digits: int = 1) -> float | None:
            return None if value is None else round(value, digits)

        return {
            "job": self.job,
            "status": self.status,
            "reason": self.reason,
            "flagged": self.flagged,
            "steps": self.steps,
            "ranks": self.ranks,
            "gpus": self.gpus,
            "step_ms": r(self.step_ms),
            "healthy_step_ms": r(self.healthy_ms),
            "slowdown_ratio": r(self.slowdown_ratio, 4),
            "gpu_hours_lost": round(self.gpu_hours_lost, 3),
            "straggler": None if self.straggler is None else self.straggler.as_dict(),
            "compute_outlier": None if self.compute_outlier is None else self.compute_outlier.as_dict(),
            "first_flag_step": self.first_flag_step,
        }


def _segment(records: list[PaceRecord]) -> list[PaceRecord]:
    """The records since the job last ran on other nodes (a requeue or resize: a new healthy pace)."""
    placed: dict[int, dict[int, str]] = {}
    for rec in records:
        if rec.replica is not None:
            placed.setdefault(rec.step, {})[rec.replica] = rec.node
    start, current = 0, None
    for step in sorted(placed):
        ranks = placed[step]
        if set(ranks) != set(range(len(ranks))):
            continue  # a step with lines missing (a lost line, the window's edge) says nothing
        signature = frozenset(ranks.items())
        if current is not None and signature != current:
            start = step
        current = signature
    return [r for r in records if r.step >= start]


def _window_medians(values: np.ndarray, ends: np.ndarray, w: int) -> np.ndarray:
    """The median of the ``w`` steps ending at each of ``ends``: (ends,) for a series, (ends, ranks) for
    a matrix; in chunks, so a large job's windows never sit in memory all at once."""
    views = np.lib.stride_tricks.sliding_window_view(values, w, axis=0)  # (steps - w + 1, [ranks,] w)
    out = []
    for chunk in range(0, len(ends), 256):
        part = views[ends[chunk : chunk + 256] - w + 1]
        if np.isnan(part).any():
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN rank: no lines from it
                out.append(np.nanmedian(part, axis=-1))
        else:
            out.append(np.median(part, axis=-1))
    return np.concatenate(out)


def _outliers(med: np.ndarray, threshold: np.ndarray, z: float) -> tuple[np.ndarray, np.ndarray]:
    """Per window (row of ``med``: each rank's window-median excess), the rank that stands out (-1:
    none) and its excess: the largest, at least ``threshold`` and ``z`` robust spreads of the others."""
    filled = np.where(np.isfinite(med), med, -np.inf)
    rank = np.argmax(filled, axis=1)
    top = filled[np.arange(len(med)), rank]
    others = np.sort(filled, axis=1)[:, :-1]
    others = np.where(np.isfinite(others), others, np.nan)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        centre = np.nanmedian(others, axis=1, keepdims=True)
        spread = SPREAD * np.nanmedian(np.abs(others - centre), axis=1)
    spread = np.nan_to_num(spread, nan=0.0)
    ok = np.isfinite(top) & (top >= np.maximum(threshold, z * spread))
    return np.where(ok, rank, -1), np.where(ok, top, 0.0)


def detect(records: list[PaceRecord], job: str, config: PaceConfig | None = None) -> PaceVerdict:
    """The job's pace verdict from its records (any order; one per step and rank)."""
    cfg = config or PaceConfig()
    verdict = PaceVerdict(job)
    timed = [r for r in records if r.step_ms is not None]
    if not timed:
        verdict.reason = "no step times in the job's lines"
        return verdict
    timed = _segment(sorted(timed, key=lambda r: r.step))
    ranked = [r for r in timed if r.replica is not None]
    rows = ranked or timed  # job-wide lines (Megatron's) where no rank logs its own
    steps = sorted({r.step for r in rows})
    verdict.first_step = steps[0]
    replicas = sorted({-1 if r.replica is None else r.replica for r in rows})
    where = {s: i for i, s in enumerate(steps)}
    col = {q: j for j, q in enumerate(replicas)}
    shape = (len(steps), len(replicas))
    took, data, compute, comm = (np.full(shape, np.nan) for _ in range(4))
    nodes: dict[int, str] = {}
    for rec in rows:
        i, j = where[rec.step], col[-1 if rec.replica is None else rec.replica]
        took[i, j] = rec.step_ms
        if rec.split:
            data[i, j], compute[i, j], comm[i, j] = rec.data_ms, rec.compute_ms, rec.comm_ms
        nodes[j] = rec.node
    verdict.steps, verdict.ranks = len(steps), len(replicas) if ranked else 0
    logging = len({n for n in nodes.values() if n} or {""})
    if not ranked:  # job-wide lines: as many nodes as logged a step (every rank prints the line)
        logging = max(logging, max(r.hosts for r in rows))
    verdict.gpus = logging * cfg.gpus_per_node
    step_ms = np.nanmedian(took, axis=1)
    arrive = data + compute
    split = bool(ranked) and np.isfinite(arrive).any()
    peers = split and len(replicas) >= cfg.min_ranks  # enough ranks to tell one from the others
    if split:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a step no rank split: all-NaN, stays NaN
            own = comm - (np.nanmax(arrive, axis=1, keepdims=True) - arrive)  # comm less the peers' wait
            transfer = np.nanmedian(own, axis=1)
            # Per step, each rank's excess over the ranks' median: what "stands out" is judged on.
            excesses = tuple(v - np.nanmedian(v, axis=1, keepdims=True) for v in (data, own, compute))
    else:
        transfer = np.full(len(steps), np.nan)
    w = cfg.window
    if len(steps) < w:
        verdict.reason = f"{len(steps)} steps: fewer than a window ({w})"
        return verdict
    ends = np.arange(w - 1, len(steps), cfg.stride)
    if ends[-1] != len(steps) - 1:
        ends = np.append(ends, len(steps) - 1)
    # A window's healthy pace: the fastest w-step block wholly before it (blocks [0, lo // w)).
    blocks = np.arange(w - 1, (len(steps) // w) * w, w)
    block_pace = np.minimum.accumulate(_window_medians(step_ms, blocks, w)) if len(blocks) else blocks
    before = (ends - w + 1) // w
    known = before >= max(cfg.min_blocks, 1)
    healthy = np.where(known, block_pace[np.maximum(before - 1, 0)] if len(blocks) else np.nan, np.nan)
    pace = _window_medians(step_ms, ends, w)
    slowdown = pace / healthy - 1.0
    cause = np.full(len(ends), "", dtype=object)
    who = np.full(len(ends), -1)
    excess = np.zeros(len(ends))
    compute_who, compute_excess = who.copy(), excess.copy()
    if split:
        threshold = cfg.min_share * np.where(known, healthy, pace)
        data_ex, own_ex, compute_ex = (_window_medians(x, ends, w) for x in excesses)
        none = (np.full(len(ends), -1), np.zeros(len(ends)))
        compute_who, compute_excess = _outliers(compute_ex, threshold, cfg.z) if peers else none
        nic_who, nic_excess = _outliers(own_ex, threshold, cfg.z) if peers else none
        host_who, host_excess = _outliers(data_ex, threshold, cfg.z) if peers else none
        block_transfer = (
            np.minimum.accumulate(_window_medians(transfer, blocks, w)) if len(blocks) else blocks
        )
        healthy_transfer = np.where(
            known, block_transfer[np.maximum(before - 1, 0)] if len(blocks) else 0, np.nan
        )
        ring = _window_medians(transfer, ends, w) - healthy_transfer
        job_comm = known & (slowdown >= cfg.min_slowdown) & (ring >= threshold)
        # The order of the causes: a late host explains everyone's wait; then a rank's own transfer.
        for mask, rank, size, name in (
            (job_comm, np.full(len(ends), -1), ring, "communication"),
            (nic_who >= 0, nic_who, nic_excess, "communication"),
            (host_who >= 0, host_who, host_excess, "host"),
        ):
            cause = np.where(mask, name, cause)
            who, excess = np.where(mask, rank, who), np.where(mask, size, excess)
    slow = known & (slowdown >= cfg.min_slowdown)
    covered = np.diff(np.concatenate(([-1], ends)))
    lost = np.where(slow, (pace - np.nan_to_num(healthy)) * covered * verdict.gpus / 3.6e6, 0.0)
    verdict.gpu_hours_lost = float(lost.sum())
    verdict.lost_by_step = {steps[e]: float(h) for e, h in zip(ends, lost, strict=True) if h > 0}
    was: tuple[str, str] | None = None
    for k, end in enumerate(ends):
        flagged = bool(cause[k])
        j = int(who[k])
        node, replica = (nodes.get(j, ""), replicas[j]) if j >= 0 else ("", None)
        if flagged and was != (node, cause[k]):
            verdict.straggler = Straggler(node, replica, str(cause[k]), float(excess[k]), steps[end])
            verdict.episodes.append(verdict.straggler)  # a new episode
        elif flagged and verdict.straggler is not None:
            verdict.straggler = Straggler(
                node, replica, str(cause[k]), float(excess[k]), verdict.straggler.step
            )
        else:
            verdict.straggler = None
        was = (node, str(cause[k])) if flagged else None
    if verdict.episodes:
        verdict.first_flag_step = verdict.episodes[0].step
    if compute_who[-1] >= 0:
        j = int(compute_who[-1])
        verdict.compute_outlier = Straggler(
            nodes.get(j, ""), replicas[j], "compute", float(compute_excess[-1]), steps[ends[-1]]
        )
    last_healthy = float(healthy[-1])
    verdict.step_ms = float(pace[-1])
    verdict.healthy_ms = last_healthy if np.isfinite(last_healthy) else None
    verdict.slowdown_ratio = float(slowdown[-1]) if np.isfinite(slowdown[-1]) else None
    if verdict.straggler is not None:
        verdict.status, verdict.reason = "straggler", f"{verdict.straggler.cause} straggler"
    elif verdict.slowdown_ratio is None:
        verdict.status, verdict.reason = "unknown", "no healthy block before the last window yet"
    elif verdict.slowdown_ratio >= cfg.min_slowdown:
        verdict.status, verdict.reason = "slow", "slower than its healthy pace; no straggler named"
    else:
        verdict.status = "ok"
    if not split and verdict.status in ("ok", "slow"):
        verdict.reason = (verdict.reason + "; " if verdict.reason else "") + "no per-rank split keys"
    return verdict
