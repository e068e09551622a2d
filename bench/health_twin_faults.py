"""Every twin fault kind through the live stack into the health service, in real time: prints, per
fault, the state and reason its node reached and how long after onset, and when it came back (the
table in docs/health.md). Then the mass-failure scenario: a scalable unit's IB ports down at once, with
the shipped circuit breaker.

    .venv/bin/python bench/health_twin_faults.py [--out DIR] [--port-base 36000] [--only faults|mass]

About 10 minutes for the fault scenario (8 simulated minutes in real time plus start-up and a minute to
settle) and 7 for the mass failure. Needs `fleetsight setup` (Prometheus, Alertmanager).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "tests" / "health" / "scenarios"


def write_policy(folder: Path, **changes: dict) -> Path:
    """The shipped policy with a shorter hysteresis (the scenario is minutes long, not hours)."""
    policy = yaml.safe_load((REPO / "health" / "policy.yml").read_text())
    for key, value in changes.items():
        policy[key].update(value)
    path = folder / "policy.yml"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(policy))
    return path


def run(scenario: str, out: Path, port_base: int, policy: Path) -> dict:
    command = [
        sys.executable,
        "-m",
        "fleetsight.cli",
        "evaluate",
        "health",
        "--scenario",
        str(SCENARIOS / scenario),
        "--out",
        str(out),
        "--policy",
        str(policy),
        "--port-base",
        str(port_base),
    ]
    subprocess.run(command, cwd=REPO, check=True)
    return json.loads((out / "report.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("/tmp/health-bench"))
    parser.add_argument("--port-base", type=int, default=36000)
    parser.add_argument("--only", choices=("faults", "mass"))
    args = parser.parse_args()
    quick = {"hysteresis": {"clean_for": "30s"}, "refresh": {"interval": "2s"}}
    if args.only in (None, "faults"):
        # one fault per node: the breaker may not hold any of them here (mass_failure.yaml tests it)
        policy = write_policy(
            args.out / "faults",
            **quick,
            circuit_breaker={"max_cluster_fraction": 1.0, "max_unit_fraction": 1.0},
        )
        report = run("health_faults.yaml", args.out / "faults", args.port_base, policy)
        print("bystanders (no fault, left healthy):", json.dumps(report["bystanders"]))
    if args.only in (None, "mass"):
        policy = write_policy(args.out / "mass", **quick)
        report = run("mass_failure.yaml", args.out / "mass", args.port_base, policy)
        print("held by the breaker:", report["held_by_breaker"])
        print("HealthCircuitBreakerOpen alerts active at once (most):", report["breaker_alerts_at_once"])
        print("drain list at the end:", json.dumps(report["final_drain_list"]))


if __name__ == "__main__":
    main()
