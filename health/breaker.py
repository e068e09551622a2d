"""The circuit breaker on automatic drains: how many nodes the engine may drain at once, per scalable unit
and for the whole cluster, within the policy's window; and the breaker's state and reason as readers see
them.

A module of its own: the breaker is a rule of its own (many nodes failing at once means a common cause,
not many bad nodes) with its own tuning (policy.yml ``circuit_breaker``), so it changes for reasons of its
own. The engine keeps the grants and calls these pure functions with them.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Mapping
from typing import Any

from .model import iso
from .policy import Breaker

BREAKER_RUNBOOK = "docs/health.md#runbook-healthcircuitbreakeropen"
Grant = tuple[float, str, str]  # (time, node, unit) of one automatic drain


def closed() -> dict[str, Any]:
    """The breaker's state while it holds nothing."""
    return {"open": False, "held": [], "since": None, "scope": None}


def split_batch(
    candidates: list[str],
    unit_of: Mapping[str, str],
    grants: Collection[Grant],
    unit_sizes: Counter[str],
    fleet_size: int,
    breaker: Breaker,
) -> tuple[list[str], list[str], str | None]:
    """Split one refresh's drain candidates into granted and held, with the scope that held them. A batch
    that would exceed a unit's or the cluster's allowance in the window is held whole: many at once means
    a common cause."""
    by_unit: dict[str, list[str]] = {}
    for node in candidates:
        by_unit.setdefault(unit_of[node], []).append(node)
    granted: list[str] = []
    held: list[str] = []
    scope = None
    for unit, nodes in by_unit.items():
        limit = max(breaker.min_nodes, math.floor(breaker.max_unit_fraction * unit_sizes.get(unit, 1)))
        wanted = sum(1 for _, _, u in grants if u == unit) + len(nodes)
        if wanted > limit:
            held += nodes
            scope = f"unit {unit}: {wanted} > {limit} in {breaker.window_s:.0f}s"
        else:
            granted += nodes
    cluster_limit = max(breaker.min_nodes, math.floor(breaker.max_cluster_fraction * fleet_size))
    wanted = len(grants) + len(granted)
    if granted and wanted > cluster_limit:
        held += granted
        granted = []
        scope = f"cluster: {wanted} > {cluster_limit} in {breaker.window_s:.0f}s"
    return granted, held, scope


def hold(state: dict[str, Any], held: list[str], scope: str | None, now: float) -> dict[str, Any]:
    """The breaker's state once ``held`` are held (closed when none is): open since the first hold, the
    scope of the last batch it held."""
    if not held:
        return closed()
    if not state["open"]:
        state["since"] = now
    state.update(open=True, held=held, scope=scope or state["scope"])
    return state


def held_reason(state: dict[str, Any]) -> dict[str, Any]:
    """The reason shown first on a node the open breaker keeps from an automatic drain."""
    return {
        "signal": "circuit_breaker",
        "source": "health",
        "effect": "unhealthy",
        "since": iso(state["since"]),
        "evidence": {"scope": state["scope"], "held": len(state["held"])},
        "runbook": BREAKER_RUNBOOK,
        "summary": "not drained automatically: the circuit breaker holds (too many at once)",
    }
