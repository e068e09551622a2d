"""Each job's training documents in the training watch's window, kept between cycles so that a cycle reads
only what was indexed since the last one ("central cost follows events", docs/anomaly.md).

A job's first read takes its whole window (6 h by default) from the log store; later reads ask only for
the documents whose ``event.ingested`` (set by the ingest pipelines when a line becomes a document) is at
most ``margin_s`` older than the newest one already kept, merge them by document id, and drop what left
the window (``@timestamp`` older than the window's start). A line that arrives late (a Kafka or
Logstash outage) carries a late ``event.ingested`` whatever its own time, so it is read when it comes; the
margin covers the index refresh and the ingest nodes' clocks. A job with a document that lacks
``event.ingested`` (indexed outside the pipelines) is read whole every cycle, as is every job each
``full_every`` cycles, which bounds what any surprise could hide; and a job whose documents would take the
kept total past ``max_kept`` is not kept (read whole each cycle: memory stays bounded). The result is
what a whole read returns: the same documents in the store's order (step, time, host).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fleetsight.durations import instant, seconds

from .sdc_source import LogStore

INGESTED_MARGIN_S = 120.0
FULL_EVERY = 12  # cycles: a whole read of every job each hour at the watch's 5-minute interval
# Documents kept between cycles, all jobs together (~1-1.5 KB of memory each as parsed JSON): a job whose
# window would pass the bound is read whole each cycle and not kept, as before this module.
MAX_KEPT = 1_000_000


@dataclass
class JobWindow:
    documents: dict[str, dict[str, Any]]  # _id -> _source
    newest_ingested: float | None  # unix seconds; None: some document has no event.ingested
    reads: int = 0  # reads since the last whole one


@dataclass
class WindowReader:
    store: LogStore
    since: str = "6h"
    margin_s: float = INGESTED_MARGIN_S
    full_every: int = FULL_EVERY
    max_kept: int = MAX_KEPT
    jobs: dict[str, JobWindow] = field(default_factory=dict)
    # Documents the store sent, all jobs and cycles, by kind of read (a job's whole window, or only
    # what was indexed since the last read).
    documents_read: dict[str, int] = field(default_factory=lambda: {"whole": 0, "partial": 0})
    kept_total: int = 0  # documents in ``jobs``, all together (kept as a sum: a cycle reads every job)

    def read(self, job: str, now: float | None = None) -> list[dict[str, Any]]:
        """The job's documents in the window (``_source``), in the store's order."""
        now = time.time() if now is None else now
        kept = self.jobs.get(job)
        newest = kept.newest_ingested if kept is not None and kept.reads < self.full_every else None
        if kept is not None and newest is not None:
            fresh = self.store.documents(job, self.since, newest - self.margin_s)
            documents, reads, kind = dict(kept.documents), kept.reads + 1, "partial"
        else:
            fresh = self.store.documents(job, self.since)
            documents, reads, kind = {}, 0, "whole"
        self.documents_read[kind] += len(fresh)
        documents.update(fresh)
        documents = in_window(documents, now - seconds(self.since))
        self._forget(job)
        if self.kept_total + len(documents) <= self.max_kept:
            self.jobs[job] = JobWindow(documents, newest_ingested(documents.values()), reads)
            self.kept_total += len(documents)
        return in_store_order(documents.values())

    def _forget(self, job: str) -> None:
        gone = self.jobs.pop(job, None)
        if gone is not None:
            self.kept_total -= len(gone.documents)

    def keep_only(self, jobs: Iterable[str]) -> None:
        """Forget the jobs that left the window."""
        wanted = set(jobs)
        for job in [name for name in self.jobs if name not in wanted]:
            self._forget(job)


def unix(value: Any) -> float | None:
    """An ISO-8601 date as the store returns it (``2026-11-21T10:00:00.000Z``), or epoch millis."""
    if isinstance(value, int | float):
        return float(value) / 1000.0
    if not isinstance(value, str) or not value:
        return None
    try:
        return instant(value).timestamp()
    except ValueError:
        return None


def number(value: Any) -> float:
    """A step as a sort key (the store may hand a number back as a string); unreadable ones last."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("inf")


def ingested_of(source: dict[str, Any]) -> float | None:
    event = source.get("event")
    return unix(event.get("ingested")) if isinstance(event, dict) else None


def newest_ingested(sources: Iterable[dict[str, Any]]) -> float | None:
    newest: float | None = None
    for source in sources:
        moment = ingested_of(source)
        if moment is None:
            return None  # a document the pipelines did not index: read this job whole
        newest = moment if newest is None else max(newest, moment)
    return newest


def in_window(documents: dict[str, dict[str, Any]], start: float) -> dict[str, dict[str, Any]]:
    """The documents whose own time is at or after the window's start (an unreadable time is kept:
    the store's window filter let it in)."""
    kept = {}
    for key, source in documents.items():
        moment = unix(source.get("@timestamp"))
        if moment is None or moment >= start:
            kept[key] = source
    return kept


def in_store_order(sources: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The log store's sort: training step, then time, then host."""

    def key(source: dict[str, Any]) -> tuple[float, float, str]:
        training = source.get("training")
        step = training.get("step") if isinstance(training, dict) else None
        host = source.get("host")
        name = host.get("name") if isinstance(host, dict) else None
        moment = unix(source.get("@timestamp"))
        return (
            number(step),
            moment if moment is not None else float("inf"),
            str(name or ""),
        )

    return sorted(sources, key=key)
