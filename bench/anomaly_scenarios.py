"""Write random evaluation scenarios for the straggler detector (evaluation/scenarios/anomaly/gen_*.yaml).

The shipped scenarios are hand-written; a detector tuned to them proves little. This draws clusters of
4 to 64 nodes with one to four jobs (dense and mixture-of-experts, small jobs included), one to three
faults per scenario (gray slow nodes, thermal throttling, PCIe downgrades, power brakes), half of them
near the detection limit (x1.03-x1.10 gray nodes, clocks at 0.88-0.97, caps of 400-550 W), one after
the other within a job and sometimes two stragglers in one job at once, and a fault-free scenario
every sixth. The twin adds its benign
disturbances (data-loader hiccups, OS jitter, slow logging) from each scenario's seed.

    python bench/anomaly_scenarios.py --first-seed 3000 --count 30    # writes gen_3000 .. gen_3029
    fleetsight evaluate anomaly --scenario evaluation/scenarios/anomaly/gen_*.yaml
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from evaluation.scenarios import write_drawn

OUT = Path(__file__).resolve().parent.parent / "evaluation" / "scenarios" / "anomaly"
PROFILES = ("llm-8b", "llm-20b", "llm-70b", "moe-8x22b", "vision")
KINDS = ("gray_slow_node", "thermal_throttle", "pcie_downgrade", "psu_failure")


def node(i: int) -> str:
    return f"n{i:04d}"


def draw_jobs(rng: np.random.Generator, nodes: int) -> list[dict]:
    """Split the cluster into one to four jobs of at least two nodes (leftover nodes idle)."""
    count = int(rng.integers(1, 5))
    jobs, first = [], 1
    for j in range(count):
        left = nodes - first + 1
        if left < 2:
            break
        size = left if j == count - 1 else int(rng.integers(2, max(3, left - 2 * (count - j - 1)) + 1))
        size = min(size, left)
        profile = str(rng.choice(PROFILES))
        if rng.random() < 0.2:  # small MoE jobs: few nodes whose expert load drifts
            profile, size = "moe-8x22b", min(left, int(rng.integers(2, 5)))
        job = {
            "id": str(9100 + j),
            "name": f"{profile}-{j}",
            "nodes": f"{node(first)}-{node(first + size - 1)}",
            "profile": profile,
            "checkpoint_interval": f"{int(rng.integers(10, 31))}m",
        }
        if profile in ("llm-70b", "moe-8x22b") and size % 2:
            job["pipeline_stages"] = 1  # pipeline stages must divide the job's nodes
        jobs.append(job)
        first += size
    return jobs


def draw_fault(rng: np.random.Generator, target_node: str, onset: int, near_limit: bool) -> dict:
    kind = str(rng.choice(KINDS))
    target: dict = {"node": target_node}
    if kind == "gray_slow_node":
        magnitude = rng.uniform(1.03, 1.10) if near_limit else rng.uniform(1.1, 1.6)
    elif kind == "thermal_throttle":
        target["gpu"] = int(rng.integers(0, 8))
        magnitude = rng.uniform(0.88, 0.97) if near_limit else rng.uniform(0.5, 0.88)
    elif kind == "pcie_downgrade":
        target["gpu"] = int(rng.integers(0, 8))
        magnitude = float(rng.integers(3, 5)) if near_limit else float(rng.integers(1, 3))
        target["gen"] = int(magnitude)
    else:
        target["psu"] = int(rng.integers(0, 2))
        magnitude = rng.uniform(400, 550) if near_limit else rng.uniform(120, 400)
    return {
        "kind": kind,
        "target": target,
        "onset": f"{onset}m",
        "duration": f"{int(rng.integers(8, 21))}m",
        "magnitude": round(float(magnitude), 3),
    }


def job_nodes(job: dict) -> list[str]:
    a, b = (int(part[1:]) for part in job["nodes"].split("-"))
    return [node(i) for i in range(a, b + 1)]


def draw(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    nodes = int(rng.choice([4, 6, 8, 12, 16, 24, 32, 48, 64]))
    jobs = draw_jobs(rng, nodes)
    fault_free = seed % 6 == 5
    faults: list[dict] = []
    free_at = {job["id"]: 8 for job in jobs}  # minute from which a job's next fault may start
    used: set[str] = set()  # one fault per node: the truth names an episode by node and job
    for _ in range(0 if fault_free else int(rng.integers(1, 4))):
        job = jobs[int(rng.integers(0, len(jobs)))]
        members = [m for m in job_nodes(job) if m not in used]
        onset = free_at[job["id"]] + int(rng.integers(0, 10))
        if len(members) < 2 or onset > 45:
            continue
        first = str(rng.choice(members))
        group = [draw_fault(rng, first, onset, rng.random() < 0.5)]
        if rng.random() < 0.2 and len(members) >= 4:  # two stragglers in one job at once
            other = str(rng.choice([m for m in members if m != first]))
            group.append(draw_fault(rng, other, onset + int(rng.integers(0, 5)), rng.random() < 0.5))
        # Otherwise a job's faults do not overlap: the twin's truth gives every fault of a job the
        # job's whole slowdown, so a mild fault beside a loud one would count as a loud straggler.
        faults.extend(group)
        used.update(f["target"]["node"] for f in group)
        end = max(int(f["onset"][:-1]) + int(f["duration"][:-1]) for f in group)
        free_at[job["id"]] = end + int(rng.integers(3, 9))
    return {
        "name": f"gen_{seed}",
        "description": f"generated by bench/anomaly_scenarios.py (seed {seed}): {nodes} nodes, "
        f"{len(jobs)} job(s), {len(faults)} fault(s)",
        "seed": seed,
        "start": "2026-11-22T06:00:00Z",
        "duration": "1h" if not fault_free else "3h",
        "tick": "5s",
        "scrape_failure_rate": 0.001,
        "cluster": {"name": "gen", "nodes": nodes},
        "jobs": jobs,
        "faults": faults,
    }


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--first-seed", type=int, default=3000)
    parser.add_argument("--count", type=int, default=30)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    write_drawn(args.out, "gen", range(args.first_seed, args.first_seed + args.count), draw, width=120)


if __name__ == "__main__":
    main()
