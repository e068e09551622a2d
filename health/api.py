"""The health service's REST API: the FastAPI app, its request models, and who may call what.

Reads answer from the snapshot the worker published (health/rendered.py), never from a source, so a slow
Prometheus cannot slow the scheduler's prolog. Writes (drain, resume, overrides) need a bearer token with
the right scope; reads are open when the policy says so (``api.open_reads``). Tokens come from
FLEETSIGHT_HEALTH_TOKENS or the file named by FLEETSIGHT_HEALTH_TOKENS_FILE, never from the policy file,
and are never logged. The other route groups (events in, discovery, jobs, validation, the replica copy)
live in their own modules; :func:`create_app` puts them all on one app.

No ``from __future__ import annotations`` here: the routes' dependency aliases (``Reader``...) are local
to the functions that register them, and FastAPI must see them evaluated.
"""

import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import BaseModel, Field

from fleetsight import auth
from fleetsight.secrets import SecretFileError, read_secret_file

from .discovery import add_routes as add_discovery_routes
from .intake import add_event_routes
from .jobs import add_routes as add_job_routes
from .metrics import HealthCollector
from .model import OVERRIDE_STATES, STATES
from .policy import PolicyError, parse_duration
from .replica import add_replica_routes, leader_status, replica_identity, replica_role
from .service_protocol import Service
from .validation import add_routes as add_validation_routes

State = Literal[OVERRIDE_STATES]  # type: ignore[valid-type]  # the states an operator may set
SCOPES = ("read", "drain", "override", "events")
Require = Callable[[str], Any]  # a scope -> the FastAPI dependency that checks the bearer token for it


# ---------------------------------------------------------------------------------- tokens
def load_tokens(
    environ: Mapping[str, str] = os.environ, events_token_file: Path | None = None
) -> dict[str, frozenset[str]]:
    """FLEETSIGHT_HEALTH_TOKENS and FLEETSIGHT_HEALTH_TOKENS_FILE (fleetsight.auth's scheme), plus the
    bare bearer token of ``events_token_file`` with scope ``events``: the very file Alertmanager's
    ``http_config.authorization.credentials_file`` names, so one secret serves both ends."""
    try:
        tokens = auth.load_tokens("FLEETSIGHT_HEALTH", SCOPES, environ)
    except auth.TokenError as exc:
        raise PolicyError(str(exc)) from None
    if events_token_file is not None:
        try:
            token = read_secret_file(events_token_file, "--events-token-file")
        except SecretFileError as exc:
            raise PolicyError(str(exc)) from None
        tokens[token] = tokens.get(token, frozenset()) | {"events"}
    return tokens


# ---------------------------------------------------------------------------------- API models
class JSONBytes(Response):
    media_type = "application/json"


class PreflightRequest(BaseModel):
    nodes: list[str] = Field(min_length=1, max_length=100000, description="Nodes a job is about to run on")


class DrainRequest(BaseModel):
    reason: str = Field(min_length=3, max_length=500, description="Why; shown in the scheduler")
    expires_in: str | None = Field(None, description="Lift the drain after this long (e.g. 4h); none: never")
    repair: bool = Field(False, description="The node needs a technician: state `repair` instead of drained")


class ResumeRequest(BaseModel):
    reason: str = Field(min_length=3, max_length=500)
    keep_fit_for: str | None = Field(
        None, description="Keep the node fit this long whatever the signals say (a known false alarm)"
    )


class OverrideRequest(BaseModel):
    state: State = Field(description=f"One of {', '.join(OVERRIDE_STATES)}")
    reason: str = Field(min_length=3, max_length=500)
    expires_in: str = Field(description="Every override expires (e.g. 30m, 8h)")


def create_app(service: Service) -> FastAPI:
    app = FastAPI(
        title="FleetSight health service",
        version="1",
        description="One health state per node, with reasons and provenance, for schedulers and operators.",
        responses=auth.ERROR_RESPONSES,
    )
    app.add_middleware(auth.BodyLimit)
    require = auth.TokenGuard(service.tokens, service.policy.open_reads).require
    add_discovery_routes(app, service, require("read"), service.discovery_ports)
    add_job_routes(app, service, require("read"))
    add_validation_routes(app, service, require("read"))
    add_event_routes(app, service, require("events"))
    add_replica_routes(app, service, require("events"))
    add_service_routes(app, service, require)
    add_node_reads(app, service, require)
    add_operator_writes(app, service, require)
    add_fleet_reads(app, service, require)
    return app


def add_service_routes(app: FastAPI, service: Service, require: Require) -> None:
    """The service's own: a pointer to the docs, readiness, and its metrics."""
    registry = CollectorRegistry()
    registry.register(HealthCollector(service))

    @app.get("/", include_in_schema=False)
    async def root() -> dict[str, Any]:
        return {"service": "fleetsight-health", "docs": "/docs", "api": "/v1/nodes"}

    @app.get("/-/ready", include_in_schema=False)
    async def ready() -> Response:
        ok = service.refreshes > 0
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    # /metrics is a read (it names every node and its state): open with open_reads, else a read token
    # (Prometheus: authorization.credentials_file).
    @app.get("/metrics", include_in_schema=False, dependencies=[Depends(require("read"))])
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4; charset=utf-8")


def add_node_reads(app: FastAPI, service: Service, require: Require) -> None:
    """Nodes' states from the rendered snapshot: the list, one node, the prolog's check, the drain list."""
    Reader = Annotated[str, Depends(require("read"))]
    policy = service.policy

    @app.get(
        "/v1/nodes",
        summary="Every node's state (filter with ?state=)",
        response_class=JSONBytes,
        responses=auth.JSON_OBJECT_RESPONSE,
    )
    async def list_nodes(_: Reader, state: Annotated[list[State] | None, Query()] = None) -> Response:
        return JSONBytes(service.rendered.node_list(list(state or [])))

    @app.get(
        "/v1/nodes/{node}",
        summary="One node: state, reasons with evidence, history",
        response_class=JSONBytes,
        responses=auth.JSON_OBJECT_RESPONSE,
    )
    async def get_node(node: str, _: Reader) -> Response:
        body = service.rendered.node_json.get(node)
        if body is None:
            raise HTTPException(404, f"unknown node {node!r}")
        return JSONBytes(body)

    @app.post("/v1/preflight", summary="Which of these nodes are fit for a job now (prolog / pre-exec)")
    async def preflight(body: PreflightRequest, _: Reader) -> Response:
        index = service.rendered.fitness
        fit, unfit, unknown = [], [], []
        for node in body.nodes:
            known = index.get(node)
            if known is None:
                unknown.append(node)
                if policy.unknown_nodes_fit:
                    fit.append(node)
                else:
                    unfit.append({"node": node, "state": "unknown", "reasons": []})
            elif known[0]:
                fit.append(node)
            else:
                unfit.append({"node": node, "state": known[1], "reasons": known[2]})
        return JSONResponse({"ok": not unfit, "fit": fit, "unfit": unfit, "unknown": unknown})

    @app.get(
        "/v1/drain-list",
        summary="Nodes FleetSight wants out of scheduling, with the reason",
        response_class=JSONBytes,
        responses=auth.JSON_OBJECT_RESPONSE,
    )
    async def drain_list(_: Reader) -> Response:
        return JSONBytes(service.rendered.drain_json)


def add_operator_writes(app: FastAPI, service: Service, require: Require) -> None:
    """An operator's drain, resume and overrides: decided at once, answered with the node's new state."""
    Drainer = Annotated[str, Depends(require("drain"))]
    Overrider = Annotated[str, Depends(require("override"))]

    def known_node(node: str) -> dict[str, Any]:
        item = service.engine.snapshot()["nodes"].get(node)
        if item is None:
            raise HTTPException(404, f"unknown node {node!r}")
        return item

    def seconds(value: str | None, key: str) -> float | None:
        if value is None:
            return None
        try:
            result = parse_duration(value, key)
        except PolicyError as exc:
            raise HTTPException(422, str(exc)) from exc
        if result <= 0:
            raise HTTPException(422, f"{key}: must be positive")
        return result

    @app.post("/v1/nodes/{node}/drain", summary="Drain a node (scope: drain)")
    def drain(node: str, body: DrainRequest, who: Drainer) -> dict[str, Any]:
        known_node(node)
        ttl = seconds(body.expires_in, "expires_in")
        with service.lock:
            service.engine.set_override(
                node, "repair" if body.repair else "draining", body.reason, f"token …{who}", time.time(), ttl
            )
        service.refresh()
        return known_node(node)

    @app.post(
        "/v1/nodes/{node}/resume", summary="Resume a node FleetSight or an operator drained (scope: drain)"
    )
    def resume(node: str, body: ResumeRequest, who: Drainer) -> dict[str, Any]:
        known_node(node)
        ttl = seconds(body.keep_fit_for, "keep_fit_for")
        with service.lock:
            service.engine.resume(node, body.reason, f"token …{who}", time.time(), ttl)
        service.refresh()
        return known_node(node)

    @app.post("/v1/nodes/{node}/override", summary="Force a state for a while (scope: override)")
    def override(node: str, body: OverrideRequest, who: Overrider) -> dict[str, Any]:
        known_node(node)
        ttl = seconds(body.expires_in, "expires_in")
        with service.lock:
            service.engine.set_override(node, body.state, body.reason, f"token …{who}", time.time(), ttl)
        service.refresh()
        return known_node(node)

    @app.delete("/v1/nodes/{node}/override", summary="Remove an override (scope: override)")
    def remove_override(node: str, who: Overrider) -> dict[str, Any]:
        known_node(node)
        with service.lock:
            if not service.engine.remove_override(node):
                raise HTTPException(404, f"node {node!r} has no override")
        service.refresh()
        return known_node(node)


def add_fleet_reads(app: FastAPI, service: Service, require: Require) -> None:
    """The fleet as a whole: state changes, checkpoint advice, and the service's own status."""
    Reader = Annotated[str, Depends(require("read"))]

    @app.get("/v1/events", summary="State changes, oldest first (?since_id=, ?node=, ?limit=)")
    async def events(
        _: Reader,
        since_id: Annotated[int, Query(ge=0)] = 0,
        node: str | None = None,
        limit: Annotated[int, Query(ge=1, le=10000)] = 500,
    ) -> dict[str, Any]:
        items = [
            e
            for e in list(service.engine.events)
            if e["id"] > since_id and (node is None or e["node"] == node)
        ]
        return {"events": items[:limit], "last_id": service.engine.next_event_id - 1}

    @app.get("/v1/checkpoint-advice", summary="Young's checkpoint interval sqrt(2 D M) for a job of N nodes")
    async def checkpoint_advice(
        _: Reader,
        nodes: Annotated[int, Query(ge=1, le=1_000_000, description="Nodes in the job")],
        checkpoint_seconds: Annotated[
            float, Query(gt=0, le=86400 * 7, description="Time to write one checkpoint")
        ],
    ) -> dict[str, Any]:
        node_mtbf, basis = service.engine.node_mtbf()
        job_mtbf = node_mtbf / nodes
        interval = young_interval(checkpoint_seconds, job_mtbf)
        return {
            "interval_seconds": interval,
            "formula": "sqrt(2 * checkpoint_seconds * mtbf_seconds)",
            "mtbf_seconds": job_mtbf,
            "node_mtbf_seconds": node_mtbf,
            "basis": basis,
            "failures_observed": service.engine.failures,
            "node_hours_observed": round(service.engine.observed_node_seconds / 3600, 1),
            "nodes": nodes,
            "checkpoint_seconds": checkpoint_seconds,
        }

    @app.get("/v1/status", summary="Sources, breaker and refresh health of the service itself")
    async def status(_: Reader) -> dict[str, Any]:
        snapshot = service.engine.snapshot()
        counts = {s: 0 for s in STATES}
        for item in snapshot["nodes"].values():
            counts[item["state"]] += 1
        return {
            "cluster": service.cluster,
            "updated": snapshot["updated"],
            "refreshes": service.refreshes,
            "states": counts,
            "breaker": snapshot.get("breaker"),
            "sources": {
                n: {"ok": ok, "error": service.source_detail.get(n, "")}
                for n, ok in snapshot.get("sources", {}).items()
            },
            # Needed DCGM fields that dcgm-exporter does not publish, and what they blind (null until
            # Prometheus has answered; [] when nothing is missing).
            "dcgm_fields": {"missing": service.dcgm_fields},
            # who answers: leader | follower (two replicas) or standalone; the identity its events carry
            "role": replica_role(service),
            "identity": replica_identity(service),
            "leader": leader_status(service),
        }


def young_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's optimal checkpoint interval, sqrt(2 D M)."""
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)
