"""Markdown tables from `fleetsight evaluate anomaly --json`: the detector per band (5 %, 10 %, 20 %,
40 %; and per fault kind and band, or per cause and band) with both baselines beside it, and the false
flags on fault-free scenarios.

    fleetsight evaluate anomaly $(printf -- "--scenario %s " evaluation/scenarios/anomaly/*.yaml) --json \
        > e.json
    python bench/anomaly_eval_table.py e.json [--kinds] [--causes] [--misses]

`--misses` lists the detector's missed episodes (with how long each fault set its job's pace and how
long a slower node masked it) and its wrong flags (with the fault pacing the job then, if any).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

METHODS = ("detector", "static_power", "zscore")
COLUMNS = ("episodes", "precision", "recall", "recall_15min", "f1", "latency_median_s", "latency_p95_s")


def _cell(column: str, value: Any) -> str:
    if value is None:
        return "-"
    if column.startswith("latency"):
        return f"{value:.0f}"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _figures(report: dict[str, Any], method: str) -> dict[str, Any]:
    return report if method == "detector" else report["baselines"][method]


def _rows(report: dict[str, Any], kinds: bool, causes: bool) -> list[tuple[str, str, str, dict[str, Any]]]:
    rows = []
    for method in METHODS:
        figures = _figures(report, method)
        rows.append((method, "all", "all", figures))
        for band, band_figures in figures["by_band"].items():
            if band_figures["episodes"]:
                rows.append((method, "all", band, band_figures))
        if kinds and method == "detector":
            for row in figures["by_kind_band"]:
                if row["episodes"]:
                    rows.append((method, row["kind"], row["band"], row))
        if causes and method == "detector":
            for row in figures.get("by_cause_band", []):
                if row["episodes"]:
                    rows.append((method, row["cause"], row["band"], row))
    return rows


def table(report: dict[str, Any], kinds: bool = False, causes: bool = False) -> str:
    lines = [
        "| method | kind or cause | band | episodes | precision | recall | recall <= 15 min | F1 "
        "| latency median s | latency p95 s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for method, kind, band, figures in _rows(report, kinds, causes):
        # Reports written before recall_15min existed have no such key: "-".
        cells = [method, kind, band, *(_cell(c, figures.get(c)) for c in COLUMNS)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "| method | false flags on fault-free scenarios | node-hours | per 1,000 node-hours |",
        "|---|---|---|---|",
    ]
    for method in METHODS:
        figures = _figures(report, method)
        per = figures["false_flags"]
        lines.append(
            f"| {method} | {figures['false_flag_count']} | {figures['fault_free_node_hours']} | "
            f"{'-' if per is None else f'{per:.1f}'} |"
        )
    return "\n".join(lines)


def misses(report: dict[str, Any]) -> str:
    lines = ["| missed | kind | job | node | slowdown | pacing s | masked s |", "|---" * 7 + "|"]
    for m in report.get("missed", []):
        lines.append(
            f"| {m['scenario']} {m['fault_id']} | {m['kind']} | {m['job']} | {m['node']} | "
            f"{m['slowdown']:.3f} | {m['pacing_s']:.0f} | {m['masked_s']:.0f} |"
        )
    lines += ["", "| wrong flag | job | node | time | cause | during |", "|---|---|---|---|---|---|"]
    for w in report.get("wrong", []):
        lines.append(
            f"| {w['scenario']} | {w['job']} | {w['node']} | {w['time']:.0f} | {w['cause']} | "
            f"{w['during'] or '-'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("report", type=Path)
    parser.add_argument("--kinds", action="store_true", help="the detector's rows per fault kind too")
    parser.add_argument("--causes", action="store_true", help="the detector's rows per cause too")
    parser.add_argument("--misses", action="store_true", help="the detector's misses and wrong flags")
    args = parser.parse_args()
    report = json.loads(args.report.read_text())
    print(table(report, args.kinds, args.causes))
    if args.misses:
        print()
        print(misses(report))


if __name__ == "__main__":
    main()
