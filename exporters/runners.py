"""The runners that drive the exporters' sources and report them through the same
``fleetsight_collector_*`` self-metrics:

- :class:`DeadlineRunner` (the node agent) runs every source's ``gather`` in a worker thread on each
  scrape and waits at most the scrape deadline, so that one slow BMC or a hung NFS read never blocks a
  scrape: a source that misses the deadline is reported (``success`` 0, an error counted with
  ``source="deadline"``) and its result, when it arrives, is used by the next scrape;
- :class:`CachedRunner` (the fabric exporter) gathers in a background loop and renders once; a scrape
  sends the last rendering.

Its own module because scheduling, deadlines and self-metrics change for other reasons than the
sources' contract (exporters/core.py) or the exposition format (exporters/exposition.py).
"""

from __future__ import annotations

import gzip
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from prometheus_client.core import Metric

from .core import Problems, Source, kv
from .exposition import CONST_LABELS, Families, render

log = logging.getLogger("fleetsight.exporters")


@dataclass
class SourceState:
    """What the self-metrics say about one source: its last gather and its errors so far."""

    errors: dict[str, int] = field(default_factory=dict)
    duration_s: float = 0.0
    success: bool = False
    last_success: float = 0.0
    pending: Future | None = None
    pending_since: float = 0.0
    last_logged_problem: str = ""

    def record(self, collector: str, problems: Problems, duration_s: float) -> None:
        """Takes in one finished gather: its duration, its problems (counted, logged when they change)."""
        self.duration_s = duration_s
        for name, count in problems.by_source.items():
            self.errors[name] = self.errors.get(name, 0) + count
        self.success = not problems
        if problems:
            self.log_problem(collector, "error", problems.first)
        else:
            self.last_success = time.time()
            self.last_logged_problem = ""

    def log_problem(self, collector: str, kind: str, detail: str) -> None:
        # Log a problem when it starts or changes, not on every scrape: the counter carries the rate.
        if detail != self.last_logged_problem:
            log.warning(kv(event="collector_problem", collector=collector, kind=kind, detail=detail))
            self.last_logged_problem = detail


def gather_one(source: Source) -> tuple[list[Metric], Problems, float]:
    """Runs one source's gather, turning a crash into a reported problem."""
    problems = Problems()
    started = time.perf_counter()
    try:
        metrics = source.gather(problems)
    except Exception as exc:  # a bug or bad input in one source must not take the exporter down
        log.exception(kv(event="collector_crashed", collector=source.name, error=repr(exc)))
        problems.add("exception", repr(exc))
        metrics = []
    return metrics, problems, time.perf_counter() - started


def self_metrics(states: dict[str, SourceState], prefix: str = "fleetsight") -> list[Metric]:
    """The ``<prefix>_collector_*`` families, the same for every runner (built under the caller's
    constant labels)."""
    f = Families()
    duration = f.gauge(
        f"{prefix}_collector_duration_seconds", "Wall time of the collector's last gather.", ["collector"]
    )
    success = f.gauge(
        f"{prefix}_collector_success",
        "1 when the collector's last gather met no error and its deadline, else 0.",
        ["collector"],
    )
    errors = f.counter(
        f"{prefix}_collector_errors",
        "Errors met by a collector, by source (file, endpoint, deadline, exception).",
        ["collector", "source"],
    )
    last = f.gauge(
        f"{prefix}_collector_last_success_timestamp_seconds",
        "Unix time of the collector's last fully successful gather.",
        ["collector"],
    )
    for name, state in states.items():
        duration.add_metric([name], state.duration_s)
        success.add_metric([name], 1.0 if state.success else 0.0)
        last.add_metric([name], state.last_success)
        for source, count in sorted(state.errors.items()):
            errors.add_metric([name, source], count)
    return f.all()


class SourceRunner:
    """What both runners hold: the sources, each one's gather state, the self-metrics' prefix and the
    constant labels every sample carries."""

    def __init__(
        self,
        sources: Iterable[Source],
        prefix: str = "fleetsight",
        const_labels: dict[str, str] | None = None,
    ) -> None:
        self.sources = list(sources)
        const = const_labels or {}
        self.const = (tuple(const), tuple(const.values()))
        self.prefix = prefix
        self.states = {s.name: SourceState(errors=dict.fromkeys(s.error_sources, 0)) for s in self.sources}


class DeadlineRunner(SourceRunner):
    """A prometheus_client custom collector: on each scrape, every source gathers in a worker thread
    and the scrape waits at most ``deadline_s`` in total."""

    def __init__(
        self,
        sources: Iterable[Source],
        deadline_s: float = 5.0,
        prefix: str = "fleetsight",
        const_labels: dict[str, str] | None = None,
    ) -> None:
        super().__init__(sources, prefix, const_labels)
        self.deadline_s = deadline_s
        # One thread per source: a stuck source keeps its own thread, never another's.
        self.pool = ThreadPoolExecutor(max_workers=max(1, len(self.sources)), thread_name_prefix="gather")
        self.lock = threading.Lock()  # two overlapping scrapes share in-flight work, not duplicate it

    def _run(self, source: Source) -> tuple[list[Metric], Problems, float]:
        CONST_LABELS.set(self.const)
        return gather_one(source)

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            deadline = time.monotonic() + self.deadline_s
            for source in self.sources:
                state = self.states[source.name]
                if state.pending is None:
                    state.pending = self.pool.submit(self._run, source)
                    state.pending_since = time.monotonic()
            results: dict[str, list[Metric]] = {}
            for source in self.sources:
                results[source.name] = self._settle(source, deadline)
        for source in self.sources:
            yield from results[source.name]
        CONST_LABELS.set(self.const)
        yield from self_metrics(self.states, self.prefix)

    def _settle(self, source: Source, deadline: float) -> list[Metric]:
        state = self.states[source.name]
        assert state.pending is not None
        try:
            metrics, problems, duration = state.pending.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            state.success = False
            state.errors["deadline"] = state.errors.get("deadline", 0) + 1
            state.duration_s = time.monotonic() - state.pending_since
            state.log_problem(source.name, "deadline", f"still running after {state.duration_s:.2f}s")
            return []
        state.pending = None
        state.record(source.name, problems, duration)
        return metrics

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        for source in self.sources:
            source.close()


@dataclass(frozen=True)
class Snapshot:
    """One rendered exposition, plain and gzipped (a scrape of a cached runner sends these bytes)."""

    text: bytes = b""
    gzipped: bytes = b""


class CachedRunner(SourceRunner):
    """Runs its sources in a background loop every ``interval_s`` and renders the result once; a scrape
    sends the last rendering, so it costs the same for 200 series or 200,000 (the fabric exporter).
    Its sources and self-metrics are the node agent's kind: a :class:`Source` reports problems, and
    ``<prefix>_collector_*`` says how each gather went."""

    def __init__(
        self,
        sources: Iterable[Source],
        interval_s: float = 30.0,
        prefix: str = "fleetsight",
        const_labels: dict[str, str] | None = None,
    ) -> None:
        super().__init__(sources, prefix, const_labels)
        self.interval_s = interval_s
        self.snapshot = Snapshot()
        self.refreshes = 0
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def gather(self) -> list[Metric]:
        """One round's families: every source gathers, then the self-metrics (the twin's backfill
        calls this at each simulated scrape)."""
        CONST_LABELS.set(self.const)
        families: list[Metric] = []
        for source in self.sources:
            metrics, problems, duration = gather_one(source)
            self.states[source.name].record(source.name, problems, duration)
            families += metrics
        CONST_LABELS.set(self.const)
        return families + self_metrics(self.states, self.prefix)

    def refresh(self) -> Snapshot:
        """One round: every source gathers, the exposition is rendered and gzipped."""
        text = render(self.gather())
        self.snapshot = Snapshot(text, gzip.compress(text, compresslevel=1))
        self.refreshes += 1
        return self.snapshot

    def run_forever(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                self.refresh()
            except Exception as exc:  # keep serving the last snapshot whatever went wrong
                log.exception(kv(event="refresh_crashed", error=repr(exc)))
            self.stop.wait(max(0.5, self.interval_s - (time.monotonic() - started)))

    def start(self) -> threading.Thread:
        self.thread = threading.Thread(target=self.run_forever, name="refresh", daemon=True)
        self.thread.start()
        return self.thread

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=10)  # let a refresh in flight finish before its clients close
        for source in self.sources:
            source.close()
