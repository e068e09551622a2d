"""The validation gate: a node FleetSight drained for a fault returns to service only after the checks
its fault calls for have passed (checks/policy.yml, read from the checks service's GET /v1/policy).

Where each node is: ``drained`` (FleetSight's drain, fault still present or node not idle yet) ->
``repair`` (a repair signal) -> ``validating`` (the signal cleared; waiting for fresh passing results
of the required checks) -> ``resumed`` (all passed: the drain is released) or ``failed`` (one failed:
the node stays out; a later passing run of that check resumes it).

Only results that finished after the node entered validation count, so a pass from before the repair
never resumes a node. A result whose outcome is ``unknown`` (the check could not look: tool missing,
exporter unreachable) neither resumes nor fails the node: it stays ``validating`` with the check listed
under ``unknown``, and FleetSightBlind says what to fix. The gate reads with the bearer token (scope
``read``) of the file FLEETSIGHT_CHECKS_READ_TOKEN_FILE names, where the checks service asks for one.
The gate reads the checks service in a thread of its own, never inside a refresh;
when the service cannot be read, nothing is resumed (a gate that cannot see its evidence stays shut).

Installed by :func:`add_routes` when ``FLEETSIGHT_CHECKS_URL`` names the checks service; without it the
engine releases drains as before."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
from fastapi import Depends, FastAPI, HTTPException

from fleetsight.secrets import SecretFileError, read_secret_file

from .service_protocol import Service

log = logging.getLogger("fleetsight.health.validation")
READ_TOKEN_FILE_ENV = "FLEETSIGHT_CHECKS_READ_TOKEN_FILE"  # a token with scope `read` at the checks service


@dataclass
class Validation:
    node: str
    signal: str
    since: float  # entered validation: only results finished after this count
    required: list[str]
    phase: str = "validating"
    failed: list[dict[str, Any]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unknown: list[dict[str, Any]] = field(default_factory=list)  # ran, could not look: not evidence
    decided: float | None = None


class ValidationGate:
    """``may_release(node, drain_reason, now)`` is the engine's release hook (HealthEngine.release_gate)."""

    def __init__(self, checks_url: str | None, token: str | None = None) -> None:
        self.checks_url = checks_url.rstrip("/") if checks_url else None
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.results: dict[tuple[str, str], dict[str, Any]] = {}
        self.policy: dict[str, Any] | None = None
        self.error = ""
        self.nodes: dict[str, Validation] = {}
        self.lock = threading.Lock()

    # -------------------------------------------------------------- reading the checks service
    def refresh(self) -> set[str]:
        """Read results and policy; return the nodes under validation whose results changed."""
        if self.checks_url is None:
            return set()
        try:
            policy = self._get("/v1/policy")
            items = self._get("/v1/results")["results"]
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            self.error = f"checks service {self.checks_url}: {exc}"
            return set()
        results = {(r["node"], r["check"]): r for r in items}
        with self.lock:
            changed = {
                n for (n, c), r in results.items() if self.results.get((n, c)) != r and n in self.nodes
            }
            self.results, self.policy, self.error = results, policy, ""
        return changed

    def _get(self, path: str) -> Any:
        response = httpx.get(f"{self.checks_url}{path}", headers=self.headers, timeout=5)
        return response.raise_for_status().json()

    # -------------------------------------------------------------- the gate
    def required_for(self, signal: str) -> list[str] | None:
        if self.policy is None:
            return None
        return list(self.policy["after"].get(signal, self.policy["default"]))

    def may_release(self, node: str, drain_reason: str, now: float) -> bool:
        signal = drain_reason.split(" ", 1)[0]  # the engine writes "<signal> (<source>)"
        with self.lock:
            entry = self.nodes.get(node)
            if entry is None or entry.phase == "resumed" or entry.signal != signal:
                required = self.required_for(signal)
                if required is None:  # no policy read yet: nothing is known to have passed
                    return False
                entry = self.nodes[node] = Validation(node, signal, now, required)
                log.info(
                    "event=validation_started node=%s signal=%s checks=%s", node, signal, ",".join(required)
                )
            return self._decide(entry, now)

    def _decide(self, entry: Validation, now: float) -> bool:
        fresh = {
            c: r
            for c in entry.required
            if (r := self.results.get((entry.node, c))) and r["finished"] >= entry.since
        }
        outcomes = {c: _outcome(r) for c, r in fresh.items()}
        entry.missing = [c for c in entry.required if outcomes.get(c) in (None, "unknown")]
        entry.failed = [
            {k: r.get(k) for k in ("check", "summary", "finished", "runbook")}
            for c, r in fresh.items()
            if outcomes[c] == "failed"
        ]
        entry.unknown = [
            {k: r.get(k) for k in ("check", "summary", "finished", "reason")}
            for c, r in fresh.items()
            if outcomes[c] == "unknown"
        ]
        phase = "failed" if entry.failed else "validating" if entry.missing else "resumed"
        if phase != entry.phase:
            entry.decided = now
            log.info("event=validation node=%s phase=%s", entry.node, phase)
        entry.phase = phase
        return phase == "resumed"

    # -------------------------------------------------------------- where each node is
    def view(self, records: dict[str, Any]) -> list[dict[str, Any]]:
        """Every node FleetSight holds drained, or the gate has seen, with its phase."""
        out = []
        with self.lock:
            for node, record in sorted(records.items()):
                entry = self.nodes.get(node)
                if record.drain_origin == "auto" and (entry is None or entry.phase == "resumed"):
                    phase = "repair" if record.state == "repair" else "drained"
                    out.append(
                        {"node": node, "phase": phase, "state": record.state, "drain": record.drain_reason}
                    )
                elif entry is not None:
                    out.append({**asdict(entry), "state": record.state})
        return out


def _outcome(result: dict[str, Any]) -> str:
    """passed, failed or unknown; a checks service older than outcomes sends ``passed`` alone."""
    outcome = result.get("outcome")
    if outcome in ("passed", "failed", "unknown"):
        return str(outcome)
    return "passed" if result.get("passed") is True else "failed"


def _read_token() -> str | None:
    """The read token's file, else the checks token the node's units already get (Debian's health unit:
    FLEETSIGHT_CHECKS_TOKEN_FILE); none: reads go without a token (the service's open reads)."""
    for variable in (READ_TOKEN_FILE_ENV, "FLEETSIGHT_CHECKS_TOKEN_FILE"):
        path = os.environ.get(variable)
        if path:
            try:
                return read_secret_file(path, variable).splitlines()[0].strip()
            except SecretFileError as exc:  # the gate then reads without one, and says why it is refused
                log.error("event=checks_token_unreadable error=%s", exc)
                return None
    return None


def _refresh_loop(gate: ValidationGate, service: Service, interval: float) -> None:
    while not service.stop_event.wait(interval):
        changed = gate.refresh()
        if changed:  # re-decide those nodes at the service's next pass
            service.engine.dirty.update(changed)
            service.wake.set()


def add_routes(app: FastAPI, service: Service, reader: Any) -> ValidationGate:
    """The read-only route, and the gate on the engine when the checks service is configured."""
    gate = ValidationGate(os.environ.get("FLEETSIGHT_CHECKS_URL"), _read_token())
    if gate.checks_url:
        gate.refresh()
        service.engine.release_gate = gate.may_release
        interval = float(os.environ.get("FLEETSIGHT_CHECKS_REFRESH", "5"))
        threading.Thread(target=_refresh_loop, args=(gate, service, interval), daemon=True).start()

    @app.get(
        "/v1/validation",
        summary="Where each drained node is: drained, repair, validating, resumed, failed",
        dependencies=[Depends(reader)],
    )
    async def validation() -> dict[str, Any]:
        return {
            "enabled": bool(gate.checks_url),
            "error": gate.error,
            "nodes": gate.view(service.engine.nodes),
        }

    @app.get("/v1/validation/{node}", summary="One node's validation", dependencies=[Depends(reader)])
    async def validation_node(node: str) -> dict[str, Any]:
        found = [item for item in gate.view(service.engine.nodes) if item["node"] == node]
        if not found:
            raise HTTPException(
                status_code=404, detail=f"node {node!r} is not drained or validated by FleetSight"
            )
        return found[0]

    return gate
