"""The health vocabulary: the states a node can be in, the weight of each signal effect, and the records
the engine decides with (a source's :class:`Signal`, the scheduler's :class:`SchedulerView`, an operator's
:class:`Override`, the engine's per-node :class:`NodeRecord`).

A module of its own because the sources, the sync programs and the Kubernetes side speak this vocabulary
without needing the engine's decision logic, and because the engine, its breaker and its state file all
build on it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

# `unobserved`: FleetSight cannot see the node's GPUs at all (every GPU signal blind); neither healthy nor
# unhealthy, and fit for work: blindness is FleetSight's problem, never the node's.
STATES = ("healthy", "unobserved", "degraded", "unhealthy", "draining", "drained", "repair")
FIT_STATES = ("healthy", "unobserved", "degraded")
OVERRIDE_STATES = tuple(s for s in STATES if s != "unobserved")  # an operator knows; FleetSight does not
# `blind` (a source silent, a check that could not look) weighs nothing: it is shown, never acted on.
LEVELS = {"ignore": 0, "blind": 0, "degraded": 1, "unhealthy": 2, "repair": 3}
OUR_REASON_PREFIX = "fleetsight:"
HISTORY_KEPT = 50


DESCRIPTIVE_LABELS = frozenset({"cause"})


@dataclass(frozen=True)
class Signal:
    """One piece of evidence about one node, as a source saw it."""

    node: str
    name: str  # alertname, "straggler", "exporter_unreachable", "scheduler_down", ...
    source: str  # "alertmanager", "prometheus", "anomaly", "scheduler"
    since: float
    effect: str  # ignore, degraded, unhealthy, repair (from the policy)
    evidence: dict[str, Any] = field(default_factory=dict)
    runbook: str = ""
    summary: str = ""

    @property
    def key(self) -> str:
        """Which reason this signal updates: one per source, signal and identifying labels. Labels that
        describe rather than identify (a straggler's ``cause``, refined from ``unknown`` to ``thermal``
        while the flag stands) are left out, so a refinement replaces the reason instead of adding one."""
        labels = {k: v for k, v in self.evidence.get("labels", {}).items() if k not in DESCRIPTIVE_LABELS}
        return f"{self.source}:{self.name}:{json.dumps(labels, sort_keys=True)}"


@dataclass(frozen=True)
class SchedulerView:
    """What the scheduler says about a node: its state words and reason, and whether it runs jobs."""

    states: tuple[str, ...] = ()
    reason: str = ""
    busy: bool = False

    @property
    def drained_by_other(self) -> bool:
        drain = any(s.startswith("DRAIN") for s in self.states)
        return drain and not self.reason.startswith(OUR_REASON_PREFIX)


@dataclass
class Observation:
    """One refresh's view of the fleet."""

    nodes: dict[str, str]  # node -> scalable unit
    signals: list[Signal]
    scheduler: dict[str, SchedulerView] = field(default_factory=dict)
    sources_ok: dict[str, bool] = field(default_factory=dict)


@dataclass
class Override:
    state: str
    reason: str
    by: str
    created: float
    expires: float | None = None

    def active(self, now: float) -> bool:
        return self.expires is None or now < self.expires


@dataclass
class NodeRecord:
    unit: str = ""
    state: str = "healthy"
    since: float = 0.0
    reasons: list[dict[str, Any]] = field(default_factory=list)
    recent: dict[str, tuple[Signal, float]] = field(default_factory=dict)  # key -> (signal, last seen)
    active: dict[str, Signal] = field(default_factory=dict)  # key -> signal firing now (not yet cleared)
    history: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=HISTORY_KEPT))
    drain_origin: str | None = None  # "auto" or "operator" while FleetSight wants it drained
    drain_reason: str = ""


def reason_of(signal: Signal, now: float, cleared: float | None = None) -> dict[str, Any]:
    reason = {
        "signal": signal.name,
        "source": signal.source,
        "effect": signal.effect,
        "since": iso(signal.since),
        "evidence": signal.evidence,
        "runbook": signal.runbook,
        "summary": signal.summary,
    }
    if cleared is not None:
        reason["last_seen"] = iso(cleared)  # gone now; held until clean_for has passed
    return reason


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
