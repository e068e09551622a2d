"""The health state machine: signals in, one state per node out, with reasons, history and events.

Pure logic with an explicit clock (``now`` arguments), so the service and the tests drive it the same
way. Two ways in: a whole :class:`Observation` (:meth:`HealthEngine.update`: every node re-decided; the
tests and the reconcile sweep's building block), or events (:meth:`HealthEngine.set_signal`,
:meth:`HealthEngine.clear_signal`, :meth:`HealthEngine.replace_source`, then :meth:`HealthEngine.process`),
which re-decide only the nodes they name plus the few whose held reasons, overrides or breaker hold are
running out: the service's cost follows events, not nodes. Readers take the immutable snapshot it
publishes (:meth:`HealthEngine.snapshot`), never the engine's working state.

Its vocabulary (states, levels, signals, records) is health/model.py; the circuit breaker's rule is
health/breaker.py; the state file's layout health/state_file.py; the shapes readers see health/views.py.
"""

from __future__ import annotations

from collections import Counter, deque
from pathlib import Path
from typing import Any

from . import breaker, state_file
from .model import (
    FIT_STATES,
    LEVELS,
    OVERRIDE_STATES,
    NodeRecord,
    Observation,
    Override,
    SchedulerView,
    Signal,
    iso,
    reason_of,
)
from .policy import Policy
from .views import drain_entry, node_item, override_reason, scheduler_drain_reason


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
        self.breaker: dict[str, Any] = breaker.closed()
        self.sources_ok: dict[str, bool] = {}
        self._snapshot: dict[str, Any] = {"nodes": {}, "updated": None}
        self.started = now
        self.inventory: dict[str, str] = {}  # node -> scalable unit, from the sources' node lists
        self.unit_sizes: Counter[str] = Counter()
        self.scheduler: dict[str, SchedulerView] = {}
        self.dirty: set[str] = set()  # named by an event or an operator since the last process()
        self.pending: set[str] = set()  # held reasons or unconfirmed signals: re-decided every process()
        self.touched_at: dict[tuple[str, str], float] = {}  # (node, key) -> time of its last event
        self.changed: set[str] = set()  # nodes re-decided by the last update/process (for renderers)
        self.release_gate: Any = None  # health/validation.py: (node, drain_reason, now) -> may resume
        self.replica = ""  # the election identity of the replica deciding ("" when it is the only one)
        self._load()

    # ------------------------------------------------------------------------------ persistence
    def _state_file(self) -> Path | None:
        return self.state_dir / state_file.STATE_FILE if self.state_dir else None

    def _load(self) -> None:
        data = state_file.load(self._state_file())
        if data is not None:
            state_file.restore(self, data)

    def save(self) -> None:
        path = self._state_file()
        if path is not None:
            state_file.write(path, state_file.saved(self))

    # ------------------------------------------------------------------------------ operator actions
    def set_override(
        self, node: str, state: str, reason: str, by: str, now: float, ttl: float | None
    ) -> None:
        if state not in OVERRIDE_STATES:
            raise ValueError(f"state {state!r} is not one of {', '.join(OVERRIDE_STATES)}")
        self.overrides[node] = Override(state, reason, by, now, now + ttl if ttl else None)
        record = self.nodes.setdefault(node, NodeRecord(since=now))
        self.dirty.add(node)
        if state in ("draining", "drained", "repair"):
            record.drain_origin, record.drain_reason = "operator", reason

    def resume(self, node: str, reason: str, by: str, now: float, ttl: float | None) -> None:
        """Lift FleetSight's drain and any override; with a ttl, keep the node fit that long whatever
        the signals say (an operator who knows better)."""
        self.overrides.pop(node, None)
        record = self.nodes.setdefault(node, NodeRecord(since=now))
        record.drain_origin, record.drain_reason = None, ""
        record.recent.clear()  # forget held reasons: the operator vouches for the node now
        self.dirty.add(node)
        if ttl:
            self.overrides[node] = Override("healthy", reason, by, now, now + ttl)

    def remove_override(self, node: str) -> bool:
        """Drop an operator's override; False if the node had none."""
        self.dirty.add(node)
        return self.overrides.pop(node, None) is not None

    # ------------------------------------------------------------------------------ the whole fleet
    def update(self, obs: Observation, now: float) -> list[dict[str, Any]]:
        """Apply one observation of the whole fleet: every signal not in it stops firing (its reason is
        then held for clean_for). Returns the state-change events it produced."""
        self.set_inventory(obs.nodes)
        self.sources_ok = dict(obs.sources_ok)
        self.scheduler = dict(obs.scheduler)
        by_node: dict[str, dict[str, Signal]] = {}
        for signal in obs.signals:
            if signal.effect != "ignore":
                by_node.setdefault(signal.node, {})[signal.key] = signal
        for node in set(obs.nodes) | set(by_node) | set(self.overrides) | set(obs.scheduler):
            self._record(node, now)
        for node, record in self.nodes.items():
            record.active = by_node.get(node, {})
        return self._evaluate(set(self.nodes), now)

    def set_inventory(self, nodes: dict[str, str]) -> None:
        """The fleet's nodes and their units (the breaker's denominators); new nodes start healthy."""
        self.inventory = dict(nodes)
        self.unit_sizes = Counter(nodes.values())
        for node, unit in nodes.items():
            record = self._record(node, self.last_update or 0.0)
            if record.unit != unit:
                record.unit = unit
                self.dirty.add(node)

    def _record(self, node: str, now: float) -> NodeRecord:
        record = self.nodes.get(node)
        if record is None:
            record = self.nodes[node] = NodeRecord(since=now, unit=self.inventory.get(node, ""))
            self.dirty.add(node)
        return record

    # ------------------------------------------------------------------------------ events
    def set_signal(self, signal: Signal, now: float) -> None:
        """A signal fires (or fires on): its node is re-decided at the next process()."""
        if signal.effect == "ignore":
            return
        self._record(signal.node, now).active[signal.key] = signal
        self.touched_at[(signal.node, signal.key)] = now
        self.dirty.add(signal.node)

    def clear_signal(self, node: str, key: str, now: float) -> None:
        """A signal stopped: its reason is held for clean_for from now."""
        record = self.nodes.get(node)
        self.touched_at[(node, key)] = now
        signal = record.active.pop(key, None) if record is not None else None
        if record is not None and signal is not None:
            confirmed = self.policy.confirm_for_s <= 0 or now - signal.since >= self.policy.confirm_for_s
            if confirmed:  # held from its last sighting: now
                record.recent[key] = (signal, now)
            self.dirty.add(node)

    def replace_source(
        self, sources: set[str], signals: list[Signal], now: float, quiet_since: float | None = None
    ) -> tuple[int, int]:
        """Make the firing signals of these sources exactly ``signals`` (a sweep, a scheduler poll),
        touching only the nodes whose signals differ. Keys an event touched after ``quiet_since`` are left
        as the event set them (it is newer than the sweep's read). Returns (added, removed)."""
        wanted = {(s.node, s.key): s for s in signals if s.effect != "ignore" and s.source in sources}
        added = removed = 0
        for node, record in self.nodes.items():
            for key, signal in list(record.active.items()):
                if (
                    signal.source in sources
                    and (node, key) not in wanted
                    and not self._newer(node, key, quiet_since)
                ):
                    self.clear_signal(node, key, now)
                    removed += 1
        for (node, key), signal in wanted.items():
            record = self.nodes.get(node)
            if record is not None and key in record.active:
                record.active[key] = signal  # fresher evidence, same reason: no re-decision needed
            elif not self._newer(node, key, quiet_since):
                self.set_signal(signal, now)
                added += 1
        if quiet_since is not None:  # what the sweep has seen past needs no protecting any more
            self.touched_at = {k: t for k, t in self.touched_at.items() if t > quiet_since}
        return added, removed

    def _newer(self, node: str, key: str, since: float | None) -> bool:
        return since is not None and self.touched_at.get((node, key), float("-inf")) > since

    def set_scheduler(self, views: dict[str, SchedulerView]) -> None:
        """The scheduler's view of every node; only nodes whose view changed are re-decided."""
        for node in set(views) | set(self.scheduler):
            if views.get(node) != self.scheduler.get(node):
                self.dirty.add(node)
                self._record(node, self.last_update or 0.0)
        self.scheduler = dict(views)

    def awaiting_scheduler(self) -> bool:
        """Whether a drain waits for the scheduler to apply it (the scheduler is then read every tick)."""
        return any(record.state == "draining" for record in self.nodes.values())

    def process(self, now: float) -> list[dict[str, Any]]:
        """Re-decide the nodes events named since the last call, and those whose held reasons,
        unconfirmed signals, overrides or breaker hold may have run out."""
        subset = self.dirty | self.pending | set(self.overrides) | set(self.breaker["held"])
        return self._evaluate(subset, now)

    # ------------------------------------------------------------------------------ deciding
    def _evaluate(self, subset: set[str], now: float) -> list[dict[str, Any]]:
        policy = self.policy
        if self.last_update is not None:
            self.observed_node_seconds += max(0.0, now - self.last_update) * len(self.inventory)
        self.last_update = now
        expired = {n for n, o in self.overrides.items() if not o.active(now)}
        self.overrides = {n: o for n, o in self.overrides.items() if n not in expired}
        subset = subset | expired | set(self.breaker["held"])
        self.dirty = set()
        for node in subset:  # an operator's drain ends with its override
            record = self._record(node, now)
            if record.drain_origin == "operator" and node not in self.overrides:
                record.drain_origin, record.drain_reason = None, ""
        while self.grants and now - self.grants[0][0] > policy.breaker.window_s:
            self.grants.popleft()
        # the whole fleet in its own order (as update() always did); a few nodes in name order
        order = list(self.nodes) if len(subset) >= len(self.nodes) else sorted(subset)
        levels = {node: self._refresh(node, self.nodes[node], now) for node in order}
        self._grant_drains(levels, now)
        changes = []
        for node in order:
            record = self.nodes[node]
            state, reasons = self._decide(node, record, levels[node], self.scheduler.get(node), now)
            if state != record.state:
                changes.append(self._transition(node, record, state, reasons, now))
            record.reasons = reasons
        self.changed = set(order)
        self._publish(now, order)
        return changes

    def _refresh(self, node: str, record: NodeRecord, now: float) -> int:
        """Count the node's firing signals as seen now, let go of what is clean for long enough, and
        return its level. A node still holding something is re-decided at every process()."""
        policy = self.policy
        unconfirmed = False
        for key, signal in record.active.items():
            if (
                policy.confirm_for_s <= 0 or now - signal.since >= policy.confirm_for_s
            ):  # a clock ahead: still counts
                record.recent[key] = (signal, now)
            else:
                unconfirmed = True
        record.recent = {
            k: (s, seen) for k, (s, seen) in record.recent.items() if now - seen <= policy.clean_for_s
        }
        if unconfirmed or len(record.recent) > len(record.active):
            self.pending.add(node)
        else:
            self.pending.discard(node)
        return max((LEVELS[s.effect] for s, _ in record.recent.values()), default=0)

    def _grant_drains(self, levels: dict[str, int], now: float) -> None:
        """Automatic drains within the circuit breaker, for the nodes being re-decided (``levels``; the
        breaker's held nodes always are); releases what is clean again."""
        for node, level in levels.items():  # clean again (after hysteresis): no longer ours to drain
            record = self.nodes[node]
            if record.drain_origin == "auto" and level < LEVELS["unhealthy"]:
                if self.release_gate is not None and not self.release_gate(node, record.drain_reason, now):
                    continue  # the checks its fault calls for have not passed yet (health/validation.py)
                record.drain_origin, record.drain_reason = None, ""
        if not self.policy.auto_drain:
            return
        candidates = [
            n
            for n, level in levels.items()
            if level >= LEVELS["unhealthy"]
            and self.nodes[n].drain_origin is None
            and n not in self.overrides
            and not self._drained_by_other(n)  # already out of service: nothing to grant or count
        ]
        granted, held, scope = breaker.split_batch(
            candidates,
            {n: self.nodes[n].unit for n in candidates},
            self.grants,
            self.unit_sizes,
            len(self.inventory),
            self.policy.breaker,
        )
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
        self.breaker = breaker.hold(self.breaker, sorted(set(held) | still_held), scope, now)

    def _drained_by_other(self, node: str) -> bool:
        view = self.scheduler.get(node)
        return view is not None and view.drained_by_other

    def _decide(
        self, node: str, record: NodeRecord, level: int, view: SchedulerView | None, now: float
    ) -> tuple[str, list[dict[str, Any]]]:
        reasons = []
        for signal, seen in sorted(record.recent.values(), key=lambda item: -LEVELS[item[0].effect]):
            reasons.append(reason_of(signal, now, cleared=None if seen == now else seen))
        override = self.overrides.get(node)
        if override is not None:
            reasons.insert(0, override_reason(override))
            if override.state in ("draining", "drained"):
                return self._drain_progress(view, "draining"), reasons
            return override.state, reasons
        if view is not None and view.drained_by_other:
            reasons.insert(0, scheduler_drain_reason(view))
            return self._drain_progress(view, "draining"), reasons
        if record.drain_origin == "auto":
            drained = self._drain_progress(view, "draining")
            if drained == "drained" and level >= LEVELS["repair"]:
                return "repair", reasons
            return drained, reasons
        if level >= LEVELS["unhealthy"]:
            if node in self.breaker["held"]:
                reasons.insert(0, breaker.held_reason(self.breaker))
            return "unhealthy", reasons
        if level:
            return "degraded", reasons
        return ("unobserved" if self._unobserved(record) else "healthy"), reasons

    def _unobserved(self, record: NodeRecord) -> bool:
        return any(
            s.effect == "blind" and self.policy.leaves_unobserved(s.name, s.evidence.get("labels", {}))
            for s in record.active.values()
        )

    @staticmethod
    def _drain_progress(view: SchedulerView | None, fallback: str) -> str:
        """drained once the scheduler shows the drain applied and no work left on the node; with a
        jobs-only view (no node states), once it runs no job; without any view, still draining."""
        if view is None:
            return fallback
        applied = not view.states or any(s.startswith("DRAIN") for s in view.states)
        return "drained" if applied and not view.busy else "draining"

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
            "replica": self.replica,  # who decided: "no write by a non-leader" is checked on this
        }
        self.next_event_id += 1
        record.history.append(
            {"time": event["time"], "from": record.state, "to": state, "reasons": event["reasons"]}
        )
        record.state, record.since = state, now
        self.events.append(event)
        return event

    # ------------------------------------------------------------------------------ readers
    def _publish(self, now: float, changed: list[str]) -> None:
        """A new snapshot: the re-decided nodes' items replaced, the others' items shared with the last
        one (readers hold the old snapshot undisturbed)."""
        previous = self._snapshot["nodes"]
        # whole again when the last one lacks a node: a new node, or nodes restored from the state file
        # at a restart (not re-decided, so never "changed": a partial update would leave them unlisted)
        if (
            len(previous) != len(self.nodes)
            or len(changed) >= len(self.nodes)
            or any(n not in previous for n in changed)
        ):
            nodes = {node: node_item(node, record) for node, record in sorted(self.nodes.items())}
        else:
            nodes = dict(previous)
            for node in changed:
                nodes[node] = node_item(node, self.nodes[node])
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
        return [
            drain_entry(node, record)
            for node, record in sorted(self.nodes.items())
            if record.drain_origin and record.state in ("draining", "drained", "repair")
        ]

    def node_mtbf(self) -> tuple[float, str]:
        """The mean time between failures of one node, and whether it is measured or the prior."""
        if self.failures >= self.policy.min_failures and self.observed_node_seconds > 0:
            return self.observed_node_seconds / self.failures, "measured"
        return self.policy.assumed_node_mtbf_s, "prior"
