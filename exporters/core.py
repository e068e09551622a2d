"""What every FleetSight collector shares: cheap file reads, a per-scrape deadline, self-metrics.

A collector implements :meth:`Source.gather`, which returns metric families and records problems in a
:class:`Problems` list instead of raising. :class:`DeadlineRunner` runs every source's ``gather`` in a
worker thread and waits at most the scrape deadline for it, so that one slow BMC or a hung NFS read
never blocks a scrape: a source that misses the deadline is reported (``success`` 0, an error counted
with ``source="deadline"``) and its result, when it arrives, is used by the next scrape.
"""

from __future__ import annotations

import contextvars
import logging
import os
import ssl
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.samples import Sample

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
    """One collector of the node agent (or the fabric exporter)."""

    name = "source"

    def gather(self, problems: Problems) -> list[Metric]:
        raise NotImplementedError

    def close(self) -> None:
        """Releases what the source holds open (files, subprocesses)."""


@dataclass
class SourceState:
    errors: dict[str, int] = field(default_factory=dict)
    duration_s: float = 0.0
    success: bool = False
    last_success: float = 0.0
    pending: Future | None = None
    pending_since: float = 0.0
    last_logged_problem: str = ""


class DeadlineRunner:
    """A prometheus_client custom collector: on each scrape, every source gathers in a worker thread
    and the scrape waits at most ``deadline_s`` in total."""

    def __init__(
        self,
        sources: Iterable[Source],
        deadline_s: float = 5.0,
        prefix: str = "fleetsight",
        const_labels: dict[str, str] | None = None,
    ) -> None:
        self.sources = list(sources)
        const = const_labels or {}
        self.const = (tuple(const), tuple(const.values()))
        self.deadline_s = deadline_s
        self.prefix = prefix
        self.states = {s.name: SourceState() for s in self.sources}
        # One thread per source: a stuck source keeps its own thread, never another's.
        self.pool = ThreadPoolExecutor(max_workers=max(1, len(self.sources)), thread_name_prefix="gather")
        self.lock = threading.Lock()  # two overlapping scrapes share in-flight work, not duplicate it

    def _run(self, source: Source) -> tuple[list[Metric], Problems, float]:
        problems = Problems()
        started = time.perf_counter()
        CONST_LABELS.set(self.const)
        try:
            metrics = source.gather(problems)
        except Exception as exc:  # a bug or bad input in one source must not take the agent down
            log.exception(kv(event="collector_crashed", collector=source.name, error=repr(exc)))
            problems.add("exception", repr(exc))
            metrics = []
        return metrics, problems, time.perf_counter() - started

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
        yield from self._self_metrics()

    def _settle(self, source: Source, deadline: float) -> list[Metric]:
        state = self.states[source.name]
        assert state.pending is not None
        try:
            metrics, problems, duration = state.pending.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            state.success = False
            state.errors["deadline"] = state.errors.get("deadline", 0) + 1
            state.duration_s = time.monotonic() - state.pending_since
            self._log_problem(source.name, "deadline", f"still running after {state.duration_s:.2f}s")
            return []
        state.pending = None
        state.duration_s = duration
        for name, count in problems.by_source.items():
            state.errors[name] = state.errors.get(name, 0) + count
        state.success = not problems
        if problems:
            self._log_problem(source.name, "error", problems.first)
        else:
            state.last_success = time.time()
            state.last_logged_problem = ""
        return metrics

    def _log_problem(self, collector: str, kind: str, detail: str) -> None:
        # Log a problem when it starts or changes, not on every scrape: the counter carries the rate.
        state = self.states[collector]
        if detail != state.last_logged_problem:
            log.warning(kv(event="collector_problem", collector=collector, kind=kind, detail=detail))
            state.last_logged_problem = detail

    def _self_metrics(self) -> Iterator[Metric]:
        CONST_LABELS.set(self.const)
        p = self.prefix
        f = Families()
        duration = f.gauge(
            f"{p}_collector_duration_seconds",
            "Wall time of the collector's last gather.",
            labels=["collector"],
        )
        success = f.gauge(
            f"{p}_collector_success",
            "1 when the collector's last scrape met no error and its deadline, else 0.",
            ["collector"],
        )
        errors = f.counter(
            f"{p}_collector_errors",
            "Errors met by a collector, by source (file, endpoint, deadline, exception).",
            ["collector", "source"],
        )
        last = f.gauge(
            f"{p}_collector_last_success_timestamp_seconds",
            "Unix time of the collector's last fully successful scrape.",
            ["collector"],
        )
        for name, state in self.states.items():
            duration.add_metric([name], state.duration_s)
            success.add_metric([name], 1.0 if state.success else 0.0)
            last.add_metric([name], state.last_success)
            for source, count in sorted(state.errors.items()):
                errors.add_metric([name, source], count)
        yield from f.all()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
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
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


_LABEL_CACHE: dict[tuple[str, tuple[str, ...]], str] = {}
_INF, _NINF = float("inf"), float("-inf")


def render(metrics: Iterable[Metric]) -> bytes:
    """Prometheus text format (0.0.4) for the families a registry collected.

    prometheus_client's ``generate_latest`` re-validates and re-escapes every label name of every
    sample (about 15 µs a sample here); a node scrape has ~2,000 samples and a 25 ms CPU budget, so the
    agent writes the same format itself. The label sets of a node hardly change between scrapes: their
    rendered text is cached, keyed by the sample name and label values.
    """
    out: list[str] = []
    cache = _LABEL_CACHE
    if len(cache) > 200_000:  # label sets come and go (jobs, devices): start afresh now and then
        cache.clear()
    for metric in metrics:
        name = metric.name + "_total" if metric.type == "counter" else metric.name
        doc = metric.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {metric.type}\n")
        for sample in metric.samples:
            labels = sample.labels
            value = sample.value
            special = value != value or value in (_INF, _NINF)
            text = _format_value(value) if special else repr(float(value))
            if not labels:
                out.append(f"{sample.name} {text}\n")
                continue
            key = (sample.name, tuple(labels.values()))
            prefix = cache.get(key)
            if prefix is None:
                inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
                prefix = cache[key] = f"{sample.name}{{{inner}}} "
            out.append(prefix + text + "\n")
    return "".join(out).encode()


# -- small helpers for building families -----------------------------------------------------------


class _ConstGauge(GaugeMetricFamily):
    const_values: tuple[str, ...] = ()

    def add_metric(self, labels, value, timestamp=None) -> None:  # type: ignore[override]
        # The same Sample prometheus_client builds, without its per-call overhead (this runs ~2,000
        # times a scrape).
        self.samples.append(
            Sample(self.name, dict(zip(self._labelnames, (*self.const_values, *labels), strict=True)), value)
        )


class _ConstCounter(CounterMetricFamily):
    const_values: tuple[str, ...] = ()

    def add_metric(self, labels, value, created=None, timestamp=None) -> None:  # type: ignore[override]
        self.samples.append(
            Sample(
                self._total, dict(zip(self._labelnames, (*self.const_values, *labels), strict=True)), value
            )
        )


class _Summed:
    """Samples with equal labels add up (aggregating over targets); rendered by ``finish``."""

    totals: dict[tuple[str, ...], float]

    def add_metric(self, labels, value, *args) -> None:  # type: ignore[override]
        if not hasattr(self, "totals"):
            self.totals = {}
        key = tuple(labels)
        self.totals[key] = self.totals.get(key, 0.0) + value

    def finish(self) -> None:
        for key, total in getattr(self, "totals", {}).items():
            super().add_metric(list(key), total)  # type: ignore[misc]
        self.totals = {}


class _SummedCounter(_Summed, _ConstCounter):
    pass


class _SummedGauge(_Summed, _ConstGauge):
    pass


class Families:
    """Metric families built lazily by name, so a collector only declares what it emits; each carries
    the runner's constant labels (``node``) in front of its own."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}
        self.const_names, self.const_values = CONST_LABELS.get()

    def gauge(self, name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
        family = self._families.get(name)
        if family is None:
            family = _ConstGauge(name, doc, labels=[*self.const_names, *labels])
            family.const_values = self.const_values
            self._families[name] = family
        return family  # type: ignore[return-value]

    def counter(self, name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
        # prometheus_client appends _total to counters; names are given without it.
        family = self._families.get(name)
        if family is None:
            family = _ConstCounter(name, doc, labels=[*self.const_names, *labels])
            family.const_values = self.const_values
            family._total = name + "_total"
            self._families[name] = family
        return family  # type: ignore[return-value]

    def summed(self, name: str, doc: str, labels: list[str], kind: str = "counter") -> _Summed:
        """A family whose samples with equal labels add up (aggregating over targets); a name ending
        in a unit without ``_total`` semantics (gauges) passes ``kind="gauge"``."""
        family = self._families.get(name)
        if family is None:
            cls = _SummedCounter if kind == "counter" else _SummedGauge
            family = cls(name, doc, labels=[*self.const_names, *labels])
            family.const_values = self.const_values
            family._total = name + "_total"
            self._families[name] = family
        return family  # type: ignore[return-value]

    def all(self) -> list[Metric]:
        for family in self._families.values():
            if isinstance(family, _Summed):
                family.finish()
        return list(self._families.values())


def start_http_server(listen_host: str, port: int, handler: type) -> ThreadingHTTPServer:
    """Serves handler on a daemon thread (the agent and the fabric exporter both answer scrapes so)."""
    server = ThreadingHTTPServer((listen_host or "0.0.0.0", int(port)), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
