"""The checks service's side of the scan plans (checks/scan.py): each node's last completed scan, kept
across restarts in ``scans.json`` beside results.json; what the last Slurm/Kubernetes pass said of each
node (POST /v1/scans); coverage on GET /v1/scans and /metrics:

- ``fleetsight_scan_last_completed_timestamp_seconds{cluster,scan,check,node}``: end of the node's last
  passed or failed scan (an unknown does not count);
- ``fleetsight_scan_due_timestamp_seconds{cluster,scan,check,node}``: when it must be scanned again
  (a node never scanned: when a pass first reported it, plus every_days);
- ``fleetsight_scan_waiting_info{cluster,scan,check,node,why}`` = 1: the node's state in the last pass
  (checks/scan.py STATES, or a blind reason such as tool_missing);
- ``fleetsight_scan_coverage_ratio{cluster,scan,check}``: share of the nodes scanned within every_days;
- ``fleetsight_scan_overdue_nodes{cluster,scan,check}``, ``fleetsight_scan_nodes{...}``.

The nodes are those the last pass reported (the scheduler's nodes); before any pass, the nodes the
service holds results of."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.params import Depends
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .outcomes import BLIND_REASONS
from .runner import outcome_of
from .scan import STATES, NodeScan, ScanPolicy, blind_waiting, coverage

SCANS_FILE = "scans.json"


class ScanBook:
    """Last completed and last unknown per (node, check) of every scan's check, and the passes' reports."""

    def __init__(
        self, scans: dict[str, ScanPolicy], state_file: Path | None, seed: list[dict[str, Any]]
    ) -> None:
        self.scans, self.state_file = scans, state_file
        self.checks = {p.check for p in scans.values()}
        self.lock = threading.Lock()
        self.completed: dict[tuple[str, str], dict[str, Any]] = {}
        self.blind: dict[tuple[str, str], dict[str, Any]] = {}
        self.reports: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in scans}
        # when the plans began: the clock of a never-scanned node no pass has reported (a pass that cannot
        # post its reports still leaves such nodes overdue in time, `why` not_planned)
        self.since = time.time()
        if state_file is not None and state_file.exists():
            self._load(json.loads(state_file.read_text()))
        else:  # first start beside an older results.json: its latest results are the scans known so far
            self.record(seed, save=False)
            self._save()  # `since` is kept from the first start

    def _load(self, raw: dict[str, Any]) -> None:
        self.since = float(raw.get("since", self.since))
        for key, target in (("completed", self.completed), ("blind", self.blind)):
            for item in raw.get(key, []):
                target[(item["node"], item["check"])] = item
        for name, nodes in (raw.get("reports") or {}).items():
            if name in self.reports:
                self.reports[name] = nodes

    def record(self, results: list[dict[str, Any]], save: bool = True) -> None:
        """Results already accepted by the ResultStore; only the scans' checks matter here."""
        with self.lock:
            for item in results:
                if item.get("check") not in self.checks:
                    continue
                key, finished, outcome = (
                    (item["node"], item["check"]),
                    float(item["finished"]),
                    outcome_of(item),
                )
                if outcome == "unknown":
                    if finished > self.blind.get(key, {}).get("finished", 0.0):
                        self.blind[key] = {"node": key[0], "check": key[1], "finished": finished,
                                           "reason": item.get("reason") or "unreadable"}  # fmt: skip
                elif finished > self.completed.get(key, {}).get("finished", 0.0):
                    self.completed[key] = {"node": key[0], "check": key[1], "finished": finished,
                                           "outcome": outcome}  # fmt: skip
            if save:
                self._save()

    def report(self, scan: str, nodes: dict[str, Any], now: float) -> int:
        """A pass's view: every node of the scheduler and its state; a node first reported now starts its
        clock (first_seen), a node no longer reported leaves the plan."""
        if scan not in self.scans:
            raise ValueError(f"unknown scan {scan!r}; scans are {', '.join(sorted(self.scans)) or 'none'}")
        if not isinstance(nodes, dict):
            raise ValueError("'nodes' must be a mapping node -> {state, why}")
        with self.lock:
            before = self.reports[scan]
            rows = {}
            for node, row in nodes.items():
                state = row.get("state") if isinstance(row, dict) else None
                if state not in STATES and state not in BLIND_REASONS:
                    raise ValueError(f"node {node}: state {state!r} must be one of {', '.join(STATES)}")
                first = before.get(node, {}).get("first_seen", now)
                rows[str(node)] = {
                    "state": state,
                    "why": str(row.get("why") or state),
                    "at": now,
                    "first_seen": first,
                }
            self.reports[scan] = rows
            self._save()
        return len(rows)

    def _save(self) -> None:
        if self.state_file is None:
            return
        tmp = self.state_file.with_suffix(".tmp")
        body = {
            "since": self.since,
            "completed": list(self.completed.values()),
            "blind": list(self.blind.values()),
            "reports": self.reports,
        }
        tmp.write_text(json.dumps(body))
        os.replace(tmp, self.state_file)

    def states(self, scan: str, known_nodes: set[str], now: float) -> dict[str, NodeScan]:
        policy, reported = self.scans[scan], self.reports[scan]
        nodes = set(reported) or known_nodes
        out = {}
        for node in sorted(nodes):
            done = self.completed.get((node, policy.check))
            blind = self.blind.get((node, policy.check))
            state = NodeScan(node, float(reported.get(node, {}).get("first_seen", self.since)))
            if done is not None:
                state.last, state.outcome = done["finished"], done["outcome"]
            if blind is not None and (state.last is None or blind["finished"] > state.last):
                state.blind_at, state.blind_reason = blind["finished"], blind["reason"]
            out[node] = state
        return out

    def view(self, scan: str, known_nodes: set[str], now: float) -> dict[str, Any]:
        """GET /v1/scans's entry for one scan: settings, coverage and one row per node."""
        policy = self.scans[scan]
        states = self.states(scan, known_nodes, now)
        cover = coverage(policy, states, now)
        rows = []
        for node, state in states.items():
            reported = self.reports[scan].get(node, {})
            why_state = reported.get("state", "not_planned")
            why = reported.get("why", "no pass has reported this node")
            if blind_waiting(policy, state, now) or (
                state.blind_at is not None and why_state == "not_planned"
            ):
                why_state = state.blind_reason or "unreadable"
                retry = time.strftime(
                    "%Y-%m-%d %H:%M", time.gmtime(state.blind_at + policy.retry_blind_hours * 3600)
                )
                why = f"last try could not run {policy.check} ({why_state}); next try after {retry} UTC"
            rows.append({
                "node": node, "last_completed": state.last, "outcome": state.outcome,
                "due": policy.due(state.last, state.first_seen), "overdue": node in cover.overdue,
                "state": why_state, "why": why,
                "last_unknown": state.blind_at, "unknown_reason": state.blind_reason,
                "reported_at": reported.get("at"),
            })  # fmt: skip
        return {
            "scan": scan, "check": policy.check, "every_days": policy.every_days,
            "rescan_after_days": policy.rescan_after_days, "budget": policy.budget,
            "retry_blind_hours": policy.retry_blind_hours, "nodes": cover.nodes, "covered": cover.covered,
            "coverage_ratio": cover.ratio, "overdue": cover.overdue, "rows": rows,
        }  # fmt: skip


SCAN_LABELS = ["cluster", "scan", "check"]
NODE_LABELS = [*SCAN_LABELS, "node"]
FAMILIES = (
    (
        "last",
        "fleetsight_scan_last_completed_timestamp_seconds",
        "End of the node's last passed or failed scan (an unknown does not count).",
        NODE_LABELS,
    ),
    (
        "due",
        "fleetsight_scan_due_timestamp_seconds",
        "When the node must have been scanned: last scan (or first report) + every_days.",
        NODE_LABELS,
    ),
    (
        "why",
        "fleetsight_scan_waiting_info",
        "1 for the node's state in the last pass.",
        [*NODE_LABELS, "why"],
    ),
    (
        "ratio",
        "fleetsight_scan_coverage_ratio",
        "Share of the scan's nodes whose last completed scan is within every_days.",
        SCAN_LABELS,
    ),
    ("overdue", "fleetsight_scan_overdue_nodes", "Nodes of the scan past their due date.", SCAN_LABELS),
    ("nodes", "fleetsight_scan_nodes", "Nodes in the scan plan.", SCAN_LABELS),
)


class ScanCollector(Collector):
    def __init__(self, book: ScanBook, known_nodes: Any, cluster: str) -> None:
        self.book, self.known_nodes, self.cluster = book, known_nodes, cluster

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = {key: GaugeMetricFamily(name, text, labels=labels) for key, name, text, labels in FAMILIES}
        now = time.time()
        for scan, policy in self.book.scans.items():
            view = self.book.view(scan, self.known_nodes(), now)
            base = [self.cluster, scan, policy.check]
            families["ratio"].add_metric(base, view["coverage_ratio"])
            families["overdue"].add_metric(base, float(len(view["overdue"])))
            families["nodes"].add_metric(base, float(view["nodes"]))
            for row in view["rows"]:
                if row["last_completed"] is not None:
                    families["last"].add_metric([*base, row["node"]], row["last_completed"])
                families["due"].add_metric([*base, row["node"]], row["due"])
                families["why"].add_metric([*base, row["node"], row["state"]], 1.0)
        yield from families.values()


def register(
    app: FastAPI, book: ScanBook, known_nodes: Any, reader: list[Depends], writer: list[Depends]
) -> None:
    """GET /v1/scans (scope read) and POST /v1/scans (scope results: what a pass sends)."""

    @app.get("/v1/scans", summary="Scan plans: coverage and one row per node", dependencies=reader)
    async def get_scans() -> dict[str, Any]:
        now = time.time()
        return {"now": now, "scans": [book.view(name, known_nodes(), now) for name in book.scans]}

    @app.post(
        "/v1/scans", summary="A pass's report: {scan, nodes: {node: {state, why}}}", dependencies=writer
    )
    async def post_scans(request: Request) -> dict[str, int]:
        try:
            body = await request.json()
            if not isinstance(body, dict) or "scan" not in body:
                raise ValueError("the body must be {scan, nodes: {node: {state, why}}}")
            return {"recorded": book.report(str(body["scan"]), body.get("nodes"), time.time())}
        except ValueError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from exc


def add_to(registry: CollectorRegistry, book: ScanBook, known_nodes: Any, cluster: str) -> None:
    registry.register(ScanCollector(book, known_nodes, cluster))
