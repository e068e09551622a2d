"""A Slurm or Kubernetes pass's part in the scan plans: read the plans and each node's last scan from the
checks service (GET /v1/scans), offer the nodes to the plan oldest first, and report back what the pass
did with each node (POST /v1/scans), which the service turns into coverage and MemoryScanOverdue's
`why`. The checks service keeps the state; the pass keeps none."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from . import runner
from .plan import Decision, Unit
from .scan import NodeScan, ScanPolicy, report, wanted

log = logging.getLogger("fleetsight.checks.scans")


@dataclass
class ScanRound:
    units: list[Unit] = field(default_factory=list)
    caps: dict[str, int] = field(default_factory=dict)
    pending: list[tuple[ScanPolicy, dict[str, str]]] = field(default_factory=list)  # (policy, held nodes)


def _headers() -> dict[str, str]:
    """The pass's token (scope results, and read where reads are closed), as its other calls send it."""
    token = runner.client_token()
    return {"Authorization": f"Bearer {token}"} if token else {}


def policy_of(view: dict[str, Any]) -> ScanPolicy:
    return ScanPolicy(
        view["scan"],
        view["check"],
        float(view["every_days"]),
        float(view["rescan_after_days"]),
        int(view["budget"]),
        float(view["retry_blind_hours"]),
    )


def states_of(view: dict[str, Any], nodes: Iterable[str], now: float) -> dict[str, NodeScan]:
    """Every node of the scheduler; one the service has no row for has never been scanned."""
    rows = {r["node"]: r for r in view["rows"]}
    states = {}
    for node in sorted(nodes):
        row = rows.get(node, {})
        states[node] = NodeScan(
            node,
            first_seen=now,
            last=row.get("last_completed"),
            outcome=row.get("outcome"),
            blind_at=row.get("last_unknown"),
            blind_reason=row.get("unknown_reason"),
        )
    return states


def plan_scans(
    enabled: bool, checks_url: str, nodes: Iterable[str], running: Iterable[Unit], now: float | None = None
) -> ScanRound:
    """The scan units to add to this pass's wanted list (oldest scan first), and each scan's cap (its
    budget); nothing when the pass runs with --no-scans."""
    if not enabled:
        return ScanRound()
    now = time.time() if now is None else now
    try:  # the scans never hold up the validation work of the same pass
        response = httpx.get(f"{checks_url.rstrip('/')}/v1/scans", headers=_headers(), timeout=10)
        response.raise_for_status()
    except (httpx.HTTPError, ValueError) as exc:
        log.warning("event=scan_plans_unreadable url=%s error=%s", checks_url, exc)
        return ScanRound()
    nodes, running = list(nodes), list(running)
    out = ScanRound()
    for view in response.json()["scans"]:
        policy = policy_of(view)
        busy = {n for u in running if u.check == policy.check for n in u.nodes}
        units, held = wanted(policy, states_of(view, nodes, now), busy, now)
        out.units += units
        out.caps[policy.check] = policy.budget
        out.pending.append((policy, held))
    return out


def post_reports(checks_url: str, scans: ScanRound, decision: Decision) -> dict[str, Any]:
    """Tell the service what became of every node of every scan in this pass; returns the reports."""
    reports = {}
    for policy, held in scans.pending:
        rows = report(policy, decision, held)
        body = {"scan": policy.name, "nodes": rows}
        reports[policy.name] = rows
        try:  # the jobs already started; without the report the service shows the nodes `not_planned`
            response = httpx.post(
                f"{checks_url.rstrip('/')}/v1/scans", json=body, headers=_headers(), timeout=10
            )
            response.raise_for_status()
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("event=scan_report_not_posted scan=%s url=%s error=%s", policy.name, checks_url, exc)
    return reports
