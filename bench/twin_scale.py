"""Twin scale benchmark: prints the two figures the twin must reach.

1. 1,024 nodes (8,192 GPUs), 1 hour of 5-second ticks at --speed max, all per-node files written.
   Target: 5 minutes or less.
2. 256 nodes served in real time on one core: per 5-second tick, the physics, every node's files
   rewritten, and one scrape of every node's dcgm-exporter page plus the Redfish, UFM and Slurm views.
   Target: under 5 seconds of CPU per tick, and under 5 seconds of wall time (a disk file system can
   make the process wait on I/O without using CPU).

Both write under the system's temp folder (a disk file system, as a user's --out usually is) unless
--dir says otherwise; --compare-shm repeats the served figure on /dev/shm (tmpfs). Each figure names
the file system it measured and the load average, since other work on the machine skews them.

Usage: .venv/bin/python bench/twin_scale.py [--nodes-max 1024] [--hours 1] [--nodes-serve 256] [--ticks 36]
       [--dir PATH] [--compare-shm] [--skip-max]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from twin import dcgm, render
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
        f"{summary.sim_seconds / summary.wall_seconds:.0f}x real time) on {file_system(out)} "
        f"(load average {load_average()}); {files} paths under {out.name}; "
        f"target <= 300 s: {'OK' if summary.wall_seconds <= 300 else 'MISSED'}"
    )


def file_system(path: Path) -> str:
    """The type and mount point of the file system holding path, from /proc/mounts."""
    best = ("?", "")
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return "unknown"
    resolved = str(path.resolve())
    for line in mounts:
        fields = line.split()
        mount, kind = fields[1], fields[2]
        inside = resolved == mount or resolved.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) > len(best[1]):
            best = (kind, mount)
    return f"{best[0]} at {best[1]}"


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def served_one_core(nodes: int, ticks: int, out: Path) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    runner = Runner(from_dict(scenario(nodes, 1)), RunOptions(out=out, speed=None))
    sim, writer = runner.sim, runner.writer
    wall0, cpu0 = time.monotonic(), time.process_time()
    writer.create()
    setup_wall, setup_cpu = time.monotonic() - wall0, time.process_time() - cpu0
    cpu, wall = [], []
    writes0, renames0 = writer.cache.writes, writer.cache.renames
    for tick in range(ticks + 1):
        wall0, cpu0 = time.monotonic(), time.process_time()
        sim.advance()
        writer.write_state()
        writer.flush_logs()
        for index in range(len(sim.nodes)):  # Prometheus scrapes every node once per tick
            dcgm.metrics(sim, index)
            render.power(sim, index)
        render.ufm_ports(sim)
        render.slurm_jobs(sim)
        if tick == 0:  # the first tick writes every file once: start-up, not the steady state
            writes0, renames0 = writer.cache.writes, writer.cache.renames
            continue
        cpu.append(time.process_time() - cpu0)
        wall.append(time.monotonic() - wall0)
    worst = max(max(cpu), max(wall))
    print(
        f"served real time on one core: {nodes} nodes, {ticks} ticks, on {file_system(out)} "
        f"(load average {load_average()}):\n"
        f"  start-up (create every file): {setup_wall:.1f} s wall, {setup_cpu:.1f} s CPU\n"
        f"  per 5 s tick: CPU mean {np.mean(cpu):.2f} s, p95 {np.percentile(cpu, 95):.2f} s, "
        f"max {max(cpu):.2f} s; wall mean {np.mean(wall):.2f} s, p95 {np.percentile(wall, 95):.2f} s, "
        f"max {max(wall):.2f} s\n"
        f"  files written per tick {(writer.cache.writes - writes0) / ticks:.0f} "
        f"(of {len(writer.cache.content)}), renamed {(writer.cache.renames - renames0) / ticks:.0f}; "
        f"headroom {5.0 / worst:.1f}x; target < 5 s: {'OK' if worst < 5.0 else 'MISSED'}"
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
    parser.add_argument(
        "--dir", default=tempfile.gettempdir(), help="where to write (default: the system temp folder)"
    )
    parser.add_argument(
        "--compare-shm", action="store_true", help="also measure the served figure on /dev/shm (tmpfs)"
    )
    parser.add_argument("--skip-max", action="store_true", help="leave out the 1,024-node max-speed hour")
    args = parser.parse_args()
    places = [args.dir] + (["/dev/shm"] if args.compare_shm else [])
    for place in places:
        base = Path(tempfile.mkdtemp(prefix="twin-bench-", dir=place))
        try:
            served_one_core(args.nodes_serve, args.ticks, base / "served")
            if place == args.dir and not args.skip_max:
                max_speed(args.nodes_max, args.hours, base / "max")
        finally:
            if not args.keep:
                shutil.rmtree(base, ignore_errors=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MiB")


if __name__ == "__main__":
    main()
