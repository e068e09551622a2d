"""The straggler detector's evaluation (`fleetsight evaluate anomaly`) for several DetectorConfig variants at
once, one scenario per process, every variant fed the same simulation: what a setting changes on every
scenario set, in one run on one machine.

Each variant is a name and DetectorConfig overrides (`sw5:slow_windows=5`; `none` leaves an optional rule
out: `off:slow_wait=none`; `base` alone is the shipped configuration). The sets are the scenario files of
evaluation/scenarios/anomaly/: `hand` (the hand-written ones), `gen` (drawn by bench/anomaly_scenarios.py,
held out: never looked at while tuning), `p5` (5 % stragglers), `day` (24-hour days of benign
training, no fault: every flag is false; the hand-written one and those drawn by bench/benign_days.py).
Only the detector runs (no baselines). Per variant and set it prints precision, recall
within 15 minutes, false flags and each band's median / p95 latency, and the first wrong flags; `--json`
keeps the whole report, wrong flags and misses included.

Decide what you will pick before you look (say which set chooses and which set confirms): a setting that
helps only the set it was chosen on is tuned to it. The 24-hour day is the longest run (under 2 minutes
on a 16-core lent machine, about 10 on the 2-core VM): with many processes the whole takes about as long.

Examples:
  python bench/anomaly_sweep.py --sample-window 5s --variant base --variant sw5:slow_windows=5
  python bench/anomaly_sweep.py --set hand --set day --variant base --variant k1:slow_k=1 --processes 2
  python bench/anomaly_sweep.py --scenario evaluation/scenarios/anomaly/small_jobs_6n.yaml --json /tmp/s.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import evaluation.anomaly as ev
from anomaly.detector import Detector, DetectorConfig
from evaluation.anomaly_truth import ScenarioRun

SCENARIOS = Path(__file__).resolve().parents[1] / "evaluation" / "scenarios" / "anomaly"
BANDS = ("5%", "10%", "20%", "40%")
BAND_KEYS = ("episodes", "recall_15min", "latency_median_s", "latency_p95_s")
# Longest first, so that the long ones do not start last.
SET_ORDER = ("day", "p5", "gen", "hand")


def scenario_sets() -> dict[str, list[Path]]:
    files = sorted(SCENARIOS.glob("*.yaml"))
    return {
        "day": [SCENARIOS / "benign_training.yaml", *(p for p in files if p.name.startswith("benign_day_"))],
        "p5": [p for p in files if p.name.startswith("p5_")],
        "gen": [p for p in files if p.name.startswith("gen_")],
        "hand": [p for p in files if not p.name.startswith(("gen_", "k8s_", "benign_", "p5_"))],
    }


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """`name` or `name:key=value,key=value`: DetectorConfig fields, each converted to its field's type."""
    name, _, rest = text.partition(":")
    if not name:
        raise argparse.ArgumentTypeError(f"{text!r}: a variant needs a name (name:key=value,...)")
    fields = {f.name: f for f in dataclasses.fields(DetectorConfig)}
    overrides: dict[str, Any] = {}
    for pair in filter(None, rest.split(",")):
        key, eq, value = pair.partition("=")
        if not eq:
            raise argparse.ArgumentTypeError(f"{pair!r} in {text!r}: write key=value")
        if key not in fields:
            raise argparse.ArgumentTypeError(
                f"{key!r} is not a DetectorConfig field; fields: {', '.join(sorted(fields))}"
            )
        if value.lower() == "none" and "None" in str(fields[key].type):
            overrides[key] = None  # an optional setting left out (`slow_wait=none`)
            continue
        kind = type(getattr(DetectorConfig(), key))
        if kind is bool:  # bool("false") is True
            if value.lower() not in ("true", "false"):
                raise argparse.ArgumentTypeError(f"{key}={value!r}: write true or false")
            overrides[key] = value.lower() == "true"
            continue
        try:
            overrides[key] = kind(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{key}={value!r}: not a {kind.__name__}") from exc
    return name, overrides


def detector_of(overrides: dict[str, Any]) -> Callable[[float], Detector]:
    """The detector with these overrides, told each scenario's sample window."""
    return lambda sample_s: Detector(DetectorConfig(sample_average_s=sample_s, **overrides))


def run_one(task: tuple[dict[str, dict[str, Any]], str, str, float | None]) -> tuple[str, ScenarioRun, float]:
    """One simulation of the scenario, every variant's detector fed the same windows (the baselines
    are not run): its events are kept under each variant's name."""
    variants, set_name, path, sample_window = task
    started = time.time()
    detectors = {name: detector_of(overrides) for name, overrides in variants.items()}
    run = ev.run_scenario(Path(path), 30.0, None, None, None, sample_window, detectors)
    return set_name, run, time.time() - started


def figures(report: dict[str, Any]) -> dict[str, Any]:
    bands = report["by_band"]
    return {
        "precision": report.get("precision"),
        "recall_15min": report.get("recall_15min"),
        "false_flags": report.get("false_flag_count"),
        "bands": {
            band: {
                k: bands[band].get(k)
                for k in ("episodes", "recall_15min", "latency_median_s", "latency_p95_s")
            }
            for band in BANDS
            if band in bands and bands[band].get("episodes")
        },
        "wrong": report.get("wrong", []),
        "missed": report.get("missed", []),
    }


def row(variant: str, set_name: str, got: int, wanted: int, fig: dict[str, Any]) -> str:
    bands = " ".join(
        f"{band} {b['latency_median_s']}/{b['latency_p95_s']}s r15={b['recall_15min']}"
        for band, b in fig["bands"].items()
    )
    done = "" if got == wanted else f" (PARTIAL {got}/{wanted})"
    return (
        f"{variant:<10} {set_name:<5}{done} precision {fig['precision']} recall_15min {fig['recall_15min']} "
        f"false flags {fig['false_flags']}  {bands}"
    )


def main() -> int:
    intro, examples = __doc__.split("Examples:")
    parser = argparse.ArgumentParser(
        description=intro, epilog="Examples:" + examples, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--variant", action="append", type=parse_variant, help="name[:key=value,...] (repeat)")
    add("--set", action="append", choices=SET_ORDER, help="a scenario set (repeat); default: all")
    add("--scenario", action="append", type=Path, help="a scenario file instead of the sets (repeat)")
    add("--sample-window", help="what each DCGM sample averages (1s, 5s); default: the scenario's")
    add("--processes", type=int, default=os.cpu_count() or 1, help="default: every core")
    add("--json", type=Path, help="write the whole reports here")
    args = parser.parse_args()
    variants = dict(args.variant or [("base", {})])
    if args.scenario:
        missing = [str(p) for p in args.scenario if not p.is_file()]
        if missing:
            parser.error(f"no such scenario file: {', '.join(missing)}")
        sets = {"custom": args.scenario}
    else:
        chosen = set(args.set or SET_ORDER)
        sets = {name: paths for name, paths in scenario_sets().items() if name in chosen}
    sample = ev.parse_duration(args.sample_window) if args.sample_window else None
    ordered = sorted(sets, key=lambda name: SET_ORDER.index(name) if name in SET_ORDER else -1)
    tasks = [(variants, set_name, str(path), sample) for set_name in ordered for path in sets[set_name]]
    print(
        f"{len(tasks)} scenario runs, each for {len(variants)} variants, {args.processes} processes",
        file=sys.stderr,
    )
    started = time.time()
    runs: dict[str, list[ScenarioRun]] = {}
    with multiprocessing.get_context("fork").Pool(max(1, args.processes)) as pool:
        for done, (set_name, run, _) in enumerate(pool.imap_unordered(run_one, tasks), 1):
            runs.setdefault(set_name, []).append(run)
            print(
                f"\r{done}/{len(tasks)} runs, {time.time() - started:.0f} s",
                end="",
                file=sys.stderr,
                flush=True,
            )
    print(file=sys.stderr)
    result: dict[str, Any] = {"wall_s": round(time.time() - started, 1), "sample_window": args.sample_window}
    for variant in sorted(variants):
        for set_name, got in sorted(runs.items()):
            fig = figures(ev.score(got, variant))
            result.setdefault(variant, {"overrides": variants[variant]})[set_name] = fig
            print(row(variant, set_name, len(got), len(sets[set_name]), fig))
            for wrong in fig["wrong"][:10]:  # where to look first; --json keeps them all
                where = f"{wrong['scenario']} job {wrong['job']} {wrong['node']}"
                print(f"    wrong flag: {where} at {wrong['time']:.0f}")
    print(f"{result['wall_s']} s wall")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
