"""Every dashboard panel over a long stretch of the twin's backfilled mixed day (the tests check a
five-minute slice, and a short scenario where alerts fire): backfill (dcgm-exporter, node agents,
fabric exporter, `up`), a real Prometheus on the blocks, the recording rules the panels and alerts
read, Prometheus's ALERTS from the alerts' firing episodes, the straggler flags of the anomaly
detector run offline, each query as a range query over the span. Prints per panel whether it shows
data, why not when it does not, and the wall time of each stage.

    .venv/bin/python bench/dashboards_history.py                        # 6 h of mixed_day, agents every 60 s
    .venv/bin/python bench/dashboards_history.py --duration 24h --agent-step 120s --report /tmp/day

With --report DIR it also runs `fleetsight report` over the span on the same Prometheus (DIR/report.html,
DIR/report.json) and prints its KPIs next to the twin's truth (evaluation/report.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from evaluation.dashboards import check_history  # noqa: E402 - after the path is set
from evaluation.report import report_against_truth  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenario", default=str(REPO / "twin" / "scenarios" / "mixed_day.yaml"))
    parser.add_argument("--duration", default="6h")
    parser.add_argument("--agent-step", default="60s")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: system temp)")
    parser.add_argument(
        "--no-stragglers", action="store_true", help="skip the offline straggler detector's flags"
    )
    parser.add_argument("--report", type=Path, default=None, help="also the report, against the truth")
    args = parser.parse_args()
    compared: list[str] = []

    def report(url: str, start: float, end: float, truth: Path) -> None:
        nodes = yaml.safe_load(Path(args.scenario).read_text())["cluster"]["nodes"]
        compared.append(report_against_truth(url, start, end, truth, nodes, args.report))

    started = time.monotonic()
    last = [started]

    def stage(name: str) -> None:
        now = time.monotonic()
        print(f"  {now - last[0]:7.1f} s  -> {name}", flush=True)
        last[0] = now

    check = check_history(
        Path(args.scenario), args.duration, args.agent_step, args.work, stage, not args.no_stragglers,
        also=report if args.report else None,
    )  # fmt: skip
    stage("done")
    panels: dict[tuple[str, str], list[int]] = {}
    for result in check.results:
        panels.setdefault((result.dashboard, result.panel), []).append(result.series)
    empty = check.empty_panels()
    print(f"\n{check.scenario} {check.start} .. {check.end}, variables {check.variables}")
    for (dashboard, panel), series in panels.items():
        status = (
            f"EMPTY ({empty[(dashboard, panel)] or 'NO REASON'})" if (dashboard, panel) in empty else "data"
        )
        print(f"{dashboard:<24} {panel[:70]:<70} series {series}  {status}")
    refused = [r for r in check.results if r.error]
    print(
        f"\n{len(panels)} panels: {len(panels) - len(empty)} with data, {len(empty)} empty "
        f"({len(check.unexplained())} without a reason); {len(refused)} queries refused; "
        f"{check.alert_episodes} alert episodes and {check.straggler_samples} straggler samples "
        "written; "
        f"{time.monotonic() - started:.0f} s"
    )
    if compared:
        print(f"\nThe report ({args.report}) against the twin's truth:\n{compared[0]}")


if __name__ == "__main__":
    main()
