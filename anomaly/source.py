"""Where the live service gets its windows: PromQL over HTTP (Prometheus or Thanos query) and, when
configured, the scheduler's slurmrestd-style jobs list.

Each cycle runs a handful of instant queries that reduce the last window on the server side (medians
with ``quantile_over_time``, throttle-bit shares through a subquery, counter increases), so the
service transfers one value per GPU and field whatever the scrape interval.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Any

import httpx

from .window import (
    THROTTLE_HW_POWER_BRAKE,
    THROTTLE_HW_THERMAL,
    THROTTLE_SW_THERMAL,
    Window,
)

NODE_LABELS = ("node", "Hostname", "hostname")


# The InfiniBand counters whose increase says a node's link is in trouble (the node agent's names).
IB_ERROR_COUNTERS = ("symbol_error", "link_downed", "link_error_recovery")


class SourceError(RuntimeError):
    """The source did not answer, or answered something that is not a PromQL result."""


@dataclass(frozen=True)
class Queries:
    """The PromQL of one cycle; ``window`` and ``step`` are PromQL durations."""

    window: str = "30s"
    step: str = "5s"

    def gpu_fields(self) -> dict[str, str]:
        w, s = self.window, self.step
        throttle = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"

        def bit(value: int) -> str:
            return f"(floor({throttle} / {value}) % 2)"

        thermal = f"clamp_max({bit(THROTTLE_SW_THERMAL)} + {bit(THROTTLE_HW_THERMAL)}, 1)"
        return {
            "tensor": f"quantile_over_time(0.5, DCGM_FI_PROF_PIPE_TENSOR_ACTIVE[{w}])",
            "power": f"quantile_over_time(0.5, DCGM_FI_DEV_POWER_USAGE[{w}])",
            "sm_clock": f"quantile_over_time(0.5, DCGM_FI_DEV_SM_CLOCK[{w}])",
            "util": f"quantile_over_time(0.5, DCGM_FI_DEV_GPU_UTIL[{w}])",
            "brake": f"avg_over_time({bit(THROTTLE_HW_POWER_BRAKE)}[{w}:{s}])",
            "thermal": f"avg_over_time({thermal}[{w}:{s}])",
            "pcie_downgraded": 'max by (node, gpu) (fleetsight_pcie_link_downgraded{kind="gpu"})',
            "h2d_bandwidth": "max by (node, gpu) (fleetsight_pcie_host_to_device_bandwidth_bytes_per_second)",
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


class PrometheusSource:
    """Reads windows from a Prometheus-compatible HTTP API (``/api/v1/query``)."""

    def __init__(
        self,
        url: str,
        queries: Queries | None = None,
        slurm_url: str | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.queries = queries or Queries()
        self.slurm_url = slurm_url
        self.client = httpx.Client(timeout=timeout)
        self.slurm_up: bool | None = None
        self.slurm_error = ""

    def close(self) -> None:
        self.client.close()

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        try:
            response = self.client.get(f"{self.url}/api/v1/query", params=params)
        except httpx.HTTPError as exc:
            raise SourceError(f"{self.url}: {type(exc).__name__}: {exc}") from exc
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
        """One window ending at ``at`` (default: now)."""
        end = at if at is not None else time.time()
        gpu_results = {key: self.query(q, end) for key, q in self.queries.gpu_fields().items()}
        node_results = {key: self.query(q, end) for key, q in self.queries.node_fields().items()}
        slurm_jobs = self._slurm_jobs()
        return build_window(end, gpu_results, node_results, slurm_jobs)

    def _slurm_jobs(self) -> dict[str, list[str]] | None:
        if not self.slurm_url:
            return None
        try:
            response = self.client.get(self.slurm_url)
            response.raise_for_status()
            jobs = running_jobs(response.json())
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
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
) -> Window:
    """Arrays from PromQL vectors. Jobs: the scheduler's list when there is one, else ``hpc_job``."""
    nodes: set[str] = set()
    gpus = 0
    label_jobs: dict[str, set[str]] = {}
    models: dict[str, str] = {}
    for sample in gpu_results.get("tensor", []) + gpu_results.get("power", []):
        labels = sample.get("metric", {})
        node = _node(labels)
        if node is None or not str(labels.get("gpu", "")).isdigit():
            continue
        nodes.add(node)
        gpus = max(gpus, int(labels["gpu"]) + 1)
        if labels.get("hpc_job"):
            label_jobs.setdefault(labels["hpc_job"], set()).add(node)
        if labels.get("modelName"):
            models[node] = labels["modelName"]
    names = sorted(nodes)
    index = {name: i for i, name in enumerate(names)}
    window = Window.empty(end, names, max(gpus, 1))
    for key, results in gpu_results.items():
        array = getattr(window, key)
        for sample in results:
            labels = sample.get("metric", {})
            node, gpu = _node(labels), str(labels.get("gpu", ""))
            if node not in index or not gpu.isdigit() or int(gpu) >= window.gpus:
                continue
            value = _value(sample)
            if math.isfinite(value):
                array[index[node], int(gpu)] = value
    for key, results in node_results.items():
        array = getattr(window, key)
        for sample in results:
            node = _node(sample.get("metric", {}))
            if node in index:
                value = _value(sample)
                array[index[node]] = value if math.isfinite(value) else 0.0
    source = slurm_jobs if slurm_jobs is not None else {j: sorted(n) for j, n in label_jobs.items()}
    window.jobs = {
        job: [index[n] for n in members if n in index]
        for job, members in sorted(source.items())
        if any(n in index for n in members)
    }
    window.gpu_model = {index[n]: m for n, m in models.items()}
    return window


def _value(sample: dict[str, Any]) -> float:
    try:
        return float(sample["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return math.nan


# ----------------------------------------------------------------------------------- slurmrestd
_RANGE = re.compile(r"^(\d+)-(\d+)$")


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list (``n[0001-0003,0007],gpu-a1``) as names."""
    names: list[str] = []
    for part in _split_top(text):
        if "[" not in part:
            if part:
                names.append(part)
            continue
        prefix, rest = part.split("[", 1)
        body, _, suffix = rest.partition("]")
        for item in body.split(","):
            match = _RANGE.match(item)
            if match:
                first, last = match.groups()
                width = len(first)
                names.extend(f"{prefix}{i:0{width}d}{suffix}" for i in range(int(first), int(last) + 1))
            elif item:
                names.append(f"{prefix}{item}{suffix}")
    return names


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    parts.append(current.strip())
    return [p for p in parts if p]


def running_jobs(body: dict[str, Any]) -> dict[str, list[str]]:
    """Job id -> nodes of the RUNNING jobs of a slurmrestd ``/slurm/v0.0.40/jobs`` answer."""
    out: dict[str, list[str]] = {}
    for job in body["jobs"]:
        states = job.get("job_state") or []
        states = [states] if isinstance(states, str) else states
        if "RUNNING" not in states or not job.get("nodes"):
            continue
        out[str(job["job_id"])] = expand_hostlist(str(job["nodes"]))
    return out
