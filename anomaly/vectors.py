"""From PromQL answers to a window's arrays: each answer as columns (Vector: node, GPU, value), and the
Window of either read mode built from them, with the jobs, models and clusters the series' labels name.
Its own module: this is numpy work on answers already read, which changes with the Window's fields, not
with how they are asked for (anomaly/queries.py) or fetched (anomaly/source.py); the benches and tests
build windows from recorded answers with it, without a Prometheus.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from .jobs import JobIdentity, from_series, merge
from .window import Window

NODE_LABELS = ("node", "Hostname", "hostname")


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
    routing: Collection[str] = (),
) -> Window:
    """The window of either mode: the nodes and GPUs are those with a tensor or power value; jobs,
    models and clusters come from ``labelled`` (the raw tensor and power series, or the recorded job
    labels, one series per node and job), on those nodes only; ``routing``: the Slurm jobs whose
    comment declares expert routing."""
    present = [gpu_fields[key] for key in ("tensor", "power") if key in gpu_fields]
    names = sorted(set().union(*(vector.nodes for vector in present)))
    index = {name: i for i, name in enumerate(names)}
    highest = max((int(vector.gpus.max()) for vector in present if len(vector)), default=0)
    window = Window.empty(end, names, highest + 1)
    for key, values in gpu_fields.items():
        fill_gpu_field(getattr(window, key), index, values, window.gpus)
    for key, values in node_fields.items():
        fill_node_field(getattr(window, key), index, values)
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
    jobs = merge(slurm_jobs, from_series(identity or JobIdentity(), series), routing)
    window.jobs = {
        job: [index[n] for n in sorted(members) if n in index]
        for job, members in sorted(jobs.nodes.items())
        if any(n in index for n in members)
    }
    window.job_refs = {job: jobs.refs[job] for job in window.jobs}
    window.gpu_model = {index[n]: m for n, m in models.items()}
    window.node_cluster = {index[n]: c for n, c in clusters.items()}
    return window


def _rows(index: dict[str, int], nodes: Iterable[str], count: int) -> np.ndarray:
    """Each node's row in the window, -1 where the window has none (one C loop, no Python per sample)."""
    return np.fromiter(map(index.get, nodes, repeat(-1)), dtype=np.int64, count=count)


def _last_of_each(cells: np.ndarray) -> np.ndarray:
    """The positions that hold each cell's last sample: a cell named twice keeps its last value, as
    filling the samples in order would."""
    _, first_from_end = np.unique(cells[::-1], return_index=True)
    return np.sort(len(cells) - 1 - first_from_end)


def fill_gpu_field(array: np.ndarray, index: dict[str, int], values: GpuValues, gpus: int) -> None:
    """The finite values of GPUs the window has; the others stay as they are (NaN, or 0 for shares)."""
    rows = _rows(index, values.nodes, len(values))
    keep = (rows >= 0) & (values.gpus >= 0) & (values.gpus < gpus) & np.isfinite(values.values)
    rows, columns, numbers = rows[keep], values.gpus[keep], values.values[keep]
    last = _last_of_each(rows * gpus + columns)
    array[rows[last], columns[last]] = numbers[last]


def fill_node_field(array: np.ndarray, index: dict[str, int], values: NodeValues) -> None:
    """Per-node counters: a value that is not finite counts as 0."""
    rows = _rows(index, values.nodes, len(values))
    keep = rows >= 0
    rows, numbers = rows[keep], values.values[keep]
    last = _last_of_each(rows)
    array[rows[last]] = np.where(np.isfinite(numbers[last]), numbers[last], 0.0)


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
