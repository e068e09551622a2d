"""How long the memory scan plan (checks/policy.yml `scans.memory`) takes to cover a busy cluster, and
whether every node is scanned within `every_days`.

    .venv/bin/python bench/scan_coverage.py                 # the table in docs/checks.md ("Scan plan")
    .venv/bin/python bench/scan_coverage.py --nodes 1024 --days 90 --utilisation 0.95

The pure planner (checks/scan.py over checks/plan.py) runs one pass every 5 simulated minutes over
nodes that alternate jobs (hours to days) and idle gaps (tests/scan_sim.py says how the pattern is made),
with the one-per-leaf rule (32 nodes per leaf, the twin's scalable unit), the pass's budget and the
scan's own. Columns: days until every node had one completed scan (from none), the longest any node
went without one, the nodes that went longer than every_days (late) and those past due at the end,
and the job time the scans delayed (an upper bound: a job due on a node under scan waits for it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from scan_sim import HOUR, SimConfig, simulate

COLUMNS = (
    "nodes", "every_days", "budget", "utilisation", "scan_h", "days_to_full", "max_gap_days", "late",
    "overdue_at_end", "scans", "delay_h_per_1000_node_days",
)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--days", type=float, default=60.0, help="simulated days (default 60: two cycles)")
    parser.add_argument("--every-days", type=float, default=30.0)
    parser.add_argument("--rescan-after-days", type=float, default=20.0)
    parser.add_argument("--budget", type=int, default=8, help="the pass's --budget (nodes under test)")
    parser.add_argument("--scan-budget", type=int, default=4, help="the scan's own budget")
    parser.add_argument(
        "--utilisation", type=float, action="append", help="repeat; default 0.8 0.9 0.95 0.98"
    )
    parser.add_argument(
        "--scan-hours", type=float, action="append", help="repeat; default 0.75 (catalogue), 2"
    )
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.nodes <= 0 or args.days <= 0 or any(not 0 < u < 1 for u in args.utilisation or []):
        parser.error("--nodes and --days must be positive and --utilisation between 0 and 1 (exclusive)")
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for utilisation in args.utilisation or [0.8, 0.9, 0.95, 0.98]:
        for hours in args.scan_hours or [2700 / HOUR, 2.0]:
            config = SimConfig(
                nodes=args.nodes, every_days=args.every_days, rescan_after_days=args.rescan_after_days,
                budget=args.budget, scan_budget=args.scan_budget, utilisation=utilisation,
                scan_hours=hours, days=args.days, seed=args.seed,
            )  # fmt: skip
            row = simulate(config).row()
            print("| " + " | ".join("never" if row[c] is None else str(row[c]) for c in COLUMNS) + " |")
    stuck = simulate(
        SimConfig(nodes=args.nodes, days=args.days, never_idle=("n0003",), blind=("n0007",), seed=args.seed)
    )
    print(
        f"\nwith n0003 never idle and dcgmi missing on n0007 (0.9 utilisation): late {stuck.late}; overdue:"
    )
    for node, why in stuck.overdue.items():
        print(f"  {node}: {why}")


if __name__ == "__main__":
    main()
