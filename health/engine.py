"""The health state machine: signals in, one state per node out, with reasons, history and events.

Pure logic with an explicit clock (``now`` arguments), so the service and the tests drive it the same
way. The service feeds it one :class:`Observation` per refresh; readers take the immutable snapshot it
publishes (:meth:`HealthEngine.snapshot`), never the engine's working state.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .policy import Policy

STATES = ("healthy", "degraded", "unhealthy", "draining", "drained", "repair")
FIT_STATES = ("healthy", "degraded")
LEVELS = {"ignore": 0, "degraded": 1, "unhealthy": 2, "repair": 3}
OUR_REASON_PREFIX = "fleetsight:"
HISTORY_KEPT = 50
BREAKER_RUNBOOK = "docs/health.md#runbook-healthcircuitbreakeropen"


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
    import datetime as dt

    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def young_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's optimal checkpoint interval, sqrt(2 D M)."""
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


class HealthEngine:
    def __init__(self, policy: Policy, state_dir: Path | None = None, now: float = 0.0) -> None:
        self.policy = policy
        self.state_dir = state_dir
        self.nodes: dict[str, NodeRecord] = {}
        self.overrides: dict[str, Override] = {}
        self.grants: deque[tuple[float, str, str]] = deque()  # (time, node, unit) of automatic drains
        self.events: deque[dict[str, Any]] = deque(maxlen=policy.events_kept)
        self.next_event_id = 1
        self.failures = 0
        self.observed_node_seconds = 0.0
        self.last_update: float | None = None
        self.breaker: dict[str, Any] = {"open": False, "held": [], "since": None, "scope": None}
        self.sources_ok: dict[str, bool] = {}
        self._snapshot: dict[str, Any] = {"nodes": {}, "updated": None}
        self.started = now
        self._load()

    # ------------------------------------------------------------------------------ persistence
    def _state_file(self) -> Path | None:
        return self.state_dir / "state.json" if self.state_dir else None

    def _load(self) -> None:
        path = self._state_file()
        if path is None or not path.exists():
            return
        data = json.loads(path.read_text())
        self.overrides = {n: Override(**o) for n, o in data.get("overrides", {}).items()}
        self.grants = deque(tuple(g) for g in data.get("grants", []))  # type: ignore[misc]
        self.failures = int(data.get("failures", 0))
        self.observed_node_seconds = float(data.get("observed_node_seconds", 0.0))
        self.next_event_id = int(data.get("next_event_id", 1))
        for node, saved in data.get("states", {}).items():  # so a restart emits no made-up changes
            self.nodes[node] = NodeRecord(unit=saved["unit"], state=saved["state"], since=saved["since"])
        for node, saved in data.get("drains", {}).items():
            record = self.nodes.setdefault(node, NodeRecord())
            record.drain_origin, record.drain_reason = saved["origin"], saved["reason"]
        # The hysteresis memory: a restart inside clean_for must not release a node early.
        for node, held in data.get("recent", {}).items():
            record = self.nodes.setdefault(node, NodeRecord())
            for saved_signal, last_seen in held:
                kept = Signal(**saved_signal)
                record.recent[kept.key] = (kept, float(last_seen))
        for event in data.get("events", []):
            self.events.append(event)

    def save(self) -> None:
        path = self._state_file()
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "overrides": {n: asdict(o) for n, o in self.overrides.items()},
            "grants": list(self.grants),
            "failures": self.failures,
            "observed_node_seconds": self.observed_node_seconds,
            "next_event_id": self.next_event_id,
            "drains": {
                n: {"origin": r.drain_origin, "reason": r.drain_reason}
                for n, r in self.nodes.items()
                if r.drain_origin
            },
            "events": list(self.events)[-1000:],
            "states": {
                n: {"state": r.state, "since": r.since, "unit": r.unit} for n, r in self.nodes.items()
            },
            "recent": {
                n: [[asdict(sig), seen] for sig, seen in r.recent.values()]
                for n, r in self.nodes.items()
                if r.recent
            },
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)

    # ------------------------------------------------------------------------------ operator actions
    def set_override(
        self, node: str, state: str, reason: str, by: str, now: float, ttl: float | None
    ) -> None:
        if state not in STATES:
            raise ValueError(f"state {state!r} is not one of {', '.join(STATES)}")
        self.overrides[node] = Override(state, reason, by, now, now + ttl if ttl else None)
        record = self.nodes.setdefault(node, NodeRecord(since=now))
        if state in ("draining", "drained", "repair"):
            record.drain_origin, record.drain_reason = "operator", reason

    def resume(self, node: str, reason: str, by: str, now: float, ttl: float | None) -> None:
        """Lift FleetSight's drain and any override; with a ttl, keep the node fit that long whatever
        the signals say (an operator who knows better)."""
        self.overrides.pop(node, None)
        record = self.nodes.setdefault(node, NodeRecord(since=now))
        record.drain_origin, record.drain_reason = None, ""
        record.recent.clear()  # forget held reasons: the operator vouches for the node now
        if ttl:
            self.overrides[node] = Override("healthy", reason, by, now, now + ttl)

    # ------------------------------------------------------------------------------ the refresh
    def update(self, obs: Observation, now: float) -> list[dict[str, Any]]:
        """Apply one observation; returns the state-change events it produced."""
        policy = self.policy
        if self.last_update is not None:
            self.observed_node_seconds += max(0.0, now - self.last_update) * len(obs.nodes)
        self.last_update = now
        self.sources_ok = dict(obs.sources_ok)
        self.overrides = {n: o for n, o in self.overrides.items() if o.active(now)}
        for node, record in self.nodes.items():  # an operator's drain ends with its override
            if record.drain_origin == "operator" and node not in self.overrides:
                record.drain_origin, record.drain_reason = None, ""
        while self.grants and now - self.grants[0][0] > policy.breaker.window_s:
            self.grants.popleft()

        by_node: dict[str, list[Signal]] = {}
        for signal in obs.signals:
            if signal.effect != "ignore" and now - signal.since >= policy.confirm_for_s:
                by_node.setdefault(signal.node, []).append(signal)
        for node in set(obs.nodes) | set(by_node) | set(self.overrides) | set(obs.scheduler):
            record = self.nodes.setdefault(node, NodeRecord(since=now))
            record.unit = obs.nodes.get(node, record.unit or "")

        levels: dict[str, int] = {}
        for node, record in self.nodes.items():
            for signal in by_node.get(node, []):
                record.recent[signal.key] = (signal, now)
            record.recent = {
                k: (s, seen) for k, (s, seen) in record.recent.items() if now - seen <= policy.clean_for_s
            }
            levels[node] = max((LEVELS[s.effect] for s, _ in record.recent.values()), default=0)

        self._grant_drains(levels, obs, now)
        changes = []
        for node, record in self.nodes.items():
            state, reasons = self._decide(node, record, levels[node], obs.scheduler.get(node), now)
            if state != record.state:
                changes.append(self._transition(node, record, state, reasons, now))
            record.reasons = reasons
        self._publish(now)
        return changes

    def _grant_drains(self, levels: dict[str, int], obs: Observation, now: float) -> None:
        """Automatic drains within the circuit breaker; releases what is clean again."""
        for node, record in self.nodes.items():  # clean again (after hysteresis): no longer ours to drain
            if record.drain_origin == "auto" and levels[node] < LEVELS["unhealthy"]:
                record.drain_origin, record.drain_reason = None, ""
        if not self.policy.auto_drain:
            return
        candidates = [
            n
            for n, r in self.nodes.items()
            if levels[n] >= LEVELS["unhealthy"]
            and r.drain_origin is None
            and n not in self.overrides
            and not self._drained_by_other(n, obs)  # already out of service: nothing to grant or count
        ]
        granted, held, scope = self._breaker_allows(candidates, obs)
        for node in granted:
            record = self.nodes[node]
            top = max(record.recent.values(), key=lambda item: LEVELS[item[0].effect])[0]
            record.drain_origin = "auto"
            record.drain_reason = f"{top.name} ({top.source})"
            self.grants.append((now, node, record.unit))
        still_held = {
            n
            for n in self.breaker["held"]
            if levels.get(n, 0) >= LEVELS["unhealthy"] and self.nodes[n].drain_origin is None
        }
        self._set_breaker(sorted(set(held) | still_held), scope, now)

    @staticmethod
    def _drained_by_other(node: str, obs: Observation) -> bool:
        view = obs.scheduler.get(node)
        return view is not None and view.drained_by_other

    def _breaker_allows(
        self, candidates: list[str], obs: Observation
    ) -> tuple[list[str], list[str], str | None]:
        """Split this refresh's candidates into granted and held. A batch that would exceed a unit's or
        the cluster's allowance in the window is held whole: many at once means a common cause."""
        breaker = self.policy.breaker
        by_unit: dict[str, list[str]] = {}
        for node in candidates:
            by_unit.setdefault(self.nodes[node].unit, []).append(node)
        unit_sizes = Counter(obs.nodes.values())
        granted: list[str] = []
        held: list[str] = []
        scope = None
        for unit, nodes in by_unit.items():
            limit = max(breaker.min_nodes, math.floor(breaker.max_unit_fraction * unit_sizes.get(unit, 1)))
            wanted = sum(1 for _, _, u in self.grants if u == unit) + len(nodes)
            if wanted > limit:
                held += nodes
                scope = f"unit {unit}: {wanted} > {limit} in {breaker.window_s:.0f}s"
            else:
                granted += nodes
        cluster_limit = max(breaker.min_nodes, math.floor(breaker.max_cluster_fraction * len(obs.nodes)))
        wanted = len(self.grants) + len(granted)
        if granted and wanted > cluster_limit:
            held += granted
            granted = []
            scope = f"cluster: {wanted} > {cluster_limit} in {breaker.window_s:.0f}s"
        return granted, held, scope

    def _set_breaker(self, held: list[str], scope: str | None, now: float) -> None:
        if not held:
            self.breaker = {"open": False, "held": [], "since": None, "scope": None}
            return
        if not self.breaker["open"]:
            self.breaker["since"] = now
        self.breaker.update(open=True, held=held, scope=scope or self.breaker["scope"])

    def _decide(
        self, node: str, record: NodeRecord, level: int, view: SchedulerView | None, now: float
    ) -> tuple[str, list[dict[str, Any]]]:
        reasons = []
        for signal, seen in sorted(record.recent.values(), key=lambda item: -LEVELS[item[0].effect]):
            reasons.append(reason_of(signal, now, cleared=None if seen == now else seen))
        override = self.overrides.get(node)
        if override is not None:
            reasons.insert(0, self._override_reason(override))
            if override.state in ("draining", "drained"):
                return self._drain_progress(view, "draining"), reasons
            return override.state, reasons
        if view is not None and view.drained_by_other:
            reasons.insert(
                0,
                {
                    "signal": "scheduler_drain",
                    "source": "scheduler",
                    "effect": "unhealthy",
                    "since": None,
                    "evidence": {"states": list(view.states), "reason": view.reason},
                    "runbook": "",
                    "summary": f"drained in the scheduler: {view.reason}",
                },
            )
            return self._drain_progress(view, "draining"), reasons
        if record.drain_origin == "auto":
            drained = self._drain_progress(view, "draining")
            if drained == "drained" and level >= LEVELS["repair"]:
                return "repair", reasons
            return drained, reasons
        if level >= LEVELS["unhealthy"]:
            if node in self.breaker["held"]:
                reasons.insert(0, self._breaker_reason())
            return "unhealthy", reasons
        return ("degraded" if level else "healthy"), reasons

    @staticmethod
    def _drain_progress(view: SchedulerView | None, fallback: str) -> str:
        """drained once the scheduler shows the drain applied and no work left on the node; with a
        jobs-only view (no node states), once it runs no job; without any view, still draining."""
        if view is None:
            return fallback
        applied = not view.states or any(s.startswith("DRAIN") for s in view.states)
        return "drained" if applied and not view.busy else "draining"

    def _override_reason(self, override: Override) -> dict[str, Any]:
        return {
            "signal": "override",
            "source": "operator",
            "effect": override.state,
            "since": iso(override.created),
            "evidence": {"by": override.by, "expires": iso(override.expires) if override.expires else None},
            "runbook": "",
            "summary": override.reason,
        }

    def _breaker_reason(self) -> dict[str, Any]:
        return {
            "signal": "circuit_breaker",
            "source": "health",
            "effect": "unhealthy",
            "since": iso(self.breaker["since"]),
            "evidence": {"scope": self.breaker["scope"], "held": len(self.breaker["held"])},
            "runbook": BREAKER_RUNBOOK,
            "summary": "not drained automatically: the circuit breaker holds (too many at once)",
        }

    def _transition(
        self, node: str, record: NodeRecord, state: str, reasons: list[dict[str, Any]], now: float
    ) -> dict[str, Any]:
        if (
            record.state in FIT_STATES
            and state not in FIT_STATES
            and reasons
            and reasons[0]["source"] != "operator"
        ):
            self.failures += 1
        event = {
            "id": self.next_event_id,
            "time": iso(now),
            "node": node,
            "from": record.state,
            "to": state,
            "reasons": [r["signal"] for r in reasons],
            "summary": reasons[0]["summary"] if reasons else "clean",
        }
        self.next_event_id += 1
        record.history.append(
            {"time": event["time"], "from": record.state, "to": state, "reasons": event["reasons"]}
        )
        record.state, record.since = state, now
        self.events.append(event)
        return event

    # ------------------------------------------------------------------------------ readers
    def _publish(self, now: float) -> None:
        nodes = {}
        for node, record in sorted(self.nodes.items()):
            nodes[node] = {
                "node": node,
                "state": record.state,
                "since": iso(record.since),
                "unit": record.unit,
                "fit": record.state in FIT_STATES,
                "reasons": record.reasons,
                "drain": {"origin": record.drain_origin, "reason": record.drain_reason}
                if record.drain_origin
                else None,
                "history": list(record.history),
            }
        self._snapshot = {
            "nodes": nodes,
            "updated": iso(now),
            "breaker": dict(
                self.breaker, since=iso(self.breaker["since"]) if self.breaker["since"] else None
            ),
            "sources": dict(self.sources_ok),
        }

    def snapshot(self) -> dict[str, Any]:
        return self._snapshot

    def drain_list(self) -> list[dict[str, Any]]:
        """Nodes FleetSight wants out of scheduling, and why (what slurm-sync and lsf-sync apply)."""
        wanted = []
        for node, record in sorted(self.nodes.items()):
            if record.drain_origin and record.state in ("draining", "drained", "repair"):
                wanted.append(
                    {
                        "node": node,
                        "state": record.state,
                        "origin": record.drain_origin,
                        "reason": f"{OUR_REASON_PREFIX} {record.drain_reason}",
                    }
                )
        return wanted

    def node_mtbf(self) -> tuple[float, str]:
        """The mean time between failures of one node, and whether it is measured or the prior."""
        if self.failures >= self.policy.min_failures and self.observed_node_seconds > 0:
            return self.observed_node_seconds / self.failures, "measured"
        return self.policy.assumed_node_mtbf_s, "prior"
