"""What a straggler flag says about its GPU and its cost (issue 42), against the twin's truth: per scenario
of evaluation/scenarios/anomaly, the flag's cause, `scope` (one GPU or the node), the GPU it names, the
GPU the fault hit, and `impact.gpu_hours_lost` at the flag's clear against the truth's: the job's idle
share (slowdown / (1 + slowdown)) times its GPUs over the time the fault paced the job. The detector
runs in-process, as `fleetsight evaluate anomaly` runs it.

    nice -n 5 .venv/bin/python bench/straggler_impact.py
    nice -n 5 .venv/bin/python bench/straggler_impact.py --scenario thermal_r08_8n --scenario gray_x15_16n
"""

from __future__ import annotations

import argparse

import yaml

from evaluation import anomaly as evaluation
from evaluation.scenarios import resolve

DEFAULT = (
    "psu_cap150_16n",
    "psu_cap450_16n",
    "thermal_r06_8n",
    "thermal_r088_8n",
    "pcie_gen1_16n",
    "pcie_x4_8n",
    "gray_x13_8n",
    "gray_x25_16n",
)


def job_gpus(spec: dict) -> int:
    first, last = str(spec["jobs"][0]["nodes"]).split("-")
    return 8 * (int(last[1:]) - int(first[1:]) + 1)


def row(name: str) -> str:
    path = resolve(name)
    spec = yaml.safe_load(path.read_text())
    run = evaluation.run_scenario(path)
    counted = [e for e in run.episodes if e.counted]
    flags = [e.straggler for e in run.events["detector"] if e.kind == "flag"]
    if len(counted) != 1 or not flags:
        return f"| {name} | {len(counted)} faults, {len(flags)} flags: not scored | | | | | |"
    episode, flag = counted[0], flags[0]
    truth = episode.slowdown / (1 + episode.slowdown) * job_gpus(spec) * episode.pacing_s / 3600
    estimate = flag.evidence["impact"]["gpu_hours_lost"]
    hit = spec["faults"][0]["target"].get("gpu", "node")
    return (
        f"| {name} | {flag.cause} | {flag.evidence['scope']} | {flag.gpu if flag.gpu is not None else '-'} "
        f"| {hit} | {100 * episode.slowdown:.1f} % "
        f"| {estimate:.2f} / {truth:.2f} ({estimate / truth - 1:+.0%}) |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenario", action="append", help="a scenario name or file (repeatable)")
    names = parser.parse_args().scenario or DEFAULT
    print("| scenario | cause | scope | GPU named | fault's GPU | job slowdown (truth) ", end="")
    print("| GPU-h lost: flag / truth |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        print(row(name), flush=True)


if __name__ == "__main__":
    main()
