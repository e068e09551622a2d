"""Where the live service gets its windows: PromQL over HTTP (Prometheus or Thanos query, through the
core's client, fleetsight.prometheus) and, when configured, the scheduler's running jobs
(anomaly/scheduler.py). The PromQL is anomaly/queries.py's, the arrays anomaly/vectors.py's: this module
decides what a cycle reads and turns Prometheus's failures into the service's SourceError.

Two modes (docs/anomaly.md, "Recorded window"): where every shard's Prometheus loads rules/anomaly.yml,
those reductions are recording rules evaluated next to the data, and a cycle reads one small recorded
vector per field (only the GPUs with a signal for the throttle shares and PCIe downgrades); elsewhere
(rules not loaded, another window or step) it runs the raw reductions itself. Each cycle picks the mode
from whether the recorded tensor-activity vector answers, so a fleet that loads the rules later
switches by itself; the mode is logged when it changes and kept in ``PrometheusSource.mode_now``.
"""

from __future__ import annotations

import gc
import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fleetsight.prometheus import ANY_VALUE, DIGITS, Columns, Prometheus, PrometheusError
from fleetsight.promql import any_of

from .jobs import DEFAULT_POD_LABEL_KEYS, JobIdentity
from .queries import Queries
from .scheduler import SchedulerJobs
from .vectors import (
    GpuValues,
    NodeValues,
    Vector,
    fill_gpu_field,
    fill_node_field,
    gpu_values,
    label_samples,
    node_values,
    window_from_values,
)
from .window import EVIDENCE_FIELDS, NODE_EVIDENCE_FIELDS, Window

log = logging.getLogger("anomaly")

MODES = ("auto", "raw", "recorded")
# Longer queries go as a POST form (the API takes both): a URL of some 8 KiB is refused by some proxies.
LONG_QUERY = 4000
# A recorded field is ~100,000 samples labelled only gpu and node at 100,000 GPUs: decoded as JSON into
# dicts it costs the service ~0.4 CPU-s per field, read straight off the bytes into columns ~0.05
# (fleetsight.prometheus.compact_columns; an answer in any other form is decoded as JSON instead).
GPU_SAMPLE = {"gpu": DIGITS, "node": ANY_VALUE}
NODE_SAMPLE = {"node": ANY_VALUE}


class SourceError(RuntimeError):
    """The source did not answer, or answered something that is not a PromQL result."""


@contextmanager
def _as_source_error() -> Iterator[None]:
    """Prometheus's failures (fleetsight.prometheus) as the service's SourceError, with their message."""
    try:
        yield
    except PrometheusError as exc:
        raise SourceError(str(exc)) from exc


class PrometheusSource:
    """Reads windows from a Prometheus-compatible HTTP API (``/api/v1/query``)."""

    # How a GPU series names its job (anomaly/jobs.py); the service sets its configured key list.
    identity: JobIdentity = JobIdentity()

    def __init__(
        self,
        url: str,
        queries: Queries | None = None,
        slurm_url: str | None = None,
        timeout: float = 10.0,
        slurm_socket: str | None = None,
        mode: str = "auto",
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self.url = url.rstrip("/")
        self.queries = queries or Queries()
        self.mode = mode  # auto: recorded where the rules answer, else raw; raw/recorded: forced (benches)
        self.mode_now: str | None = None  # what the last read used
        self.slurm_url = slurm_url
        # Uncompressed answers: at 100,000 GPUs a cycle reads ~25 MB, which Thanos Query would gzip and this
        # service un-gzip every 30 s (CPU on both sides) to spare a network inside the cluster.
        self.prometheus = Prometheus(
            self.url, timeout, headers={"Accept-Encoding": "identity"}, post_over=LONG_QUERY
        )
        self.slurm = SchedulerJobs(slurm_url, timeout, slurm_socket) if slurm_url else None

    @property
    def slurm_up(self) -> bool | None:
        return self.slurm.up if self.slurm is not None else None

    @property
    def slurm_error(self) -> str:
        return self.slurm.error if self.slurm is not None else ""

    def close(self) -> None:
        self.prometheus.close()
        if self.slurm is not None:
            self.slurm.close()

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        with _as_source_error():
            return self.prometheus.query(promql, None if at is None else f"{at:.3f}")

    def query_values(self, promql: str, at: float, per_gpu: bool) -> GpuValues | NodeValues:
        """A vector of (node, gpu, value) or (node, value), read off the answer's bytes when it is
        shaped as Prometheus and Thanos write it (labels node and gpu only), else decoded as JSON."""
        with _as_source_error():
            answer = self.prometheus.query_columns(
                promql, GPU_SAMPLE if per_gpu else NODE_SAMPLE, f"{at:.3f}"
            )
        if isinstance(answer, Columns):
            return Vector.of(answer.strings("node"), answer.labels["gpu"] if per_gpu else None, answer.values)
        return gpu_values(answer) if per_gpu else node_values(answer)

    def read(self, at: float | None = None) -> Window:
        """One window ending at ``at`` (default: now), from the recorded reductions where they answer."""
        end = at if at is not None else time.time()
        with _collector_paused():
            results = self._read_recorded(end) if self.mode != "raw" and self._recordable() else None
            if results is None:
                if self.mode == "recorded":
                    tensor = self.queries.record_names()["tensor"]
                    raise SourceError(f"{self.url}: no recorded window ({tensor})")
                results = self._read_raw(end)
            gpus, nodes, labels = results
            slurm = self.slurm_jobs()
            routing = self.slurm.routing if self.slurm is not None and slurm is not None else frozenset()
            window = window_from_values(end, gpus, nodes, slurm, self.identity, labels, routing)
        if self.mode_now == "recorded":
            window.evidence_loader = self._load_evidence
        return window

    def _load_evidence(self, window: Window, node_idx: list[int]) -> None:
        """The evidence-only fields of these nodes: the raw reductions of the window ending at the
        cycle's read, narrowed to the nodes (a few series, where every cycle would read 100,000). A failed
        read leaves them NaN (the flag then says so with nulls) rather than failing the cycle."""
        names = [window.nodes[i] for i in node_idx]
        index = {name: i for i, name in enumerate(window.nodes)}
        selector = f"node=~{any_of(names)}"
        gpu_reads, node_reads = self.queries.gpu_fields(selector), self.queries.node_fields(selector)
        reads = [(key, gpu_reads[key], True) for key in EVIDENCE_FIELDS]
        reads += [(key, node_reads[key], False) for key in NODE_EVIDENCE_FIELDS]
        for key, promql, per_gpu in reads:
            try:
                values = self.query_values(promql, window.end, per_gpu=per_gpu)
            except SourceError as exc:
                log.warning(json.dumps({"event": "evidence_unread", "field": key, "error": str(exc)}))
                continue
            if per_gpu:
                fill_gpu_field(getattr(window, key), index, values, window.gpus)
            else:
                fill_node_field(getattr(window, key), index, values)

    def _recordable(self) -> bool:
        # The rules group on the default pod-label keys: a service told other keys reads the raw labels.
        keys_recorded = set(self.identity.pod_label_keys) <= set(DEFAULT_POD_LABEL_KEYS)
        return self.queries.recordable and keys_recorded

    def _read_raw(self, end: float) -> tuple[dict[str, GpuValues], dict[str, NodeValues], list]:
        gpu_results = {key: self.query(q, end) for key, q in self.queries.gpu_fields().items()}
        node_results = {key: self.query(q, end) for key, q in self.queries.node_fields().items()}
        self._set_mode("raw", f"no recorded series {self.queries.record_names()['tensor']}")
        return (
            {key: gpu_values(samples) for key, samples in gpu_results.items()},
            {key: node_values(samples) for key, samples in node_results.items()},
            label_samples(gpu_results),
        )

    def _read_recorded(self, end: float) -> tuple[dict[str, GpuValues], dict[str, NodeValues], list] | None:
        """The recorded fields, or None when the tensor activity is not recorded (rules not loaded, or
        series without a `node` label, which the rules aggregate on): the raw reductions then."""
        reads = self.queries.recorded_reads()
        tensor = self.query_values(reads.pop("tensor"), end, per_gpu=True)
        if not any(tensor.nodes):
            return None
        job_labels = self.query(reads.pop("job_labels"), end)
        node_keys = set(self.queries.node_fields())
        gpus: dict[str, GpuValues] = {"tensor": tensor}
        nodes: dict[str, NodeValues] = {}
        for key, promql in reads.items():
            if key in node_keys:
                nodes[key] = self.query_values(promql, end, per_gpu=False)
            else:
                gpus[key] = self.query_values(promql, end, per_gpu=True)
        self._set_mode("recorded", f"recorded series {self.queries.record_names()['tensor']}")
        return gpus, nodes, job_labels

    def _set_mode(self, mode: str, reason: str) -> None:
        """Log the mode when it changes (the first read included), so that a fleet's mode is on record."""
        if mode != self.mode_now:
            log.info(json.dumps({"event": "source_mode", "mode": mode, "reason": reason, "url": self.url}))
        self.mode_now = mode

    def slurm_jobs(self) -> dict[str, list[str]] | None:
        """Job id -> nodes of the scheduler's running jobs; None without slurmrestd or when it fails (the
        hpc_job labels still say which GPUs run which job)."""
        return self.slurm.read() if self.slurm is not None else None


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a window is read. At 100,000 GPUs a read makes
    ~1 M short-lived tuples (the answers' samples, the decoded JSON); alive while they are parsed,
    they outlive the young collections and set off ~5 full collections per cycle over the service's
    whole heap (the detector's state, the libraries): 0.5 of the read's 0.8 CPU-s (bench/anomaly_100k.py).
    None of them is in a reference cycle, so reference counting frees them all the same."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
