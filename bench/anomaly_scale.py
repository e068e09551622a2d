"""CPU cost of one anomaly-service cycle at fleet scale, and how it grows.

For 1,024 nodes (8,192 GPUs, 50 jobs) and then 2,048 and 4,096 nodes, builds PromQL answers shaped
like Prometheus's (one sample per GPU and field, with dcgm-exporter's labels), turns them into a window
(`anomaly.vectors.build_window`, the service's parsing) and runs the detector on it (with a few
stragglers, checkpoints and the per-GPU spread of real fleets), after warm-up cycles that give it
history and its covariance model. Prints CPU seconds per cycle (median, p95, max) for each part.

    python bench/anomaly_scale.py                 # 1,024 / 2,048 / 4,096 nodes
    python bench/anomaly_scale.py --nodes 1024 --cycles 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from anomaly.detector import Detector
from anomaly.queries import Queries
from anomaly.vectors import build_window

GPUS = 8


def fleet(nodes: int, jobs: int, rng: np.random.Generator) -> tuple[list[str], list[tuple[str, list[int]]]]:
    names = [f"n{i:05d}" for i in range(1, nodes + 1)]
    # Job sizes: a few large, many small, filling ~90 % of the fleet.
    weights = rng.pareto(1.2, jobs) + 0.2
    sizes = np.maximum(1, (weights / weights.sum() * nodes * 0.9).astype(int))
    layout, start = [], 0
    for j, size in enumerate(sizes):
        size = int(min(size, nodes - start))
        if size <= 0:
            break
        layout.append((str(100000 + j), list(range(start, start + size))))
        start += size
    return names, layout


def promql_answers(
    names: list[str], layout: list[tuple[str, list[int]]], cycle: int, rng: np.random.Generator
) -> tuple[dict[str, list[dict]], dict[str, list[dict]]]:
    n = len(names)
    offset = np.random.default_rng(n).normal(0.0, 0.03, (n, GPUS))  # layout/silicon: fixed per GPU
    tensor = np.zeros((n, GPUS))
    for j, (_, idx) in enumerate(layout):
        level = 0.45 if (cycle + j) % 40 else 0.015  # now and then a job checkpoints
        tensor[idx] = level
        if j % 10 == 0 and len(idx) >= 4:  # every tenth job has a 20 % straggler
            tensor[idx] *= 0.83
            tensor[idx[1]] = level
    tensor = tensor * np.exp(offset) * (1 + rng.normal(0, 0.02, (n, GPUS)))
    power = 100 + 1100 * tensor
    clock = np.full((n, GPUS), 1980.0)
    job_of = {i: job for job, idx in layout for i in idx}
    fields = {
        "tensor": tensor,
        "power": power,
        "sm_clock": clock,
        "util": np.full((n, GPUS), 100.0),
        "brake": np.zeros((n, GPUS)),
        "thermal": np.zeros((n, GPUS)),
        "pcie_downgraded": np.zeros((n, GPUS)),
        "h2d_bandwidth": np.full((n, GPUS), 5.5e10),
    }
    stamp = 1.8e9 + cycle * 30
    gpu_results: dict[str, list[dict]] = {}
    for key, values in fields.items():
        rows = []
        for i, name in enumerate(names):
            for g in range(GPUS):
                metric = {"node": name, "gpu": str(g), "modelName": "NVIDIA H100 80GB HBM3", "Hostname": name}
                if i in job_of:
                    metric["hpc_job"] = job_of[i]
                rows.append({"metric": metric, "value": [stamp, repr(float(values[i, g]))]})
        gpu_results[key] = rows
    node_results = {
        key: [{"metric": {"node": name}, "value": [stamp, "0"]} for name in names]
        for key in Queries().node_fields()
    }
    return gpu_results, node_results


def measure(nodes: int, jobs: int, cycles: int, warmup: int) -> None:
    rng = np.random.default_rng(nodes)
    names, layout = fleet(nodes, jobs, rng)
    detector = Detector()
    parse_cpu, detect_cpu = [], []
    for cycle in range(warmup + cycles):
        answers = promql_answers(names, layout, cycle, np.random.default_rng((nodes, cycle)))
        started = time.process_time()
        window = build_window(1.8e9 + cycle * 30, *answers, None)
        parsed = time.process_time()
        result = detector.step(window)
        done = time.process_time()
        if cycle >= warmup:
            parse_cpu.append(parsed - started)
            detect_cpu.append(done - parsed)
    flagged = len(detector.flagged())
    total = [a + b for a, b in zip(parse_cpu, detect_cpu, strict=True)]
    print(
        f"{nodes:>5} nodes {nodes * GPUS:>6} GPUs {len(layout):>3} jobs | "
        f"detect median {statistics.median(detect_cpu):.3f} s p95 {np.percentile(detect_cpu, 95):.3f} s | "
        f"parse median {statistics.median(parse_cpu):.3f} s | "
        f"cycle median {statistics.median(total):.3f} s p95 {np.percentile(total, 95):.3f} s "
        f"max {max(total):.3f} s | flagged {flagged} "
        f"(jobs counted {result.counted_jobs}, quiet {result.quiet_jobs})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, nargs="*", default=[1024, 2048, 4096])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=25)
    args = parser.parse_args()
    print(f"CPU seconds per cycle (process time, one core); load average {os.getloadavg()[0]:.2f}")
    for nodes in args.nodes:
        measure(nodes, args.jobs, args.cycles, args.warmup)


if __name__ == "__main__":
    main()
