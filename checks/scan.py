"""Scan plans (checks/policy.yml ``scans:``): put every node through one intrusive check, e.g. DCGM's
level-4 memtest for silent HBM corruption, within ``every_days``, on idle nodes, oldest scan first.

Pure decisions, shared by the Slurm and Kubernetes passes, the checks service (coverage, /metrics) and
bench/scan_coverage.py. A node's *last completed* scan is the end of its last run of the check that
passed or failed: an unknown (tool missing, timeout) has not looked at the memory, so it neither counts
as a scan nor fails the node (it is retried after ``retry_blind_hours``). Failed counts as scanned: the
node was observed, and ActiveCheckFailed takes it from there."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .plan import Decision, Unit

DAY = 86400.0
# Why a node waits, as a short label value (the metric's `why`, the alert's annotation); the pass's
# own sentence ("not idle: n0001", "leaf busy: leaf-a") is kept beside it in GET /v1/scans.
STATES = (
    "started",  # the pass started its scan now
    "running",  # a scan of the node is under way
    "not_due",  # scanned recently: offered again after rescan_after_days
    "not_idle",  # a job (or a drain or down state) holds the node
    "leaf_busy",  # another intrusive check runs on one of its fabric leaves
    "budget",  # the cluster's budget of nodes under test is spent
    "scan_budget",  # the scan's own budget of nodes at once is spent
    "under_test",  # another check runs on the node
    "drained",  # FleetSight drained it: validation checks only
    "not_planned",  # no pass has reported on it yet (the pass does not run, or not for this scan)
)


@dataclass(frozen=True)
class ScanPolicy:
    name: str
    check: str
    every_days: float  # every node's last completed scan is at most this old: the deadline
    rescan_after_days: float  # a node is offered again once its scan is this old (slack to find idle time)
    budget: int  # nodes under this scan at once, at most (the pass's --budget still caps all checks)
    retry_blind_hours: float  # after an unknown (tool missing, timeout), wait this long before retrying

    def due(self, last: float | None, first_seen: float) -> float:
        """When the node must have been scanned: its last scan, or when it joined, plus every_days."""
        return (last if last is not None else first_seen) + self.every_days * DAY


class ScanPolicyError(ValueError):
    """A malformed ``scans:`` entry: the message names the scan and the key."""


def _number(raw: Mapping[str, Any], key: str, where: str, default: float | None = None) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ScanPolicyError(f"{where}: {key} must be a positive number, not {value!r}")
    return float(value)


def load_scans(raw: Any, checks: Mapping[str, Any]) -> dict[str, ScanPolicy]:
    """The policy's ``scans:`` mapping, validated against the catalogue (a single-node check)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ScanPolicyError("scans: expected a mapping scan name -> {check, every_days, budget, ...}")
    scans = {}
    for name, item in raw.items():
        where = f"scan {name}"
        if not isinstance(item, dict):
            raise ScanPolicyError(f"{where}: must be a mapping")
        if item.get("check") not in checks:
            raise ScanPolicyError(f"{where}: check {item.get('check')!r} is not in the catalogue")
        if getattr(checks[item["check"]], "nodes", 1) != 1:
            raise ScanPolicyError(f"{where}: check {item['check']} runs on two nodes; a scan takes one")
        every = _number(item, "every_days", where)
        rescan = _number(item, "rescan_after_days", where, every * 2 / 3)
        if rescan > every:
            raise ScanPolicyError(f"{where}: rescan_after_days ({rescan:g}) must not exceed every_days")
        budget = item.get("budget", 1)
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ScanPolicyError(f"{where}: budget must be a whole number of nodes >= 1, not {budget!r}")
        retry = _number(item, "retry_blind_hours", where, 24.0)
        scans[str(name)] = ScanPolicy(str(name), item["check"], every, rescan, budget, retry)
    return scans


@dataclass
class NodeScan:
    """What the checks service knows of one node's scans."""

    node: str
    first_seen: float
    last: float | None = None  # end of the last completed (passed or failed) scan
    outcome: str | None = None  # of that scan
    blind_at: float | None = None  # end of the last unknown since then
    blind_reason: str | None = None


def blind_waiting(policy: ScanPolicy, state: NodeScan, now: float) -> bool:
    """An unknown since the last scan, not long enough ago to try again."""
    return state.blind_at is not None and now - state.blind_at < policy.retry_blind_hours * 3600


def wanted(
    policy: ScanPolicy, states: Mapping[str, NodeScan], running: set[str], now: float
) -> tuple[list[Unit], dict[str, str]]:
    """The scan units to offer the plan, oldest first (never scanned first), and for the nodes not
    offered, their state (running, not_due, or the blind reason that holds them back)."""
    offered, held = [], {}
    for node, state in states.items():
        if node in running:
            held[node] = "running"
        elif state.last is not None and now - state.last < policy.rescan_after_days * DAY:
            held[node] = "not_due"
        elif blind_waiting(policy, state, now):
            held[node] = state.blind_reason or "unreadable"
        else:
            # never scanned first (rank 0), then the oldest scan; the plan keeps this order
            offered.append(Unit(policy.check, (node,), rank=state.last or 0.0))
    offered.sort(key=lambda u: (u.rank, u.nodes))
    return offered, held


def state_of(why: str) -> str:
    """The short state of a plan's sentence (checks/plan.py, checks/slurm.py)."""
    for prefix, state in (
        ("not idle", "not_idle"),
        ("leaf busy", "leaf_busy"),
        ("scan budget", "scan_budget"),
        ("budget", "budget"),
        ("already under test", "under_test"),
        ("drained by FleetSight", "drained"),
    ):
        if why.startswith(prefix):
            return state
    return "not_idle"


def report(policy: ScanPolicy, decision: Decision, held: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """node -> {state, why} of this pass, what the pass posts to the checks service."""
    rows = {node: {"state": state, "why": state.replace("_", " ")} for node, state in held.items()}
    for unit in decision.start:
        if unit.check == policy.check and not unit.validation:
            rows[unit.nodes[0]] = {"state": "started", "why": "scan started"}
    for unit, why in decision.waiting.items():
        if unit.check == policy.check and not unit.validation:
            rows[unit.nodes[0]] = {"state": state_of(why), "why": why}
    return rows


@dataclass
class Coverage:
    nodes: int
    covered: int  # last completed scan within every_days
    overdue: list[str]

    @property
    def ratio(self) -> float:
        return self.covered / self.nodes if self.nodes else 1.0


def coverage(policy: ScanPolicy, states: Mapping[str, NodeScan], now: float) -> Coverage:
    covered = sum(
        1 for s in states.values() if s.last is not None and now - s.last <= policy.every_days * DAY
    )
    overdue = sorted(n for n, s in states.items() if now > policy.due(s.last, s.first_seen))
    return Coverage(len(states), covered, overdue)
