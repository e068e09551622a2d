"""Write random days of benign training for the straggler detector (evaluation/scenarios/anomaly/
benign_day_<seed>.yaml): no fault, every benign training kind many times, so that false flags per
1,000 node-hours are measured on days nobody tuned against (issue 42 asks 0 in 2,000 node-hours).

Each day draws its own jobs on 32 nodes (dense and mixture-of-experts, 2 to 12 nodes, some starting or
ending within the day, a few nodes sometimes idle) and places, per job: a staggered checkpoint every
25-60 minutes, an evaluation pass every 2-5 hours, expert routing that moves every 2-5 minutes for spans
of 1-6 hours (MoE jobs), the pipeline's bubble and busy first and last stages (pipeline-parallel jobs),
and restarts on fewer or as many nodes (elastic jobs); one of the first three jobs is a mixture-of-experts
one, and a day is drawn again until every training kind occurs at least twice. The twin adds its drawn
data-loader hiccups, OS jitter and slow rank logging from the day's seed. Magnitudes stay in the twin's
documented ranges (docs/twin.md, the training kinds).

    python bench/benign_days.py --first-seed 4401 --count 2     # writes benign_day_4401, benign_day_4402
    python bench/anomaly_sweep.py --set day --sample-window 5s      # every shipped day, false flags
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from evaluation.scenarios import write_drawn
from twin.fault_kinds import TRAINING_KINDS

OUT = Path(__file__).resolve().parent.parent / "evaluation" / "scenarios" / "anomaly"
NODES = 32
DAY_MIN = 24 * 60
# profile -> pipeline stages it may run with
PROFILES = {"llm-8b": (1,), "llm-20b": (1, 2), "llm-70b": (2, 4), "moe-8x22b": (1, 2), "vision": (1,)}
SIZES = (2, 3, 4, 4, 5, 6, 6, 7, 8, 8, 12)


@dataclass
class DrawnJob:
    spec: dict
    stages: int
    size: int
    start: int  # minutes into the day
    end: int


def node(i: int) -> str:
    return f"n{i:04d}"


def draw_jobs(rng: np.random.Generator, seed: int) -> list[DrawnJob]:
    """Jobs on contiguous node ranges until the cluster is full; a few nodes may stay idle. One of the
    first three is a mixture-of-experts job: routing is the benign kind that looks most like a straggler."""
    jobs: list[DrawnJob] = []
    first = 1
    moe_at = int(rng.integers(0, 3))
    while NODES - first + 1 >= 2:
        left = NODES - first + 1
        profile = "moe-8x22b" if len(jobs) == moe_at else str(rng.choice(list(PROFILES)))
        stages = int(rng.choice(PROFILES[profile]))
        size = min(int(rng.choice(SIZES)), left)
        size -= size % stages
        if size < max(2, stages):
            continue  # draw again: a 1-stage profile always fits in two nodes
        start = 0 if rng.random() < 0.7 else int(rng.integers(60, 12 * 60))
        end = DAY_MIN if rng.random() < 0.7 else int(rng.integers(start + 4 * 60, DAY_MIN + 1))
        spec: dict = {
            "id": f"{seed % 1000 + 8000}{len(jobs)}",
            "name": f"{profile}-{len(jobs)}",
            "nodes": f"{node(first)}-{node(first + size - 1)}",
            "profile": profile,
            "pipeline_stages": stages,
            "checkpoint_interval": "48h",  # the day's checkpoints are placed below
        }
        if start:
            spec["start"] = f"{start}m"
        if end < DAY_MIN:
            spec["end"] = f"{end}m"
        jobs.append(DrawnJob(spec, stages, size, start, end))
        first += size + (1 if rng.random() < 0.15 else 0)  # now and then an idle node
    return jobs


def every(rng: np.random.Generator, start: int, end: int, low: int, high: int) -> list[int]:
    """Onsets (minutes) from start + a first gap up to end - 10, gaps drawn in [low, high]."""
    onsets, t = [], start + int(rng.integers(low // 2, high))
    while t < end - 10:
        onsets.append(t)
        t += int(rng.integers(low, high + 1))
    return onsets


def job_events(rng: np.random.Generator, job: DrawnJob) -> list[dict]:
    target = {"job": job.spec["id"]}
    events: list[dict] = []
    if job.stages >= 2 and rng.random() < 0.8:
        events.append(
            fault("pipeline_bubble", {**target, "micro_batches": int(rng.choice([4, 8, 16, 32]))}, job.start,
                  f"{job.end - job.start}m", round(float(rng.uniform(0.03, 0.10)), 2))
        )  # fmt: skip
    for t in every(rng, job.start, job.end, 25, 60):
        write_s = int(rng.choice([60, 75, 90, 105, 120]))
        events.append(fault("checkpoint_stall", target, t, f"{write_s}s", int(rng.integers(2, 11))))
    for t in every(rng, job.start, job.end, 120, 300):
        minutes = int(rng.integers(3, 7))
        events.append(fault("eval_pause", target, t, f"{minutes}m", round(float(rng.uniform(0.3, 0.6)), 1)))
    if job.spec["profile"] == "moe-8x22b":
        t = job.start + int(rng.integers(10, 60))
        while t < job.end - 30:
            span = min(int(rng.integers(60, 361)), job.end - t)
            moves = {**target, "every": f"{int(rng.integers(2, 6))}m"}
            events.append(
                fault("moe_imbalance", moves, t, f"{span}m", round(float(rng.uniform(0.05, 0.2)), 2))
            )
            t += span + int(rng.integers(20, 120))
    if job.size >= 4 and rng.random() < 0.4:  # an elastic job: restarts on fewer nodes, or as many
        sizes = [s for s in range(job.stages, job.size + 1, job.stages) if s >= 2]
        for t in every(rng, job.start, job.end, 120, 360):
            events.append(fault("job_resize", {**target, "nodes": int(rng.choice(sizes))}, t, "2m", 1))
    return events


def fault(kind: str, target: dict, onset: int, duration: str, magnitude: float) -> dict:
    """A scenario's fault entry; onset in minutes into the day, duration as the twin reads it (90s, 5m)."""
    return {
        "kind": kind,
        "target": target,
        "onset": f"{onset}m",
        "duration": duration,
        "magnitude": magnitude,
    }


def draw_day(seed: int) -> dict:
    """One day; drawn again (from the same generator, so still from the seed alone) until every
    training kind occurs at least twice, as in the hand-written day."""
    rng = np.random.default_rng(seed)
    for _ in range(200):
        jobs = draw_jobs(rng, seed)
        events = sorted((e for job in jobs for e in job_events(rng, job)), key=lambda e: int(e["onset"][:-1]))
        drawn = [e["kind"] for e in events]
        if all(drawn.count(kind) >= 2 for kind in TRAINING_KINDS):
            break
    else:
        raise SystemExit(f"seed {seed}: no day with every training kind twice in 200 draws")
    kinds = sorted(set(drawn))
    return {
        "name": f"benign_day_{seed}",
        "description": f"benign only, drawn by bench/benign_days.py (seed {seed}): {len(jobs)} jobs on "
        f"{NODES} nodes, {len(events)} training events ({', '.join(kinds)}), no fault",
        "seed": seed,
        "start": "2026-11-24T00:00:00Z",
        "duration": "24h",
        "tick": "5s",
        "scrape_failure_rate": 0.002,
        "cluster": {"name": "eval", "nodes": NODES},
        "jobs": [job.spec for job in jobs],
        "faults": events,
    }


def main() -> None:
    intro, examples = __doc__.split("    python", 1)
    parser = argparse.ArgumentParser(
        description=intro,
        epilog="Examples:\n    python" + examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--first-seed", type=int, required=True, help="the first day's seed")
    parser.add_argument(
        "--count", type=int, default=1, help="days to write (seeds first-seed, first-seed + 1, ...)"
    )
    parser.add_argument("--out", type=Path, default=OUT, help="folder (default: the evaluation's scenarios)")
    args = parser.parse_args()
    if args.count < 1:
        parser.error("--count must be at least 1")
    write_drawn(
        args.out, "benign_day", range(args.first_seed, args.first_seed + args.count), draw_day, width=200
    )


if __name__ == "__main__":
    main()
