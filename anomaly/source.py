"""Where the live service gets its windows: PromQL over HTTP (Prometheus or Thanos query) and, when
configured, the scheduler's slurmrestd-style jobs list.

Each cycle runs a handful of instant queries that reduce the last window on the server side (medians
with ``quantile_over_time``, throttle-bit shares through a subquery, counter increases), so the
service transfers one value per GPU and field whatever the scrape interval.

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
import math
import os
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import httpx
import numpy as np

from fleetsight.dcgm import names_of
from fleetsight.promql import any_of
from fleetsight.slurmrest import SlurmRest, SlurmRestError, running_jobs
from fleetsight.slurmrest import expand_hostlist as expand_hostlist  # importable from here, as before

from .jobs import DEFAULT_POD_LABEL_KEYS, JobIdentity, from_series, merge, sanitize_label_name
from .window import (
    CLOCK_EVENTS,
    EVIDENCE_FIELDS,
    THROTTLE_HW_POWER_BRAKE,
    THROTTLE_HW_THERMAL,
    THROTTLE_SW_THERMAL,
    Window,
)

NODE_LABELS = ("node", "Hostname", "hostname")
log = logging.getLogger("anomaly")


# The InfiniBand counters whose increase says a node's link is in trouble (the node agent's names).
IB_ERROR_COUNTERS = ("symbol_error", "link_downed", "link_error_recovery")


# The window and step rules/anomaly.yml records (the service's defaults): another --window or --step reads
# the raw reductions, since the recorded ones summarise a different window.
RECORDED_WINDOW = ("30s", "5s")
# How old a recorded value may be: the group's interval (30 s: one evaluation per cycle) plus the time an
# evaluation takes (the group's timestamp is its start; at 50,000 GPUs a shard on 2 cores took ~15 s).
RECORDED_FRESH, RECORDED_FRESH_S = "1m", 60
# Recorded only where above 0 (Queries.recording_rules): absent means 0.
SPARSE_RECORDS = frozenset({"brake", "thermal", "pcie_downgraded", "ib_errors"})
# The labels a node's jobs, GPU model and cluster are read from (anomaly/jobs.py: hpc_job, else the first
# listed pod label, with its namespace); the recorded per-GPU values carry only cluster, node and gpu.
JOB_LABELS = (
    "cluster",
    "node",
    "modelName",
    "hpc_job",
    "namespace",
    *map(sanitize_label_name, DEFAULT_POD_LABEL_KEYS),
)
MODES = ("auto", "raw", "recorded")
# Longer queries go as a POST form (the API takes both): a URL of some 8 KiB is refused by some proxies.
LONG_QUERY = 4000
# A recorded field is ~100,000 samples labelled only gpu and node at 100,000 GPUs: decoded as JSON into
# dicts it costs the service ~0.4 CPU-s per field, read straight off the bytes into columns (Vector)
# ~0.05. Prometheus and Thanos write a vector's labels sorted, without spaces; any answer whose samples
# do not all match (counted against its "metric" keys) is decoded as JSON instead.
_SUCCESS = b'{"status":"success","data":{"resultType":"vector","result":['
_GPU_SAMPLE = re.compile(rb'\{"metric":\{"gpu":"(\d+)","node":"([^"\\]+)"\},"value":\[[^\],]*,"([^"]*)"\]\}')
_NODE_SAMPLE = re.compile(rb'\{"metric":\{"node":"([^"\\]+)"\},"value":\[[^\],]*,"([^"]*)"\]\}')


class SourceError(RuntimeError):
    """The source did not answer, or answered something that is not a PromQL result."""


@dataclass(frozen=True)
class Vector:
    """One answer as columns, whichever mode read it: each sample's node, its GPU (-1 in a per-node
    answer) and its value (NaN where the text is not a number)."""

    nodes: list[str]
    gpus: np.ndarray  # int64
    values: np.ndarray  # float64

    @classmethod
    def of(cls, nodes: list[str], gpus: Sequence[str | bytes] | None, texts: Sequence[str | bytes]) -> Vector:
        try:  # float() takes the bytes as they are, "NaN" and "+Inf" included
            values = np.fromiter(map(float, texts), dtype=np.float64, count=len(texts))
        except ValueError:  # a sample that is not a number: that one NaN, the others kept
            values = np.array([_float(text) for text in texts], dtype=np.float64)
        if gpus is None:
            return cls(nodes, np.full(len(nodes), -1, dtype=np.int64), values)
        return cls(nodes, np.fromiter(map(int, gpus), dtype=np.int64, count=len(gpus)), values)

    def __len__(self) -> int:
        return len(self.nodes)


# The per-GPU and per-node answers share the type; the names say which a function expects.
GpuValues = NodeValues = Vector


@dataclass(frozen=True)
class Queries:
    """The PromQL of one cycle; ``window`` and ``step`` are PromQL durations."""

    window: str = "30s"
    step: str = "5s"

    def gpu_fields(self, matchers: str = "") -> dict[str, str]:
        """Field -> the raw reduction of one window; ``matchers`` (e.g. ``node=~"a|b"``) narrows every
        selector to some nodes (a flag's evidence)."""
        w, m = self.window, f"{{{matchers}}}" if matchers else ""
        downgraded = f'fleetsight_pcie_link_downgraded{{kind="gpu"{", " + matchers if matchers else ""}}}'
        h2d = f"fleetsight_pcie_host_to_device_bandwidth_bytes_per_second{m}"
        return {
            "tensor": f"quantile_over_time(0.5, DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{m}[{w}])",
            "power": f"quantile_over_time(0.5, DCGM_FI_DEV_POWER_USAGE{m}[{w}])",
            "sm_clock": f"quantile_over_time(0.5, DCGM_FI_DEV_SM_CLOCK{m}[{w}])",
            "util": f"quantile_over_time(0.5, DCGM_FI_DEV_GPU_UTIL{m}[{w}])",
            **self.throttle_shares("max without ()", matchers),
            "pcie_downgraded": f"max by (node, gpu) ({downgraded})",
            "h2d_bandwidth": f"max by (node, gpu) ({h2d})",
        }

    def throttle_shares(self, aggregate: str, matchers: str = "") -> dict[str, str]:
        """The window's share of samples with the power-brake bit, and with a thermal bit (SW or HW),
        of the clock-event reasons, one series per GPU (``aggregate``: e.g. ``max by (cluster, node,
        gpu)``, applied once to the shares).

        A bit test is a remainder and one comparison: x % 256 >= 128 is bit 0x80; the two thermal bits
        are adjacent (0x20, 0x40), so x % 128 >= 32 is either of them. Each name of the field (the
        counters file decides which is published) has its own subquery, joined with ``or``: a GPU seen
        under both names counts once, the bits are never counted twice, and no aggregation runs at every
        step of the subquery (at 50,000 GPUs a shard spent 17 s on a sum of two bit tests, and the
        per-step ``max by`` and floor arithmetic were most of what is left)."""
        assert THROTTLE_HW_THERMAL == 2 * THROTTLE_SW_THERMAL  # the adjacency the thermal test uses
        w, s = self.window, self.step
        tests = {
            "brake": f"% {2 * THROTTLE_HW_POWER_BRAKE} >= bool {THROTTLE_HW_POWER_BRAKE}",
            "thermal": f"% {4 * THROTTLE_SW_THERMAL} >= bool {THROTTLE_SW_THERMAL}",
        }
        selector = f"{{{matchers}}}" if matchers else ""
        names = names_of(CLOCK_EVENTS)
        return {
            key: f"{aggregate} ("
            + " or ".join(f"avg_over_time(({name}{selector} {test})[{w}:{s}])" for name in names)
            + ")"
            for key, test in tests.items()
        }

    def node_fields(self) -> dict[str, str]:
        w = self.window
        # One sum per counter, then added: increase() over a {__name__=~...} selector drops the names,
        # and a port's three counters then share one label set, which Prometheus 2.x refuses
        # ("vector cannot contain metrics with the same labelset") for the whole query.
        errors = " + ".join(
            f"sum by (node) (increase(fleetsight_infiniband_port_{counter}_total[{w}]))"
            for counter in IB_ERROR_COUNTERS
        )
        return {
            "ib_errors": errors,
            "ib_xmit_wait": f"sum by (node) (rate(fleetsight_infiniband_port_xmit_wait_total[{w}]))",
        }

    # ------------------------------------------------------------------ the recorded window
    @property
    def recordable(self) -> bool:
        """Whether rules/anomaly.yml records this window (its names say 30s; the step is in the rule)."""
        return (self.window, self.step) == RECORDED_WINDOW

    def record_names(self) -> dict[str, str]:
        """Window field -> the recorded series that holds it (``job_labels``: the nodes' job labels).
        The evidence-only fields (EVIDENCE_FIELDS) are not recorded: a flag reads them raw, for its
        nodes only."""
        w = self.window
        return {
            "tensor": f"gpu:dcgm_tensor_active:median{w}",
            "power": f"gpu:dcgm_power_usage_watts:median{w}",
            "sm_clock": f"gpu:dcgm_sm_clock_mhz:median{w}",
            "brake": f"gpu:dcgm_power_brake:share{w}",
            "thermal": f"gpu:dcgm_thermal_throttle:share{w}",
            "pcie_downgraded": "gpu:fleetsight_pcie_link_downgraded:max",
            "ib_errors": f"node:fleetsight_infiniband_port_errors:increase{w}",
            "ib_xmit_wait": f"node:fleetsight_infiniband_port_xmit_wait:rate{w}",
            "job_labels": f"node_job:dcgm_gpus:group{w}",
        }

    def recording_rules(self) -> dict[str, str]:
        """Record name -> expression: the raw reductions above, one series per GPU (or node) with only
        the labels the window reads. rules/anomaly.yml is this (tests/anomaly/test_anomaly_recorded.py).

        The fields that are 0 on nearly every GPU or node (SPARSE_RECORDS: throttle shares, PCIe
        downgrades, link errors) are recorded only where they are not (``> 0``): Thanos Query fetches
        every series a selector matches from the shards before it filters, so a filter at read time
        saves only the answer, a filter in the rule saves the fetch (at 100,000 GPUs, three of the
        cycle's eight per-GPU vectors)."""
        names, gpu, w = self.record_names(), self.gpu_fields(), self.window
        per_gpu = "max by (cluster, node, gpu)"
        by = f"group by ({', '.join(JOB_LABELS)})"
        # First in the group (its timestamp is the group's start, each rule's samples are written as
        # it ends): the series the raw window takes its jobs from, tensor activity and power of the
        # window. `or`, not one {__name__=~...} selector: the two would share one label set once counted.
        exprs = {
            names["job_labels"]: " or ".join(
                f"{by} (count_over_time({metric}[{w}]))"
                for metric in ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_DEV_POWER_USAGE")
            )
        }
        exprs |= {names[k]: f"{per_gpu} ({gpu[k]})" for k in ("tensor", "power", "sm_clock")}
        exprs[names["pcie_downgraded"]] = f'{per_gpu} (fleetsight_pcie_link_downgraded{{kind="gpu"}}) > 0'
        errors = " + ".join(
            f"sum by (cluster, node) (increase(fleetsight_infiniband_port_{counter}_total[{w}]))"
            for counter in IB_ERROR_COUNTERS
        )
        exprs[names["ib_errors"]] = f"({errors}) > 0"
        exprs[names["ib_xmit_wait"]] = (
            f"sum by (cluster, node) (rate(fleetsight_infiniband_port_xmit_wait_total[{w}]))"
        )
        # Last, the costliest (subqueries).
        exprs |= {names[k]: f"{v} > 0" for k, v in self.throttle_shares(per_gpu).items()}
        return exprs

    def recorded_reads(self) -> dict[str, str]:
        """Field -> what a cycle asks for in the recorded mode, the values with node (and gpu) only
        (Thanos adds shard and cluster). Dense records: ``last_over_time`` over RECORDED_FRESH, so that
        a rule group that stopped (or a shard without the rules) reads as absent after it rather than
        after Prometheus's 5-minute lookback. Sparse records (SPARSE_RECORDS, written only where > 0):
        an instant selector, which honours the staleness marker Prometheus writes when a GPU's share
        falls back to 0 and drops out of the rule's output (``last_over_time`` would still see the
        previous value), kept only when written within RECORDED_FRESH. Where the window starts at 0,
        only the values above 0 are sent."""
        node_keys = set(self.node_fields())
        out = {}
        for key, name in self.record_names().items():
            by = f"max by ({'node' if key in node_keys else 'node, gpu'})"
            if key == "job_labels":
                out[key] = f"last_over_time({name}[{RECORDED_FRESH}])"
            elif key in SPARSE_RECORDS:
                out[key] = f"{by} ({name} and (time() - timestamp({name}) < {RECORDED_FRESH_S}))"
            elif key == "ib_xmit_wait":
                out[key] = f"{by} (last_over_time({name}[{RECORDED_FRESH}])) > 0"
            else:
                out[key] = f"{by} (last_over_time({name}[{RECORDED_FRESH}]))"
        return out


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
        self.client = httpx.Client(timeout=timeout, headers={"Accept-Encoding": "identity"})
        self.slurm = slurm_client(slurm_url, timeout, slurm_socket) if slurm_url else None
        self.slurm_up: bool | None = None
        self.slurm_error = ""

    def close(self) -> None:
        self.client.close()
        if self.slurm is not None:
            self.slurm.client.close()

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        return self._decode(self._get(promql, at))

    def _get(self, promql: str, at: float | None) -> httpx.Response:
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        try:
            if len(promql) > LONG_QUERY:  # a flag's evidence names every node of its job
                return self.client.post(f"{self.url}/api/v1/query", data=params)
            return self.client.get(f"{self.url}/api/v1/query", params=params)
        except httpx.HTTPError as exc:
            raise SourceError(f"{self.url}: {type(exc).__name__}: {exc}") from exc

    def query_values(self, promql: str, at: float, per_gpu: bool) -> GpuValues | NodeValues:
        """A vector of (node, gpu, value) or (node, value), read off the answer's bytes when it is
        shaped as Prometheus and Thanos write it (labels node and gpu only), else decoded as JSON."""
        response = self._get(promql, at)
        body = response.content
        if response.status_code == 200 and body.startswith(_SUCCESS):
            found = (_GPU_SAMPLE if per_gpu else _NODE_SAMPLE).findall(body)
            if len(found) == body.count(b'"metric":'):
                if per_gpu:
                    gpus, nodes, texts = zip(*found, strict=True) if found else ((), (), ())
                    return Vector.of(_decoded(nodes), gpus, texts)
                nodes, texts = zip(*found, strict=True) if found else ((), ())
                return Vector.of(_decoded(nodes), None, texts)
        samples = self._decode(response)
        return gpu_values(samples) if per_gpu else node_values(samples)

    def _decode(self, response: httpx.Response) -> list[dict[str, Any]]:
        try:
            body = response.json()
        except ValueError as exc:
            raise SourceError(f"{self.url}: HTTP {response.status_code}, not JSON") from exc
        if response.status_code != 200 or body.get("status") != "success":
            raise SourceError(f"{self.url}: HTTP {response.status_code}: {body.get('error', body)}")
        data = body.get("data") or {}
        if data.get("resultType") != "vector":
            raise SourceError(f"{self.url}: expected a vector, got {data.get('resultType')}")
        return data.get("result") or []

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
            window = window_from_values(end, gpus, nodes, self.slurm_jobs(), self.identity, labels)
        if self.mode_now == "recorded":
            window.evidence_loader = self._load_evidence
        return window

    def _load_evidence(self, window: Window, node_idx: list[int]) -> None:
        """The evidence-only fields of these nodes: the raw reductions of the window ending at the
        cycle's read, narrowed to the nodes (a few series, where every cycle would read 100,000). A failed
        read leaves them NaN (the flag then says so with nulls) rather than failing the cycle."""
        names = [window.nodes[i] for i in node_idx]
        index = {name: i for i, name in enumerate(window.nodes)}
        reads = self.queries.gpu_fields(f"node=~{any_of(names)}")
        for key in EVIDENCE_FIELDS:
            try:
                values = self.query_values(reads[key], window.end, per_gpu=True)
            except SourceError as exc:
                log.warning(json.dumps({"event": "evidence_unread", "field": key, "error": str(exc)}))
                continue
            _fill_gpu_field(getattr(window, key), index, values, window.gpus)

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
        """Job id -> nodes of the scheduler's running jobs; None without slurmrestd or when it fails."""
        if self.slurm is None:
            return None
        try:
            jobs = running_jobs(self.slurm.json("jobs"))
        except (httpx.HTTPError, SlurmRestError, ValueError, KeyError, TypeError) as exc:
            self.slurm_up = False
            self.slurm_error = f"{type(exc).__name__}: {exc}"
            return None  # the hpc_job labels still say which GPUs run which job
        self.slurm_up = True
        self.slurm_error = ""
        return jobs


def _node(labels: dict[str, str]) -> str | None:
    for key in NODE_LABELS:
        if labels.get(key):
            return labels[key]
    return None


def build_window(
    end: float,
    gpu_results: dict[str, list[dict[str, Any]]],
    node_results: dict[str, list[dict[str, Any]]],
    slurm_jobs: dict[str, list[str]] | None,
    identity: JobIdentity | None = None,
) -> Window:
    """Arrays from PromQL vectors (the raw queries' answers). Jobs: the scheduler's list where it has
    one, else the GPUs' own labels (``hpc_job``, or a training-job controller's pod label:
    anomaly/jobs.py) on the tensor and power series."""
    gpus = {key: gpu_values(samples) for key, samples in gpu_results.items()}
    nodes = {key: node_values(samples) for key, samples in node_results.items()}
    return window_from_values(end, gpus, nodes, slurm_jobs, identity, label_samples(gpu_results))


def gpu_values(samples: list[dict[str, Any]]) -> GpuValues:
    """The samples that name a node (``node``, else ``Hostname``) and a GPU, as columns."""
    nodes, gpus, texts = [], [], []
    for sample in samples:
        labels = sample.get("metric", {})
        node, gpu = _node(labels), str(labels.get("gpu", ""))
        if node is not None and gpu.isdigit():
            nodes.append(node)
            gpus.append(gpu)
            texts.append(_text(sample))
    return Vector.of(nodes, gpus, texts)


def node_values(samples: list[dict[str, Any]]) -> NodeValues:
    nodes, texts = [], []
    for sample in samples:
        node = _node(sample.get("metric", {}))
        if node is not None:
            nodes.append(node)
            texts.append(_text(sample))
    return Vector.of(nodes, None, texts)


def label_samples(gpu_results: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The raw answers' samples that name a GPU's job, model and cluster: tensor and power's."""
    samples = gpu_results.get("tensor", []) + gpu_results.get("power", [])
    return [s for s in samples if str(s.get("metric", {}).get("gpu", "")).isdigit()]


def window_from_values(
    end: float,
    gpu_fields: dict[str, GpuValues],
    node_fields: dict[str, NodeValues],
    slurm_jobs: dict[str, list[str]] | None,
    identity: JobIdentity | None,
    labelled: list[dict[str, Any]],
) -> Window:
    """The window of either mode: the nodes and GPUs are those with a tensor or power value; jobs,
    models and clusters come from ``labelled`` (the raw tensor and power series, or the recorded job
    labels, one series per node and job), on those nodes only."""
    present = [gpu_fields[key] for key in ("tensor", "power") if key in gpu_fields]
    names = sorted(set().union(*(vector.nodes for vector in present)))
    index = {name: i for i, name in enumerate(names)}
    highest = max((int(vector.gpus.max()) for vector in present if len(vector)), default=0)
    window = Window.empty(end, names, highest + 1)
    for key, values in gpu_fields.items():
        _fill_gpu_field(getattr(window, key), index, values, window.gpus)
    for key, values in node_fields.items():
        _fill_node_field(getattr(window, key), index, values)
    series: list[tuple[str, dict[str, str]]] = []
    models: dict[str, str] = {}
    clusters: dict[str, str] = {}
    for sample in labelled:
        labels = sample.get("metric", {})
        node = _node(labels)
        if node not in index:
            continue
        series.append((node, labels))
        if labels.get("modelName"):
            models[node] = labels["modelName"]
        if labels.get("cluster"):
            clusters[node] = labels["cluster"]
    jobs = merge(slurm_jobs, from_series(identity or JobIdentity(), series))
    window.jobs = {
        job: [index[n] for n in sorted(members) if n in index]
        for job, members in sorted(jobs.nodes.items())
        if any(n in index for n in members)
    }
    window.job_refs = {job: jobs.refs[job] for job in window.jobs}
    window.gpu_model = {index[n]: m for n, m in models.items()}
    window.node_cluster = {index[n]: c for n, c in clusters.items()}
    return window


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


def _rows(index: dict[str, int], nodes: Iterable[str], count: int) -> np.ndarray:
    """Each node's row in the window, -1 where the window has none (one C loop, no Python per sample)."""
    return np.fromiter(map(index.get, nodes, repeat(-1)), dtype=np.int64, count=count)


def _last_of_each(cells: np.ndarray) -> np.ndarray:
    """The positions that hold each cell's last sample: a cell named twice keeps its last value, as
    filling the samples in order would."""
    _, first_from_end = np.unique(cells[::-1], return_index=True)
    return np.sort(len(cells) - 1 - first_from_end)


def _fill_gpu_field(array: np.ndarray, index: dict[str, int], values: GpuValues, gpus: int) -> None:
    """The finite values of GPUs the window has; the others stay as they are (NaN, or 0 for shares)."""
    rows = _rows(index, values.nodes, len(values))
    keep = (rows >= 0) & (values.gpus >= 0) & (values.gpus < gpus) & np.isfinite(values.values)
    rows, columns, numbers = rows[keep], values.gpus[keep], values.values[keep]
    last = _last_of_each(rows * gpus + columns)
    array[rows[last], columns[last]] = numbers[last]


def _fill_node_field(array: np.ndarray, index: dict[str, int], values: NodeValues) -> None:
    """Per-node counters: a value that is not finite counts as 0."""
    rows = _rows(index, values.nodes, len(values))
    keep = rows >= 0
    rows, numbers = rows[keep], values.values[keep]
    last = _last_of_each(rows)
    array[rows[last]] = np.where(np.isfinite(numbers[last]), numbers[last], 0.0)


def _decoded(names: Sequence[bytes]) -> list[str]:
    """UTF-8 node names, decoded in one call (a NUL cannot be in a JSON string unescaped)."""
    return b"\0".join(names).decode().split("\0") if names else []


def _text(sample: dict[str, Any]) -> str:
    try:
        return str(sample["value"][1])
    except (KeyError, IndexError, TypeError):
        return "NaN"


def _float(text: str | bytes) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


# ----------------------------------------------------------------------------------- slurmrestd
# The client and the job shapes of every API version live in the core (fleetsight.slurmrest): the
# health service reads the same slurmrestd.
def slurm_client(url: str, timeout: float, socket: str | None = None) -> SlurmRest:
    """slurmrestd over TCP with a JWT (``SLURM_JWT``, rest_auth/jwt), or over its UNIX socket
    (rest_auth/local; ``socket`` or ``FLEETSIGHT_SLURM_SOCKET``), as the health service reaches it."""
    socket = socket or os.environ.get("FLEETSIGHT_SLURM_SOCKET") or None
    token = os.environ.get("SLURM_JWT")
    headers = {"X-SLURM-USER-TOKEN": token} if token else {}
    transport = httpx.HTTPTransport(uds=socket) if socket else None
    return SlurmRest(url, httpx.Client(timeout=timeout, headers=headers, transport=transport))
