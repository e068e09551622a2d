"""Twin scale benchmark: prints the two figures the twin must reach.

1. 1,024 nodes (8,192 GPUs), 1 hour of 5-second ticks at --speed max, all per-node files written.
   Target: 5 minutes or less.
2. 256 nodes served in real time on one core: per 5-second tick, the physics, every node's files
   rewritten, and one scrape of every node's dcgm-exporter page plus the Redfish, UFM and Slurm views.
   Target: under 5 seconds of CPU per tick.

Usage: .venv/bin/python bench/twin_scale.py [--nodes-max 1024] [--hours 1] [--nodes-serve 256] [--ticks 36]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

from twin import render
from twin.runner import Runner, RunOptions
from twin.scenario import from_dict


def scenario(nodes: int, hours: float) -> dict:
    job_nodes = max(1, nodes // 4)
    return {
        "name": f"bench-{nodes}",
        "seed": 9,
        "duration": f"{hours}h",
        "cluster": {"name": "bench", "nodes": nodes},
        "jobs": [
            {"id": str(7000 + i), "nodes": job_nodes, "profile": "llm-70b", "checkpoint_interval": "20m"}
            for i in range(3)
        ],
        "random_faults": {"every": "5m", "duration": ["2m", "10m"]},
    }


def max_speed(nodes: int, hours: float, out: Path) -> None:
    runner = Runner(from_dict(scenario(nodes, hours)), RunOptions(out=out, speed=None))
    summary = runner.run()
    files = sum(1 for _ in out.rglob("*"))
    print(
        f"max speed: {nodes} nodes ({nodes * 8} GPUs) x {hours:g} h at 5 s = {summary.ticks} ticks in "
        f"{summary.wall_seconds:.1f} s wall ({summary.ticks / summary.wall_seconds:.1f} ticks/s, "
        f"{summary.sim_seconds / summary.wall_seconds:.0f}x real time); {files} paths under {out.name}; "
        f"target <= 300 s: {'OK' if summary.wall_seconds <= 300 else 'MISSED'}"
    )


def served_one_core(nodes: int, ticks: int, out: Path) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    runner = Runner(from_dict(scenario(nodes, 1)), RunOptions(out=out, speed=None))
    sim, writer = runner.sim, runner.writer
    writer.create()
    per_tick: list[float] = []
    for _ in range(ticks):
        cpu0 = time.process_time()
        sim.advance()
        writer.write_state()
        writer.flush_logs()
        for index in range(len(sim.nodes)):  # Prometheus scrapes every node once per tick
            render.dcgm_metrics(sim, index)
            render.redfish(sim, index, "/redfish/v1/Chassis/1/Power")
        render.ufm_ports(sim)
        render.slurm_jobs(sim)
        per_tick.append(time.process_time() - cpu0)
    per_tick.sort()
    mean = sum(per_tick) / len(per_tick)
    p95 = per_tick[int(0.95 * (len(per_tick) - 1))]
    print(
        f"served real time on one core: {nodes} nodes, {ticks} ticks: CPU per 5 s tick mean {mean:.2f} s, "
        f"p95 {p95:.2f} s (files + physics + one scrape of every endpoint); "
        f"headroom {5.0 / p95:.1f}x; target < 5 s: {'OK' if p95 < 5.0 else 'MISSED'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes-max", type=int, default=1024)
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--nodes-serve", type=int, default=256)
    parser.add_argument("--ticks", type=int, default=36)
    parser.add_argument("--keep", action="store_true", help="keep the output folders")
    parser.add_argument("--dir", default=None, help="where to write (e.g. /dev/shm for tmpfs)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="twin-bench-", dir=args.dir))
    try:
        served_one_core(args.nodes_serve, args.ticks, base / "served")
        max_speed(args.nodes_max, args.hours, base / "max")
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MiB")


if __name__ == "__main__":
    main()
