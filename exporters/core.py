"""What every FleetSight exporter shares: cheap file reads, sources and their runners, self-metrics,
one renderer of the exposition format.

A collector implements :meth:`Source.gather`, which returns metric families and records problems in a
:class:`Problems` list instead of raising. Two runners drive sources and report them through the same
``fleetsight_collector_*`` self-metrics:

- :class:`DeadlineRunner` (the node agent) runs every source's ``gather`` in a worker thread on each
  scrape and waits at most the scrape deadline, so that one slow BMC or a hung NFS read never blocks a
  scrape: a source that misses the deadline is reported (``success`` 0, an error counted with
  ``source="deadline"``) and its result, when it arrives, is used by the next scrape;
- :class:`CachedRunner` (the fabric exporter) gathers in a background loop and renders once; a scrape
  sends the last rendering.
"""

from __future__ import annotations

import contextvars
import gzip
import logging
import os
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

log = logging.getLogger("fleetsight.exporters")

# Labels every metric of the running agent carries (``node``); set by the runner around each gather,
# so collectors never have to thread them through.
CONST_LABELS: contextvars.ContextVar[tuple[tuple[str, ...], tuple[str, ...]]] = contextvars.ContextVar(
    "const_labels", default=((), ())
)


def configure_logging(level: str = "INFO") -> None:
    """Structured logs: one event per line, key=value, on stderr (stdout carries ``--once`` output)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"))
    root = logging.getLogger("fleetsight")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def kv(**fields: object) -> str:
    """key=value pairs, quoting values that contain spaces (log lines stay one event per line)."""
    parts = []
    for key, value in fields.items():
        text = str(value).replace("\n", "\\n")
        parts.append(f'{key}="{text}"' if (" " in text or "=" in text or not text) else f"{key}={text}")
    return " ".join(parts)


def tls_verify(verify: bool | str) -> bool | ssl.SSLContext:
    """httpx's ``verify``: True/False, or a context trusting the CA bundle at a path."""
    return ssl.create_default_context(cafile=verify) if isinstance(verify, str) else verify


# -- file reads ------------------------------------------------------------------------------------


def read_text(path: str, limit: int = 1 << 20) -> str | None:
    """The content of a small (sysfs/procfs) file, or None when it cannot be read.

    ``os.open``/``os.read`` costs about half of ``open().read()`` on the thousand tiny files a node
    scrape touches. procfs hands a file over in page-sized reads: read until a read comes back empty
    (or ``limit`` bytes).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 65536)
        if len(data) < 4096:  # sysfs attributes and small stats files: one read is the whole file
            return data.decode("utf-8", "replace")
        chunks = [data]
        total = len(data)
        while total < limit:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def list_dir(path: str) -> list[str]:
    """Sorted names in a folder; an absent or unreadable folder is empty."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


# -- problems and self-metrics ---------------------------------------------------------------------


@dataclass
class Problems:
    """Errors a collector met in one scrape, by source (``sysfs``, ``redfish``, ``kern_log``...)."""

    by_source: dict[str, int] = field(default_factory=dict)
    first: str = ""

    def add(self, source: str, detail: str) -> None:
        self.by_source[source] = self.by_source.get(source, 0) + 1
        if not self.first:
            self.first = f"{source}: {detail}"

    def merge(self, other: Problems, count: bool = True) -> None:
        """Adds another list's problems; ``count=False`` keeps the failure without counting it again."""
        for source, n in other.by_source.items():
            self.by_source[source] = self.by_source.get(source, 0) + (n if count else 0)
        self.first = self.first or other.first

    def __bool__(self) -> bool:
        return bool(self.by_source)


class Source:
    """One collector of the node agent or the fabric exporter: ``gather`` returns metric families and
    records what went wrong in ``problems`` instead of raising."""

    name = "source"
    error_sources: tuple[str, ...] = ()
    """Where its errors can come from (``ufm``...): their ``errors_total`` starts at 0, so that
    ``increase()`` sees the first error (a counter that appears at 1 shows no increase)."""

    def gather(self, problems: Problems) -> list[Metric]:
        raise NotImplementedError

    def close(self) -> None:
        """Releases what the source holds open (files, subprocesses)."""


# The node agent's collectors register themselves here (node_exporter's registerCollector is the model):
# name -> (position in the output, factory). A factory gets the agent's options and the node's GPU map
# and returns its source, or None when the source is not configured on this host (no BMC URL...).
CollectorFactory = Callable[[Any, Any], "Source | None"]
_COLLECTORS: dict[str, tuple[int, CollectorFactory]] = {}


def register_collector(name: str, position: int) -> Callable[[CollectorFactory], CollectorFactory]:
    """Declare a collector of the node agent; ``--collector NAME`` enables it by this name."""

    def register(factory: CollectorFactory) -> CollectorFactory:
        if name in _COLLECTORS:
            raise ValueError(f"collector {name!r} is registered twice")
        _COLLECTORS[name] = (position, factory)
        return factory

    return register


def collectors() -> dict[str, CollectorFactory]:
    """The registered collectors, in their output order."""
    return {name: factory for name, (_, factory) in sorted(_COLLECTORS.items(), key=lambda kv: kv[1][0])}


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


# -- exposition -----------------------------------------------------------------------------------


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _format_value(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (_INF, _NINF):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


_LABEL_CACHE: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}
_INF, _NINF = float("inf"), float("-inf")


def render(metrics: Iterable[Metric]) -> bytes:
    """Prometheus text format (0.0.4) for metric families, the samples prometheus_client's
    ``generate_latest`` gives for the same families (tests/exporters/test_exporter_render.py checks it).

    ``generate_latest`` re-validates and re-escapes every label name of every sample (about 15 µs a
    sample here); a node scrape has ~2,000 samples and a 25 ms CPU budget, and a 20,000-port fabric
    220,000. So the label text is built once per label set: label sets hardly change between scrapes
    (cached by names and values), and within one rendering a dict of labels shared by several samples
    (a fabric port's, in every port family) is looked up once (by identity: the families are held
    alive for the whole call). Counters are named ``<family>_total`` as ``generate_latest`` names them;
    values are Python's shortest repr (``4e+06`` there is ``4000000.0`` here: the same number).
    """
    families = list(metrics)  # keeps every labels dict alive, so that ids stay unique in this call
    out: list[str] = []
    cache = _LABEL_CACHE
    if len(cache) > 500_000:  # label sets come and go (jobs, devices): start afresh now and then
        cache.clear()
    by_id: dict[int, str] = {}
    for metric in families:
        name = metric.name + "_total" if metric.type == "counter" else metric.name
        doc = metric.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {metric.type}\n")
        for sample in metric.samples:
            labels = sample.labels
            value = sample.value
            text = _format_value(value) if (value != value or value in (_INF, _NINF)) else repr(float(value))
            if not labels:
                out.append(f"{sample.name} {text}\n")
                continue
            inner = by_id.get(id(labels))
            if inner is None:
                key = (tuple(labels), tuple(labels.values()))
                inner = cache.get(key)
                if inner is None:
                    inner = cache[key] = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
                by_id[id(labels)] = inner
            out.append(f"{sample.name}{{{inner}}} {text}\n")
    return "".join(out).encode()


# -- building families -----------------------------------------------------------------------------


class Family:
    """A prometheus_client metric family (``GaugeMetricFamily`` or ``CounterMetricFamily``, through their
    public ``add_metric``) whose samples carry the runner's constant labels (``node``) first."""

    def __init__(
        self, family: GaugeMetricFamily | CounterMetricFamily, const_values: tuple[str, ...]
    ) -> None:
        self.family = family
        self.const_values = const_values

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        self.family.add_metric([*self.const_values, *labels], value)


class SummedFamily(Family):
    """Samples with equal labels add up (aggregating over targets); written out by :meth:`finish`."""

    def __init__(
        self, family: GaugeMetricFamily | CounterMetricFamily, const_values: tuple[str, ...]
    ) -> None:
        super().__init__(family, const_values)
        self.totals: dict[tuple[str, ...], float] = {}

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        key = tuple(labels)
        self.totals[key] = self.totals.get(key, 0.0) + value

    def finish(self) -> None:
        for key, total in self.totals.items():
            super().add_metric(key, total)
        self.totals = {}


class Families:
    """Metric families built lazily by name, so a collector only declares what it emits; each carries
    the runner's constant labels (``node``) in front of its own. Counter names are given without
    ``_total`` (prometheus_client adds it)."""

    def __init__(self) -> None:
        self._families: dict[str, Family] = {}
        self.const_names, self.const_values = CONST_LABELS.get()

    def _family(self, name: str, doc: str, labels: Sequence[str], kind: str, cls: type[Family]) -> Family:
        family = self._families.get(name)
        if family is None:
            labelnames = [*self.const_names, *labels]
            if kind == "counter":
                inner: GaugeMetricFamily | CounterMetricFamily = CounterMetricFamily(
                    name, doc, labels=labelnames
                )
            else:
                inner = GaugeMetricFamily(name, doc, labels=labelnames)
            family = self._families[name] = cls(inner, self.const_values)
        return family

    def gauge(self, name: str, doc: str, labels: Sequence[str]) -> Family:
        return self._family(name, doc, labels, "gauge", Family)

    def counter(self, name: str, doc: str, labels: Sequence[str]) -> Family:
        return self._family(name, doc, labels, "counter", Family)

    def summed(self, name: str, doc: str, labels: Sequence[str], kind: str = "counter") -> Family:
        """A family whose samples with equal labels add up (aggregating over targets); a name ending
        in a unit without ``_total`` semantics (gauges) passes ``kind="gauge"``."""
        return self._family(name, doc, labels, kind, SummedFamily)

    def all(self) -> list[Metric]:
        for family in self._families.values():
            if isinstance(family, SummedFamily):
                family.finish()
        return [family.family for family in self._families.values()]
