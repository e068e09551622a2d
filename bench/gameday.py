"""The long game day (issue 46): `fleetsight gameday` for an hour (by default) on a stack of its own, with
the default scenario (evaluation/scenarios/gameday/gameday_hour.yaml: 16 nodes, three jobs, a hardware
fault every 4-5 minutes) and a disruption every 90 s on average across every component kind. Prints the
verdict's tables, then one line per figure the operations guide quotes (docs/operations.md, "Game days"):
alerts delivered / expected with the delay distribution, log lines lost and duplicated, nodes drained
without a fault, faults never acted on, recovery per component kind.

    nice -n 5 .venv/bin/python bench/gameday.py [--seed 1] [--duration 1h] [--mean-gap 90s] [--out DIR]

Takes the duration plus about 10 minutes (the stack's start, the settle, the log ledger, the stop). Run
nothing else heavy beside it: on 2 cores a busy neighbour shows up as slow recoveries.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--duration", default="1h")
    parser.add_argument("--mean-gap", default="90s")
    parser.add_argument("--settle", default="5m")
    parser.add_argument("--out", type=Path, default=None, help="default: a new folder under /tmp")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="fleetsight-gameday-"))
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o755)  # OpenSearch runs as nobody
    command = [
        sys.executable, "-m", "fleetsight.cli", "gameday", "--out", str(out), "--seed", str(args.seed),
        "--duration", args.duration, "--mean-gap", args.mean_gap, "--settle", args.settle,
    ]  # fmt: skip
    print("$", " ".join(command[2:]), flush=True)
    began = time.monotonic()
    done = subprocess.run(command, cwd=REPO)
    wall = time.monotonic() - began
    report_file = out / "report.json"
    if not report_file.exists():
        sys.exit(f"no report in {out} (exit {done.returncode})")
    report = json.loads(report_file.read_text())
    print(f"\nwall time {wall / 60:.1f} min; history in {out / 'history.jsonl'}")
    for line in summary(report):
        print(line)
    sys.exit(done.returncode)


def summary(report: dict) -> list[str]:
    due = [j for j in report["journeys"] if j["due"]]
    delays = sorted(j["slack_s"] for j in due if j["slack_s"] is not None)
    acted = [j for j in due if j["acted_s"] is not None]
    logs = report["logs"] or {}
    wrong = next(i for i in report["invariants"] if i["name"].startswith("no node out of service"))
    lines = [
        f"disruptions: {report['disruptions']} across {report['component_kinds']} component kinds",
        f"alerts delivered / expected: {len(delays)} / {len(due)}",
        "Slack delay after onset: "
        + (
            f"min {delays[0]:.0f} s, median {statistics.median(delays):.0f} s, max {delays[-1]:.0f} s"
            if delays
            else "-"
        ),
        f"log lines: written {logs.get('written')}, lost {logs.get('lost')}, "
        f"duplicated {logs.get('duplicated')}",
        f"nodes drained without a fault: {wrong['evidence']}",
        f"faults never acted on: {len(due) - len(acted)}",
    ]
    for kind, row in report["recovery"].items():
        lines.append(
            f"recovery {kind}: {row['recovered']}/{row['disruptions']} back, "
            f"median {row['median_s']} s, max {row['max_s']} s"
        )
    return lines


if __name__ == "__main__":
    main()
