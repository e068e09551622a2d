"""The report's KPIs against the twin's ground truth (its `*.truth.jsonl`, docs/twin.md): what the
report measured from Prometheus next to what the twin injected, with the tolerance each is held to.

A scorer, not part of the report: it reads the truth file with the twin's one typed reader,
`twin.truth.load_faults` (pure json and pathlib, the contract of docs/twin.md; it names a bad file and
line), and never imports the simulator.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetsight.xid_catalog import lookup
from twin.truth import Fault, load_faults

# Fault kinds that take a node (or one of its GPUs or ports) out of work, by Fire-Flyer category.
# The others leave it fit for work, slower at worst: a gray slow node, a PCIe downgrade, a link that
# flaps back up within seconds, the application's own faults (a loss spike, an Xid whose action is
# restarting the application), and a slow OST (the file system's fault, not the node's).
NODE_FAILURES = {
    "psu_failure": "power",
    "thermal_throttle": "gpu",
    "hbm_row_remap": "gpu",
    "xid": "gpu",
    "nvswitch_fatal": "gpu",
    "host_crash": "host",
    "ib_port_down": "network",
}
CATEGORIES = ("gpu", "network", "storage", "host", "power")
# The report reads minutes; a failure cut by the period's edge to less than its noise floor
# (report.MIN_EPISODE_S) is not one it can see.
MIN_SEEN_S = 180.0


@dataclass(frozen=True)
class Failure:
    id: str
    kind: str
    node: str
    category: str
    start: float
    end: float


def is_node_failure(fault: Fault) -> bool:
    if fault.benign or fault.kind not in NODE_FAILURES:
        return False
    if fault.kind == "xid":
        return fault.code is not None and lookup(fault.code).action not in ("none", "restart_app")
    return True


def failures_in(faults: list[Fault], start: float, end: float) -> list[Failure]:
    """The node failures that began in [start, end), clipped to it."""
    found = []
    for fault in faults:
        if not is_node_failure(fault) or not start <= fault.onset < end or fault.node is None:
            continue
        category = NODE_FAILURES[fault.kind]
        found.append(Failure(fault.id, fault.kind, fault.node, category, fault.onset, min(fault.end, end)))
    return found


def truth_figures(faults: list[Fault], start: float, end: float, nodes: int) -> dict[str, Any]:
    """The report's figures as the truth has them: availability, failures (total and by category),
    MTBF in node-hours, MTTR in hours; plus which failures the period's edge cut too short."""
    failures = failures_in(faults, start, end)
    node_hours = nodes * (end - start) / 3600
    down_hours = sum(unfit_seconds(failures).values()) / 3600
    count = len(failures)
    return {
        "availability": 1 - down_hours / node_hours,
        "failures": count,
        "failures_by_category": {c: sum(f.category == c for f in failures) for c in CATEGORIES},
        "mtbf_hours": node_hours / count if count else None,
        "mttr_hours": sum(f.end - f.start for f in failures) / 3600 / count if count else None,
        "cut_by_edge": [f.id for f in failures if f.end - f.start < MIN_SEEN_S],
        "list": failures,
    }


def unfit_seconds(failures: list[Failure]) -> dict[str, float]:
    """Seconds each node was unfit: the union of its failures' spans (two at once count once)."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for failure in failures:
        spans.setdefault(failure.node, []).append((failure.start, failure.end))
    total: dict[str, float] = {}
    for node, pairs in spans.items():
        covered, reach = 0.0, float("-inf")
        for begin, finish in sorted(pairs):
            begin = max(begin, reach)
            if finish > begin:
                covered += finish - begin
            reach = max(reach, finish)
        total[node] = covered
    return total


def figure(report: dict[str, Any], key: str) -> float | None:
    return next(f["value"] for f in report["figures"] if f["key"] == key)


def comparison(report: dict[str, Any], truth: dict[str, Any]) -> list[tuple[str, str, str, str, bool]]:
    """(KPI, report, truth, tolerance, within it) rows. Tolerances: availability within 0.1 point;
    MTBF within 10 %; MTTR within 3 minutes (minute resolution, a minute or two of detection lag at
    each end); failures exact per category, less those the period's edge cut below the noise floor."""
    cut = len(truth["cut_by_edge"])
    rows: list[tuple[str, str, str, str, bool]] = []
    measured, true = figure(report, "availability"), truth["availability"]
    rows.append(("availability", pct(measured), pct(true), "0.1 point", close(measured, true, 0.001)))
    measured = figure(report, "failures")
    rows.append(("failures", f"{measured:.0f}", f"{truth['failures']}",
                 f"exact (-{cut} cut by the edge)" if cut else "exact",
                 truth["failures"] - cut <= (measured or 0) <= truth["failures"]))  # fmt: skip
    for category in CATEGORIES:
        got, want = report["failures_by_category"][category], truth["failures_by_category"][category]
        short = sum(f.category == category and f.id in truth["cut_by_edge"] for f in truth["list"])
        rows.append((f"  {category}", str(got), str(want), "exact" + (f" (-{short})" if short else ""),
                     want - short <= got <= want))  # fmt: skip
    measured, true = figure(report, "mtbf_hours"), truth["mtbf_hours"]
    rows.append(
        ("MTBF (node-hours)", num(measured), num(true), "10 %", close(measured, true, 0.1 * (true or 0)))
    )
    measured, true = figure(report, "mttr_hours"), truth["mttr_hours"]
    rows.append(("MTTR (minutes)", minutes(measured), minutes(true), "3 min", close(measured, true, 3 / 60)))
    return rows


def close(measured: float | None, true: float | None, limit: float) -> bool:
    """Within limit of the truth; undefined on both sides (no failure, no MTBF) agrees."""
    if measured is None or true is None:
        return measured is None and true is None
    return abs(measured - true) <= limit


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f} %"


def num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def minutes(hours: float | None) -> str:
    return "n/a" if hours is None else f"{hours * 60:.1f}"


def table(rows: list[tuple[str, str, str, str, bool]]) -> str:
    """The comparison as a Markdown table (docs/dashboards.md quotes it)."""
    lines = ["| KPI | report | twin's truth | tolerance | within |", "|---|---|---|---|---|"]
    lines += [f"| {k} | {r} | {t} | {tol} | {'yes' if ok else '**no**'} |" for k, r, t, tol, ok in rows]
    return "\n".join(lines)


def unmatched(report: dict[str, Any], truth: dict[str, Any], slack_s: float = 360) -> dict[str, list]:
    """Truth failures with no report episode of their node and category starting within slack_s of
    their onset ("missed"), and report episodes that match no truth failure ("extra")."""
    episodes = report["episodes"]
    used: set[int] = set()
    missed = []
    for failure in truth["list"]:
        index = next(
            (i for i, e in enumerate(episodes)
             if i not in used and e["node"] == failure.node and e["category"] == failure.category
             and abs(e["start"] - failure.start) <= slack_s),
            None,
        )  # fmt: skip
        if index is None:
            missed.append(failure)
        else:
            used.add(index)
    return {"missed": missed, "extra": [e for i, e in enumerate(episodes) if i not in used]}


def report_against_truth(url: str, start: float, end: float, truth_file: Path, nodes: int, out: Path) -> str:
    """Run `fleetsight report` on the period as a user would (OUT/report.html, OUT/report.json) and
    say how its figures compare with the truth: the table, then what it missed or invented."""
    iso = [dt.datetime.fromtimestamp(t, dt.UTC).isoformat() for t in (start, end)]
    command = [sys.executable, "-m", "fleetsight.cli", "report", "--prometheus", url, "--out", str(out),
               "--from", iso[0], "--to", iso[1]]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=900)
    report = json.loads((out / "report.json").read_text())
    truth = truth_figures(load_faults(truth_file), start, end, nodes)
    misses = unmatched(report, truth)
    lines = [table(comparison(report, truth)), f"cut by the period's edge: {truth['cut_by_edge'] or 'none'}"]
    lines += [f"missed: {f.id} {f.kind} on {f.node} at {stamp(f.start)} for {(f.end - f.start) / 60:.1f} min"
              for f in misses["missed"]]  # fmt: skip
    lines += [f"extra: {e['category']} ({e['detail']}) on {e['node']} at {stamp(e['start'])} for "
              f"{(e['end'] - e['start']) / 60:.0f} min" for e in misses["extra"]]  # fmt: skip
    return "\n".join(lines)


def stamp(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%H:%M")


def main() -> None:
    """`python -m evaluation.report`: the comparison on a Prometheus that serves a backfill."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prometheus", required=True)
    parser.add_argument("--from", dest="start", required=True, help="ISO 8601, e.g. 2026-11-21T00:00:00Z")
    parser.add_argument("--to", dest="end", required=True)
    parser.add_argument("--truth", type=Path, required=True, help="the backfill's *.truth.jsonl")
    parser.add_argument("--nodes", type=int, required=True, help="the scenario's node count")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    start, end = (
        dt.datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp() for v in (args.start, args.end)
    )
    print(report_against_truth(args.prometheus, start, end, args.truth, args.nodes, args.out))


if __name__ == "__main__":
    main()
