"""How far a gray node in a 2-node mixture-of-experts job stands out from the job's own routing drift.

A gray slow node has no hardware signal; in a 2-node job its only trace is its tensor activity rising
against its one peer's. Expert routing moves load between the two nodes too, slowly (the twin's
Ornstein-Uhlenbeck walk, ~10 minutes of memory), and each DCGM window samples a short slice of the
step. This bench runs the twin (no detector involved) and measures, per node, the "rise": the mean
residual ``log(node tensor / peer tensor)`` of the last A windows minus that of the B windows before
them, for several (A, B). It prints the largest rise any node of a fault-free job showed and the
largest rise the gray node showed within 5 minutes of its onset, for each magnitude and seed. Where
the gray node's rise is not above the fault-free maximum, no threshold on these metrics separates it
without flagging healthy jobs.

    python bench/anomaly_small_moe_limit.py                       # x1.2, x1.3, x1.5 over seeds 1-3
    python bench/anomaly_small_moe_limit.py --magnitudes 1.25 --seeds 4 5 6 --hours 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evaluation.anomaly_feed import TwinFeed

WINDOW_S = 30.0
SPANS = ((3, 8), (6, 12), (10, 20))  # (windows after, windows before)
JOBS = 3  # 2-node MoE jobs side by side; the gray node sits in the first one
GRAY_ONSET_S = 1500  # after the job's warm-up and its first checkpoint
GRAY_DURATION_S = 900


def scenario(seed: int, hours: float, magnitude: float | None) -> dict:
    jobs = [
        {
            "id": str(100 + j),
            "name": f"moe-{j}",
            "nodes": f"n{2 * j + 1:04d}-n{2 * j + 2:04d}",
            "profile": "moe-8x22b",
            "checkpoint_interval": f"{15 + 5 * j}m",
        }
        for j in range(JOBS)
    ]
    faults = []
    if magnitude is not None:
        faults.append(
            {
                "kind": "gray_slow_node",
                "target": {"node": "n0001"},
                "onset": f"{GRAY_ONSET_S}s",
                "duration": f"{GRAY_DURATION_S}s",
                "magnitude": magnitude,
            }
        )
    return {
        "name": "small_moe_limit",
        "description": "2-node mixture-of-experts jobs, one gray node or none",
        "seed": seed,
        "start": "2026-11-22T06:00:00Z",
        "duration": f"{int(hours * 3600)}s",
        "tick": "5s",
        "cluster": {"name": "limit", "nodes": 2 * JOBS},
        "jobs": jobs,
        "faults": faults,
    }


def residual_series(path: Path) -> tuple[np.ndarray, dict[str, np.ndarray], float]:
    """Per node: log(its median GPU tensor activity / its peer's), one value per busy window (NaN when
    the job is idle: start-up, checkpoints); and the gray fault's own slowdown of its job (the twin's
    truth, ``fault_slowdown`` - 1; NaN without a fault)."""
    feed = TwinFeed(path, WINDOW_S)
    times, series = [], {}
    for window in feed.windows():
        times.append(window.end)
        for nodes in window.jobs.values():
            if len(nodes) != 2:
                continue
            level = np.nanmedian(window.tensor[nodes], axis=1)
            busy = np.nanmax(level) >= 0.05
            for me, peer in ((0, 1), (1, 0)):
                value = float(np.log(level[me] / level[peer])) if busy and level.min() > 0 else np.nan
                series.setdefault(window.nodes[nodes[me]], []).append(value)
    start = times[0] - WINDOW_S
    feed.sim.refresh_truth()
    slowdowns = [
        line["fault_slowdown"] - 1.0
        for line in feed.sim.truth_lines
        if line["kind"] == "gray_slow_node" and line.get("fault_slowdown")
    ]
    slowdown = max(slowdowns) if slowdowns else float("nan")
    return np.array(times) - start, {name: np.array(values) for name, values in series.items()}, slowdown


def rises(values: np.ndarray, after: int, before: int) -> np.ndarray:
    """Mean of the last ``after`` windows minus the mean of the ``before`` before them, per window
    (NaN until there are enough)."""
    out = np.full(len(values), np.nan)
    for i in range(after + before, len(values) + 1):
        recent, earlier = values[i - after : i], values[i - after - before : i - after]
        if np.isfinite(recent).sum() >= after - 1 and np.isfinite(earlier).sum() >= before // 2:
            out[i - 1] = np.nanmean(recent) - np.nanmean(earlier)
    return out


def run(seed: int, hours: float, magnitude: float | None, folder: Path) -> tuple[np.ndarray, dict, float]:
    path = folder / f"limit_{seed}_{magnitude}.yaml"
    path.write_text(yaml.safe_dump(scenario(seed, hours, magnitude), sort_keys=False))
    return residual_series(path)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--magnitudes", type=float, nargs="+", default=[1.2, 1.3, 1.5])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--hours", type=float, default=1.0, help="length of each run (default 1)")
    args = parser.parse_args()
    if args.hours * 3600 < GRAY_ONSET_S + GRAY_DURATION_S:
        needed = (GRAY_ONSET_S + GRAY_DURATION_S) / 3600
        parser.error(f"--hours must cover the gray node's onset and duration ({needed:g} h)")
    header = " ".join(f"{f'{a}/{b}':>8}" for a, b in SPANS)
    print("largest rise (log) of a node against its peer; columns: windows after/before", end=" ")
    print(f"({WINDOW_S:.0f} s each); the gray node's own slowdown of its job")
    print(f"{'run':<34} {header}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        fault_free = {span: [] for span in SPANS}
        for seed in args.seeds:
            _, series, _ = run(seed, args.hours, None, folder)
            for span in SPANS:
                fault_free[span].extend(np.nanmax(rises(v, *span)) for v in series.values())
            row = " ".join(f"{max(fault_free[s][-len(series) :]):8.3f}" for s in SPANS)
            print(f"{f'fault-free, seed {seed} (6 nodes)':<34} {row}", flush=True)
        print(f"{'fault-free, all seeds':<34} " + " ".join(f"{max(fault_free[s]):8.3f}" for s in SPANS))
        for magnitude in args.magnitudes:
            for seed in args.seeds:
                times, series, slowdown = run(seed, args.hours, magnitude, folder)
                near_onset = (times > GRAY_ONSET_S) & (times <= GRAY_ONSET_S + 300)
                row = []
                for span in SPANS:
                    gray = rises(series["n0001"], *span)[near_onset]
                    best = np.nanmax(gray) if np.isfinite(gray).any() else float("nan")
                    mark = "*" if best > max(fault_free[span]) else " "
                    row.append(f"{best:7.3f}{mark}")
                label = f"gray x{magnitude:g}, seed {seed}"
                print(f"{label:<34} {' '.join(row)}   slows its job {slowdown:.1%}", flush=True)
    print("* above every fault-free rise: separable at that span without a false flag on these runs")


if __name__ == "__main__":
    main()
