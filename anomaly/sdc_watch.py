"""The silent-corruption check as a small service: every cycle, each job that logged training steps in the
window is read from the log store and checked (anomaly/sdc.py); /metrics publishes the flags, which
``TrainingSilentCorruptionSuspected`` (rules/source/training.yml) turns into a warning. A suspect is
evidence for a memory-pattern check of its node, never a drain (health/policy.yml: degraded).

Each cycle checks the window afresh (no state across cycles): a flag lasts while the steps that raised it
are in the window.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .sdc import Config, SdcInputError, Verdict, detect
from .sdc_source import LogStore, SourceError

log = logging.getLogger("anomaly.sdc")


@dataclass
class SdcWatch:
    store: LogStore
    since: str = "6h"
    config: Config = field(default_factory=Config)
    verdicts: list[Verdict] = field(default_factory=list)
    up: bool = False
    cycles: int = 0
    errors: int = 0
    last_cycle: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def cycle(self) -> list[Verdict]:
        """Check every job with steps in the window; a job whose records are unreadable is skipped (and
        logged), a store that cannot be read fails the cycle and keeps the last verdicts."""
        try:
            verdicts = []
            for job in self.store.jobs(self.since):
                try:
                    verdicts.append(detect(self.store.records(job, self.since), job, self.config))
                except SdcInputError as exc:
                    log.warning("job %s: records skipped: %s", job, exc)
        except SourceError as exc:
            with self.lock:
                self.up, self.errors = False, self.errors + 1
            log.error("sdc cycle failed: %s", exc)
            return []
        with self.lock:
            self.verdicts, self.up = verdicts, True
            self.cycles, self.last_cycle = self.cycles + 1, time.time()
        for verdict in verdicts:
            if verdict.flagged:
                log.info("sdc flag: %s", verdict.as_dict())
        return verdicts


class SdcCollector(Collector):
    """The flags of the last cycle; a job that is no longer flagged (or left the window) vanishes."""

    def __init__(self, watch: SdcWatch) -> None:
        self.watch = watch

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        w = self.watch
        with w.lock:
            verdicts, up, cycles, errors, last = list(w.verdicts), w.up, w.cycles, w.errors, w.last_cycle
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
        yield CounterMetricFamily(
            "fleetsight_training_sdc_cycle_errors",
            "Cycles failed: the log store could not be read.",
            value=errors,
        )
        yield GaugeMetricFamily(
            "fleetsight_training_sdc_last_cycle_timestamp_seconds", "End of the last cycle.", value=last
        )
