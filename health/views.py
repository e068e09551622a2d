"""How the engine's records look to readers: a node's item in the published snapshot, its entry in the
drain list, and the reasons that are no source's signal (an operator's override, another party's drain
in the scheduler).

A module of its own: these are the shapes of the API's answers and of what the sync programs apply, so
they change when a reader needs more, not when the decision logic does. Pure functions of one record.
"""

from __future__ import annotations

from typing import Any

from .model import FIT_STATES, OUR_REASON_PREFIX, NodeRecord, Override, SchedulerView, iso


def node_item(node: str, record: NodeRecord) -> dict[str, Any]:
    return {
        "node": node,
        "state": record.state,
        "since": iso(record.since),
        "unit": record.unit,
        "fit": record.state in FIT_STATES,
        "reasons": [r for r in record.reasons if r["effect"] != "blind"],
        # what FleetSight could not observe on this node now: its own deployment's fault, not the node's
        "blind_spots": [r for r in record.reasons if r["effect"] == "blind" and "last_seen" not in r],
        "drain": {"origin": record.drain_origin, "reason": record.drain_reason}
        if record.drain_origin
        else None,
        "history": list(record.history),
    }


def drain_entry(node: str, record: NodeRecord) -> dict[str, Any]:
    """One line of the drain list (what slurm-sync and lsf-sync apply)."""
    return {
        "node": node,
        "state": record.state,
        "origin": record.drain_origin,
        "reason": f"{OUR_REASON_PREFIX} {record.drain_reason}",
        "evidence": drain_evidence(record),
    }


def drain_evidence(record: NodeRecord) -> list[dict[str, Any]]:
    """The reasons that allow the drain (effect unhealthy or repair; a blind spot never does), each
    with its source, since when, and the labels that identify it."""
    return [
        {k: r.get(k) for k in ("signal", "source", "effect", "since", "summary", "runbook")}
        | {"labels": (r.get("evidence") or {}).get("labels", {})}
        for r in record.reasons
        if r.get("effect") in ("unhealthy", "repair")
    ]


def override_reason(override: Override) -> dict[str, Any]:
    return {
        "signal": "override",
        "source": "operator",
        "effect": override.state,
        "since": iso(override.created),
        "evidence": {"by": override.by, "expires": iso(override.expires) if override.expires else None},
        "runbook": "",
        "summary": override.reason,
    }


def scheduler_drain_reason(view: SchedulerView) -> dict[str, Any]:
    """A drain someone else set in the scheduler: FleetSight shows it and leaves it alone."""
    return {
        "signal": "scheduler_drain",
        "source": "scheduler",
        "effect": "unhealthy",
        "since": None,
        "evidence": {"states": list(view.states), "reason": view.reason},
        "runbook": "",
        "summary": f"drained in the scheduler: {view.reason}",
    }
