"""The training watch, a small service: every cycle, each job that logged training steps in the window is
read once from the log store and checked twice, for silent corruption (anomaly/sdc.py) and for its own
pace (anomaly/pace.py); /metrics publishes both.

- Silent corruption: ``TrainingSilentCorruptionSuspected`` (rules/source/training.yml) turns the flags
  into a warning. A suspect is evidence for a memory-pattern check of its node, never a drain
  (health/policy.yml: degraded).
- Pace: per job its slowdown against its own healthy pace, the GPU-hours that cost, and the straggler
  no GPU signal shows (cause ``host`` or ``communication``).

Each cycle checks the window afresh: a flag lasts while the steps that raised it are in the window. The
documents are kept between cycles (anomaly/sdc_window.py): a cycle reads from the store only what was
indexed since the last one. The GPU-hours lost are kept too (a counter: steps that leave the window keep
what they cost).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .pace import PaceConfig, PaceVerdict
from .pace import detect as pace_detect
from .pace_records import PaceInputError
from .pace_records import from_documents as pace_documents
from .sdc import Config, SdcInputError, Verdict, detect
from .sdc_source import JobReadError, LogStore, SourceError
from .sdc_window import WindowReader

log = logging.getLogger("anomaly.sdc")


@dataclass
class SdcWatch:
    store: LogStore
    since: str = "6h"
    config: Config = field(default_factory=Config)
    verdicts: list[Verdict] = field(default_factory=list)
    pace_config: PaceConfig = field(default_factory=PaceConfig)
    paces: list[PaceVerdict] = field(default_factory=list)
    # Per job: GPU-hours per window end still in the window (recomputed each cycle), and those of the
    # steps that left it (kept as they were).
    lost: dict[str, dict[int, float]] = field(default_factory=dict)
    lost_before: dict[str, float] = field(default_factory=dict)
    up: bool = False
    cycles: int = 0
    errors: int = 0
    last_cycle: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)
    reader: WindowReader = field(init=False)

    def __post_init__(self) -> None:
        self.reader = WindowReader(self.store, self.since)

    def cycle(self) -> list[Verdict]:
        """Check every job with steps in the window; a job whose records are unreadable is skipped (and
        logged), a store that cannot be read fails the cycle and keeps the last verdicts."""
        try:
            verdicts, paces = [], []
            jobs = self.store.jobs(self.since)
            self.reader.keep_only(jobs)
            for job in jobs:
                try:
                    sources = self.reader.read(job)
                except JobReadError as exc:  # that job unknown this cycle, not the whole watch blind
                    log.warning("job %s: documents not read: %s", job, exc)
                    continue
                try:
                    verdicts.append(detect(self.store.to_records(job, sources), job, self.config))
                except (SdcInputError, SourceError) as exc:
                    log.warning("job %s: records skipped: %s", job, exc)
                try:
                    paces.append(pace_detect(pace_documents(sources), job, self.pace_config))
                except PaceInputError as exc:
                    log.warning("job %s: pace records skipped: %s", job, exc)
        except SourceError as exc:
            with self.lock:
                self.up, self.errors = False, self.errors + 1
            log.error("sdc cycle failed: %s", exc)
            return []
        with self.lock:
            self.verdicts, self.paces, self.up = verdicts, paces, True
            self._keep_lost(paces)
            self.cycles, self.last_cycle = self.cycles + 1, time.time()
        for verdict in verdicts:
            if verdict.flagged:
                log.info("sdc flag: %s", verdict.as_dict())
        for pace in paces:
            if pace.flagged:
                log.info("pace straggler: %s", pace.as_dict())
        return verdicts

    def _keep_lost(self, paces: list[PaceVerdict]) -> None:
        """Fold the GPU-hours of steps that left the window into the job's kept total; forget jobs that
        left it (their counter ends with them)."""
        lost, before = {}, {}
        for pace in paces:
            kept = self.lost.get(pace.job, {})
            gone = sum(h for step, h in kept.items() if step < pace.first_step)
            before[pace.job] = self.lost_before.get(pace.job, 0.0) + gone
            lost[pace.job] = dict(pace.lost_by_step)  # the steps still in the window: measured afresh
        self.lost, self.lost_before = lost, before


class SdcCollector(Collector):
    """The flags of the last cycle; a job that is no longer flagged (or left the window) vanishes."""

    def __init__(self, watch: SdcWatch) -> None:
        self.watch = watch

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        w = self.watch
        with w.lock:
            verdicts, up, cycles, errors, last = list(w.verdicts), w.up, w.cycles, w.errors, w.last_cycle
            paces = list(w.paces)
            reads = dict(w.reader.documents_read)
            lost = {job: w.lost_before.get(job, 0.0) + sum(hours.values()) for job, hours in w.lost.items()}
        yield from _pace_families(paces, lost)
        suspect = GaugeMetricFamily(
            "fleetsight_training_sdc_suspect",
            "1 while a data-parallel replica of a job disagrees persistently with the others (possible "
            "silent data corruption on the node that logs it).",
            labels=["hpc_job", "node", "replica", "metric"],
        )
        flagged = GaugeMetricFamily(
            "fleetsight_training_sdc_flagged",
            "1 while a job's training updates look silently corrupt, with the check that saw it.",
            labels=["hpc_job", "reason"],
        )
        for verdict in verdicts:
            if not verdict.flagged:
                continue
            flagged.add_metric([verdict.job, verdict.reason], 1.0)
            for s in verdict.suspects:
                suspect.add_metric([verdict.job, s.node, str(s.replica), s.metric], 1.0)
        yield suspect
        yield flagged
        yield GaugeMetricFamily(
            "fleetsight_training_sdc_jobs", "Jobs checked in the last cycle.", value=len(verdicts)
        )
        yield GaugeMetricFamily(
            "fleetsight_training_sdc_source_up", "1 when the last cycle read the log store.", value=float(up)
        )
        yield CounterMetricFamily("fleetsight_training_sdc_cycles", "Cycles completed.", value=cycles)
        read = CounterMetricFamily(
            "fleetsight_training_sdc_documents_read",
            "Training documents the log store sent, by kind of read: whole (a job's whole window) or "
            "partial (only what was indexed since the last cycle).",
            labels=["read"],
        )
        read.add_metric(["whole"], float(reads["whole"]))
        read.add_metric(["partial"], float(reads["partial"]))
        yield read
        yield CounterMetricFamily(
            "fleetsight_training_sdc_cycle_errors",
            "Cycles failed: the log store could not be read.",
            value=errors,
        )
        yield GaugeMetricFamily(
            "fleetsight_training_sdc_last_cycle_timestamp_seconds", "End of the last cycle.", value=last
        )


def _pace_families(paces: list[PaceVerdict], lost: dict[str, float]) -> Iterator[GaugeMetricFamily]:
    """The pace check's series: a job whose pace is unknown (no step times yet, no healthy block)
    publishes no ratio; a straggler only while it is flagged."""
    ratio = GaugeMetricFamily(
        "fleetsight_job_pace_slowdown_ratio",
        "The job's step time over its last window against its own healthy pace, minus 1 (0.1: 10 % slower).",
        labels=["hpc_job"],
    )
    hours = CounterMetricFamily(
        "fleetsight_job_pace_gpu_hours_lost",
        "GPU-hours the job has lost to running slower than its own healthy pace (its GPUs x the extra time).",
        labels=["hpc_job"],
    )
    straggler = GaugeMetricFamily(
        "fleetsight_job_pace_straggler",
        "1 while a job's own step timings name a straggler with no GPU signature: cause host (its data "
        "loader or CPU keeps the peers waiting) or communication (node empty: the whole ring is slower).",
        labels=["hpc_job", "node", "cause"],
    )
    for pace in paces:
        if pace.slowdown_ratio is not None:
            ratio.add_metric([pace.job], pace.slowdown_ratio)
        if pace.straggler is not None:
            straggler.add_metric([pace.job, pace.straggler.node, pace.straggler.cause], 1.0)
    for job, value in sorted(lost.items()):
        hours.add_metric([job], value)
    yield ratio
    yield hours  # type: ignore[misc]
    yield straggler
    yield GaugeMetricFamily(
        "fleetsight_job_pace_jobs", "Jobs whose pace the last cycle measured.", value=len(paces)
    )
