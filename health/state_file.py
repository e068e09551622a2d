"""The engine's state file (``state.json`` in the state directory): what must outlive a restart or a
takeover — overrides, drains and their origin, the breaker's grants, failure counts, node states, held
reasons (the hysteresis memory) and recent events.

A module of its own: the file's layout is a contract between a replica that writes it and one that
starts from it (health/replica.py copies the leader's file as is), and it changes for reasons of its own,
apart from the decision logic. The functions work on anything with the engine's durable attributes.
"""

from __future__ import annotations

import json
import os
from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from .model import NodeRecord, Override, Signal

STATE_FILE = "state.json"
EVENTS_SAVED = 1000


class Durable(Protocol):
    """The engine's attributes that the state file holds."""

    overrides: dict[str, Override]
    grants: deque[tuple[float, str, str]]
    failures: int
    observed_node_seconds: float
    next_event_id: int
    nodes: dict[str, NodeRecord]
    pending: set[str]
    events: deque[dict[str, Any]]


def restore(engine: Durable, data: dict[str, Any]) -> None:
    """Put a saved state back into a freshly made engine."""
    engine.overrides = {n: Override(**o) for n, o in data.get("overrides", {}).items()}
    engine.grants = deque(tuple(g) for g in data.get("grants", []))  # type: ignore[misc]
    engine.failures = int(data.get("failures", 0))
    engine.observed_node_seconds = float(data.get("observed_node_seconds", 0.0))
    engine.next_event_id = int(data.get("next_event_id", 1))
    for node, saved in data.get("states", {}).items():  # so a restart emits no made-up changes
        engine.nodes[node] = NodeRecord(unit=saved["unit"], state=saved["state"], since=saved["since"])
    for node, saved in data.get("drains", {}).items():
        record = engine.nodes.setdefault(node, NodeRecord())
        record.drain_origin, record.drain_reason = saved["origin"], saved["reason"]
    # The hysteresis memory: a restart inside clean_for must not release a node early.
    for node, held in data.get("recent", {}).items():
        record = engine.nodes.setdefault(node, NodeRecord())
        for saved_signal, last_seen in held:
            kept = Signal(**saved_signal)
            record.recent[kept.key] = (kept, float(last_seen))
        engine.pending.add(node)  # re-decided while held: its reasons shown, its clean_for counted
    for event in data.get("events", []):
        engine.events.append(event)


def saved(engine: Durable) -> dict[str, Any]:
    """The engine's durable state, as the state file holds it."""
    return {
        "overrides": {n: asdict(o) for n, o in engine.overrides.items()},
        "grants": list(engine.grants),
        "failures": engine.failures,
        "observed_node_seconds": engine.observed_node_seconds,
        "next_event_id": engine.next_event_id,
        "drains": {
            n: {"origin": r.drain_origin, "reason": r.drain_reason}
            for n, r in engine.nodes.items()
            if r.drain_origin
        },
        "events": list(engine.events)[-EVENTS_SAVED:],
        "states": {n: {"state": r.state, "since": r.since, "unit": r.unit} for n, r in engine.nodes.items()},
        "recent": {
            n: [[asdict(sig), seen] for sig, seen in r.recent.values()]
            for n, r in engine.nodes.items()
            if r.recent
        },
    }


def load(path: Path | None) -> dict[str, Any] | None:
    """The saved state, or None when there is none."""
    if path is None or not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def write(path: Path, data: dict[str, Any]) -> None:
    """Replace the file whole, so a reader or a crash never meets half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
