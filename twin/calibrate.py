"""How hard the twin is for a straggler detector, measured: the calibration figures of docs/twin.md.

Runs the scenario's physics twice without writing files (one healthy run, one with a node computing
``slowdown`` times slower and no hardware signal) and measures on the largest job, on what
dcgm-exporter would show (``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`` and ``DCGM_FI_DEV_POWER_USAGE``):

- the per-sample coefficient of variation of tensor activity across the job's GPUs (median over samples);
- the spread of the nodes' 10-minute means in the healthy run (layout and silicon, no fault), and
  from the layout alone (silicon, phase sampling and benign events off);
- the slow node's z-score against its peers (node means) in one sample and over 1 and 5 minutes.

Only ticks where every node of the job computes are counted (no start-up, checkpoint or stall).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
from dataclasses import dataclass
from typing import Any

import numpy as np

from .scenario import from_dict
from .scenario_fields import parse_duration
from .sim import Simulation

CALIBRATION_SCENARIO: dict[str, Any] = {
    "name": "calibration",
    "seed": 7,
    "start": "2026-11-21T10:00:00Z",
    "duration": "40m",
    "tick": "5s",
    "cluster": {"name": "calib", "nodes": 16},
    "jobs": [
        {
            "id": "9001",
            "name": "llm-70b-pretrain",
            "nodes": 16,
            "profile": "llm-70b",
            "checkpoint_interval": "4h",
        }
    ],
}


@dataclass
class Trace:
    """Per tick and node: mean tensor activity and power of the node's GPUs, and whether the whole
    job was computing; per tick and GPU: tensor activity."""

    node_tensor: np.ndarray  # [tick, node]
    node_power: np.ndarray  # [tick, node]
    gpu_tensor: np.ndarray  # [tick, node, gpu]
    computing: np.ndarray  # [tick]
    tick: float


def _largest_job(sim: Simulation) -> Any:
    return max(
        sim.jobs, key=lambda job: job.spec.nodes if isinstance(job.spec.nodes, int) else len(job.spec.nodes)
    )


def trace(raw: dict[str, Any]) -> Trace:
    scenario = from_dict(raw)
    start = dt.datetime(2026, 11, 21, 10, tzinfo=dt.UTC)
    sim = Simulation(scenario, start)
    ticks = int(scenario.duration / scenario.tick)
    job = _largest_job(sim)
    node_tensor, node_power, gpu_tensor, computing = [], [], [], []
    for _ in range(ticks):
        sim.advance()
        sim.kernel_lines.clear()
        sim.app_lines.clear()
        nodes = job.nodes
        if job.state != "RUNNING" or not len(nodes):
            computing.append(False)
            node_tensor.append(np.zeros(len(sim.nodes)))
            node_power.append(np.zeros(len(sim.nodes)))
            gpu_tensor.append(np.zeros(sim.tensor.shape))
            continue
        computing.append(job.phase == "compute")
        node_tensor.append(sim.tensor.mean(axis=1))
        node_power.append(sim.power.mean(axis=1))
        gpu_tensor.append(sim.tensor.copy())
    return Trace(
        np.array(node_tensor), np.array(node_power), np.array(gpu_tensor), np.array(computing), scenario.tick
    )


def _z(values: np.ndarray, index: int) -> float:
    peers = np.delete(values, index)
    spread = peers.std(ddof=1)
    return float((values[index] - peers.mean()) / spread) if spread > 0 else float("inf")


def _window_means(series: np.ndarray, mask: np.ndarray, width: int) -> list[np.ndarray]:
    """Means over consecutive windows of `width` ticks in which every tick is in `mask`."""
    means = []
    for first in range(0, len(series) - width + 1, width):
        if mask[first : first + width].all():
            means.append(series[first : first + width].mean(axis=0))
    return means


def measure(raw: dict[str, Any] | None = None, slowdown: float = 1.10, slow_node: str | None = None) -> dict:
    """The calibration figures (a dict of floats) for a scenario given as a dict. The slow node is
    by default the one in the middle of the largest job (a middle pipeline stage)."""
    base = copy.deepcopy(raw or CALIBRATION_SCENARIO)
    base["faults"] = []
    base.pop("random_faults", None)
    # Benign disturbances stay (a real cluster has them); the figures are medians.
    healthy = trace(base)
    job_nodes = _job_node_indices(base)
    if slow_node is None:
        slow_node = f"n{job_nodes[len(job_nodes) // 2 - 1] + 1:04d}"
    ticks_10m = int(600 / healthy.tick)
    gpu = healthy.gpu_tensor[healthy.computing][:, job_nodes, :].reshape(int(healthy.computing.sum()), -1)
    cv = gpu.std(axis=1) / np.maximum(gpu.mean(axis=1), 1e-9)
    node_means = [m[job_nodes] for m in _window_means(healthy.node_tensor, healthy.computing, ticks_10m)]
    spread = [float(m.std(ddof=1) / m.mean()) for m in node_means]
    range_ = [float((m.max() - m.min()) / m.mean()) for m in node_means]
    # The layout alone: the same job with silicon, phase sampling and benign events turned off; the
    # scenario's own realism otherwise (under `realism: off` there is no layout either).
    layout_only = copy.deepcopy(base)
    realism = dataclasses.asdict(from_dict(base).realism)
    realism.update(silicon=False, phase_sampling=False, benign_per_node_hour=0)
    layout_only["realism"] = realism
    clean = trace(layout_only)
    layout_means = [m[job_nodes] for m in _window_means(clean.node_tensor, clean.computing, ticks_10m)]
    layout_range = [float((m.max() - m.min()) / m.mean()) for m in layout_means]

    duration = float(base.get("duration_seconds", 0)) or _seconds(base["duration"])
    onset = 300.0
    slow = copy.deepcopy(base)
    slow["faults"] = [
        {
            "kind": "gray_slow_node",
            "target": {"node": slow_node},
            "onset": onset,
            "duration": duration - onset,
            "magnitude": slowdown,
        }
    ]
    faulty = trace(slow)
    index = job_nodes.index(int(slow_node[1:]) - 1)
    during = faulty.computing.copy()
    during[: int((onset + 60) / faulty.tick)] = False
    figures: dict[str, Any] = {
        "slow_node": slow_node,
        "slowdown": slowdown,
        "job_nodes": len(job_nodes),
        "tensor_cv_per_sample_median": float(np.median(cv)),
        "node_10min_mean_spread_cv": float(np.median(spread)) if spread else float("nan"),
        "node_10min_mean_range": float(np.median(range_)) if range_ else float("nan"),
        "node_10min_mean_range_layout_only": float(np.median(layout_range)) if layout_range else float("nan"),
    }
    for name, series in (("tensor", faulty.node_tensor), ("power", faulty.node_power)):
        values = series[:, job_nodes]
        single = [abs(_z(values[t], index)) for t in np.nonzero(during)[0]]
        figures[f"slow_node_{name}_z_single_sample_median"] = float(np.median(single))
        for minutes in (1, 5):
            windows = _window_means(values, during, int(minutes * 60 / faulty.tick))
            zs = [abs(_z(w, index)) for w in windows]
            figures[f"slow_node_{name}_z_{minutes}min_median"] = float(np.median(zs)) if zs else float("nan")
    return figures


def _job_node_indices(raw: dict[str, Any]) -> list[int]:
    scenario = from_dict(raw)
    sim = Simulation(scenario, dt.datetime(2026, 11, 21, 10, tzinfo=dt.UTC))
    for _ in range(3):
        sim.advance()
    return [int(i) for i in _largest_job(sim).nodes]


def _seconds(value: Any) -> float:
    return parse_duration(value, "duration")


def report(figures: dict[str, float]) -> str:
    labels = {
        "tensor_cv_per_sample_median": "per-sample CV of tensor activity across the job's GPUs (median)",
        "node_10min_mean_spread_cv": "nodes' 10-minute means, healthy: CV across nodes (median)",
        "node_10min_mean_range": "nodes' 10-minute means, healthy: (max-min)/mean (median)",
        "node_10min_mean_range_layout_only": "nodes' 10-minute means, layout alone: (max-min)/mean",
        "slow_node_tensor_z_single_sample_median": "slow node, tensor activity |z| vs peers, one sample",
        "slow_node_tensor_z_1min_median": "slow node, tensor activity |z| vs peers, 1-minute means",
        "slow_node_tensor_z_5min_median": "slow node, tensor activity |z| vs peers, 5-minute means",
        "slow_node_power_z_single_sample_median": "slow node, power |z| vs peers, one sample",
        "slow_node_power_z_1min_median": "slow node, power |z| vs peers, 1-minute means",
        "slow_node_power_z_5min_median": "slow node, power |z| vs peers, 5-minute means",
    }
    lines = [
        f"largest job: {figures['job_nodes']} nodes; slow node {figures['slow_node']} "
        f"x{figures['slowdown']:g} compute time, no hardware signal"
    ]
    lines += [f"{labels[k]:<72} {v:8.3f}" for k, v in figures.items() if k in labels]
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(measure()))
