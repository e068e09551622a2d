"""A scan plan simulated over the pure planner (checks/scan.py, checks/plan.py): N nodes of a busy
cluster, each alternating jobs and idle gaps, one pass every 5 minutes as the Slurm/Kubernetes cycles run.
Shared by the tests (tests/checks/test_scan_plan.py: behaviour) and bench/scan_coverage.py (the table).

The idle pattern is made up but shaped like a busy training cluster: a node's jobs last hours to days
(log-normal, median 12 h, clipped to 1 h .. 7 days) and the gaps between them are exponential, their mean
set so that the node is busy ``utilisation`` of the time. A scan holds its node for ``scan_hours``; a job
that would have started on the node meanwhile starts when the scan ends (counted as delay: an upper
bound, a real scheduler may place it on another idle node)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from checks.plan import Unit, plan
from checks.scan import DAY, NodeScan, ScanPolicy, report, wanted

HOUR = 3600.0
CHECK = "dcgm_diag_r4"
JOB_MEDIAN_H, JOB_SIGMA, JOB_MIN_H, JOB_MAX_H = 12.0, 1.0, 1.0, 7 * 24.0


@dataclass
class SimConfig:
    nodes: int = 256
    nodes_per_leaf: int = 32  # the twin's rail-optimised fabric: one intrusive check per scalable unit
    every_days: float = 30.0
    rescan_after_days: float = 20.0
    budget: int = 8  # the pass's --budget: nodes under test in the cluster
    scan_budget: int = 4  # the scan's own budget (policy.yml scans.memory.budget)
    utilisation: float = 0.90
    scan_hours: float = 2700 / HOUR  # the catalogue's dcgm_diag_r4
    days: float = 60.0
    step_minutes: float = 5.0
    never_idle: tuple[str, ...] = ()  # nodes a job holds for the whole run
    blind: tuple[str, ...] = ()  # nodes where the tool is missing: every try is an unknown
    seed: int = 1


@dataclass
class SimResult:
    config: SimConfig
    days_to_full: float | None  # first time every node had a completed scan
    max_gap_days: float  # the longest any node went without a completed scan (from t=0 for the first)
    scans: int
    delayed_job_hours: float
    overdue: dict[str, str] = field(default_factory=dict)  # node -> why, past its due date at the end
    late: list[str] = field(default_factory=list)  # nodes that went longer than every_days unscanned
    gap_by_node: dict[str, float] = field(default_factory=dict)
    first_scan_order: list[str] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        c = self.config
        return {
            "nodes": c.nodes,
            "every_days": c.every_days,
            "budget": f"{c.scan_budget}/{c.budget}",
            "utilisation": c.utilisation,
            "scan_h": round(c.scan_hours, 2),
            "days_to_full": None if self.days_to_full is None else round(self.days_to_full, 1),
            "max_gap_days": round(self.max_gap_days, 1),
            "late": len(self.late),
            "overdue_at_end": len(self.overdue),
            "scans": self.scans,
            "delay_h_per_1000_node_days": round(1000 * self.delayed_job_hours / (c.nodes * c.days), 1),
        }


def node_name(i: int) -> str:
    return f"n{i + 1:04d}"


def timeline(rng: random.Random, cfg: SimConfig, end: float) -> list[list[float]]:
    """[start, end] of each job on one node, in order, up to ``end``."""
    mean_job = JOB_MEDIAN_H * math.exp(JOB_SIGMA**2 / 2) * HOUR
    mean_gap = mean_job * (1 - cfg.utilisation) / cfg.utilisation
    t = -rng.uniform(0, mean_job + mean_gap)  # a random phase: the cluster was busy before t=0
    jobs = []
    while t < end:
        hours = min(max(rng.lognormvariate(math.log(JOB_MEDIAN_H), JOB_SIGMA), JOB_MIN_H), JOB_MAX_H)
        jobs.append([t, t + hours * HOUR])
        t += hours * HOUR + rng.expovariate(1 / mean_gap)
    return jobs


class Node:
    def __init__(self, jobs: list[list[float]]) -> None:
        self.jobs, self.at = jobs, 0

    def busy(self, t: float) -> bool:
        while self.at < len(self.jobs) and self.jobs[self.at][1] <= t:
            self.at += 1
        return self.at < len(self.jobs) and self.jobs[self.at][0] <= t

    def hold(self, start: float, end: float) -> float:
        """A scan holds the node from start to end: a job due meanwhile waits; returns the delay."""
        if self.at >= len(self.jobs) or self.jobs[self.at][0] >= end:
            return 0.0
        shift = end - max(self.jobs[self.at][0], start)
        for job in self.jobs[self.at :]:
            job[0] += shift
            job[1] += shift
        return shift


def simulate(cfg: SimConfig) -> SimResult:
    rng = random.Random(cfg.seed)
    end = cfg.days * DAY
    names = [node_name(i) for i in range(cfg.nodes)]
    nodes = {n: Node([[-1.0, end * 2]] if n in cfg.never_idle else timeline(rng, cfg, end)) for n in names}
    leaves = {n: frozenset({f"leaf-{i // cfg.nodes_per_leaf}"}) for i, n in enumerate(names)}
    policy = ScanPolicy("memory", CHECK, cfg.every_days, cfg.rescan_after_days, cfg.scan_budget, 24.0)
    states = {n: NodeScan(n, first_seen=0.0) for n in names}
    running: dict[str, float] = {}  # node -> scan end
    scans_done = {n: [0.0] for n in names}  # completed scan ends, t=0 as the start of the first gap
    out = SimResult(cfg, None, 0.0, 0, 0.0)
    last_why: dict[str, str] = {}
    t, step = 0.0, cfg.step_minutes * 60
    while t < end:
        for node, done_at in [(n, e) for n, e in running.items() if e <= t]:
            del running[node]
            if node in cfg.blind:
                states[node].blind_at, states[node].blind_reason = done_at, "tool_missing"
            else:
                states[node].last, states[node].blind_at = done_at, None
                scans_done[node].append(done_at)
                out.scans += 1
                if node not in out.first_scan_order:
                    out.first_scan_order.append(node)
        if out.days_to_full is None and all(s.last is not None for s in states.values()):
            out.days_to_full = t / DAY
        idle = {n for n, node in nodes.items() if n not in running and not node.busy(t)}
        offered, held = wanted(policy, states, set(running), t)
        busy_units = [Unit(CHECK, (n,)) for n in running]
        decision = plan(offered, idle, busy_units, leaves, cfg.budget, caps={CHECK: cfg.scan_budget})
        for unit in decision.start:
            node = unit.nodes[0]
            running[node] = t + cfg.scan_hours * HOUR
            out.delayed_job_hours += nodes[node].hold(t, running[node]) / HOUR
        last_why.update({n: row["why"] for n, row in report(policy, decision, held).items()})
        t += step
    for node in names:
        gaps = [b - a for a, b in zip(scans_done[node], [*scans_done[node][1:], end], strict=True)]
        out.gap_by_node[node] = max(gaps) / DAY
        if end > policy.due(states[node].last, 0.0):
            out.overdue[node] = states[node].blind_reason if node in cfg.blind else last_why.get(node, "?")
    out.max_gap_days = max(out.gap_by_node.values())
    out.late = sorted(n for n, gap in out.gap_by_node.items() if gap > cfg.every_days)
    return out
