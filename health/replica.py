"""The replica roles of two health replicas (health/leader.py holds the election): :func:`lead` picks this
replica's role each turn of the worker loop; the follower keeps a copy of the leader's state, answers
reads from it and forwards writes and events to the leader; the takeover makes it the writer.

The leader serves ``GET /v1/replica`` (scope ``events``, the replicas' shared service token): its state
file as saved (overrides, drains, breaker grants, node states, held reasons, events) and its rendered
snapshot. The follower asks every second with ``If-None-Match`` (an unchanged leader answers 304, so a
quiet fleet costs nothing), writes the state file into its own state directory and builds a read-only
engine from it. On takeover the new leader starts from that file, as after a restart: no state change is
made up (so no drain is issued twice) and no held reason is lost; its first sweep re-reads the signals.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import httpx
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from .engine import HealthEngine
from .service_protocol import Service
from .state_file import STATE_FILE

log = logging.getLogger("health.replica")
ROLE_HEADER = "X-FleetSight-Role"  # leader | follower: the kubernetes-sync sidecar acts for the leader only
FORWARD_TIMEOUT_S = 10.0


def state_path(service: Service) -> Path | None:
    return service.engine.state_dir / STATE_FILE if service.engine.state_dir else None


def replica_etag(service: Service) -> str:
    path = state_path(service)
    saved = path.stat().st_mtime_ns if path is not None and path.exists() else 0
    return f'"{saved}-{id(service.rendered)}"'


def replica_payload(service: Service) -> dict[str, Any]:
    path = state_path(service)
    with service.lock:  # the state file and the snapshot of one batch
        state = json.loads(path.read_text()) if path is not None and path.exists() else {}
        snapshot = service.engine.snapshot()
    return {"state": state, "snapshot": snapshot}


def fetch(url: str, token: str | None, etag: str | None) -> tuple[str | None, dict[str, Any] | None]:
    """(etag, payload), payload None when unchanged since etag."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if etag:
        headers["If-None-Match"] = etag
    response = httpx.get(f"{url.rstrip('/')}/v1/replica", headers=headers, timeout=5)
    if response.status_code == 304:
        return etag, None
    response.raise_for_status()
    return response.headers.get("etag"), response.json()


def adopt(service: Service, payload: dict[str, Any]) -> None:
    """Make the leader's state this replica's: its state file (what a takeover starts from) and a
    read-only engine with the leader's snapshot (what reads answer)."""
    state_dir = service.engine.state_dir
    if state_dir is not None:
        state_dir.mkdir(parents=True, exist_ok=True)
        tmp = state_dir / "state.json.replica"
        tmp.write_text(json.dumps(payload["state"]))
        os.replace(tmp, state_dir / STATE_FILE)
    engine = HealthEngine(service.policy, state_dir, now=time.time())
    engine._snapshot = payload["snapshot"]  # the leader's rendering: this engine never decides
    replace_engine(service, engine)
    service.render_copy()


def replace_engine(service: Service, engine: HealthEngine) -> None:
    engine.release_gate = service.engine.release_gate  # set once by the validation routes
    engine.replica = service.engine.replica  # set once by the election (health/serve_cli.py)
    with service.lock:
        service.engine = engine


def take_over(service: Service) -> None:
    """Become the writer: the engine from the copied state file, as after a restart (no made-up
    changes, held reasons kept); the caller sweeps at once."""
    replace_engine(service, HealthEngine(service.policy, service.engine.state_dir, now=time.time()))
    service.sweeps = 0  # the takeover's sweep is a start: what it finds was not lost by this replica
    log.info("event=takeover nodes=%d", len(service.engine.nodes))


def follow(service: Service, etag: str | None) -> str | None:
    """One copy from the leader named in the Lease; an error is counted and the copy kept."""
    url = service.elector.leader_url if service.elector else None
    if not url:
        return etag
    try:
        etag, payload = fetch(url, service.peer_token, etag)
    except (httpx.HTTPError, ValueError) as exc:
        service.source_errors["leader"] = service.source_errors.get("leader", 0) + 1
        service.source_detail["leader"] = str(exc)
        return None
    if payload is not None:
        adopt(service, payload)
    service.source_detail["leader"] = ""
    return etag


def lead(service: Service) -> bool:
    """With two replicas: follow (copy the leader's state) until the Lease is ours, then take over
    once. Returns whether this replica writes."""
    if service.elector.is_leader:
        if not service.leading:
            take_over(service)
            service.leading = True
        return True
    service.leading = False
    # wait first: a copy that keeps failing must not spin this loop
    service.stop_event.wait(service.elector.config.retry_s)
    service.replica_etag = follow(service, service.replica_etag)
    return False


def replica_role(service: Service) -> str:
    """leader | follower with an election, else standalone (the only writer)."""
    if service.elector is None:
        return "standalone"
    return "leader" if service.is_writer else "follower"


def replica_identity(service: Service) -> str:
    """The identity this replica's decisions carry (events' ``replica``): "" without an election."""
    return service.elector.config.identity if service.elector is not None else ""


def leader_status(service: Service) -> dict[str, Any] | None:
    """/v1/status's view of the election (None without one): this replica's role, the Lease's holder,
    and the sweeps this replica has done since it last became the writer."""
    elector = service.elector
    if elector is None:
        return None
    return {
        "role": replica_role(service),
        "identity": replica_identity(service),
        "holder": elector.holder,
        "leader_url": elector.leader_url,
        "sweeps": service.sweeps if service.is_writer else 0,
        "copy_error": service.source_detail.get("leader", ""),
    }


def add_replica_routes(app: FastAPI, service: Service, require_events: Any) -> None:
    """``GET /v1/replica`` for the follower, the role header on every answer, and writes forwarded to
    the leader while this replica follows."""

    @app.get("/v1/replica", include_in_schema=False, dependencies=[Depends(require_events)])
    async def replica(request: Request) -> Response:
        etag = replica_etag(service)
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers={"ETag": etag})
        return JSONResponse(replica_payload(service), headers={"ETag": etag})

    @app.middleware("http")
    async def role(request: Request, call_next: Any) -> Response:
        if service.elector is None:
            return await call_next(request)
        if (
            not service.is_writer
            and request.method not in ("GET", "HEAD")
            and request.url.path != "/v1/replica"
        ):
            response = await forward(service, request)
        else:
            response = await call_next(request)
        response.headers[ROLE_HEADER] = replica_role(service)
        return response


async def forward(service: Service, request: Request) -> Response:
    """A write (operator action, Alertmanager's or the anomaly service's events) that reached the
    follower goes to the leader with its own token; no leader known: 503, and the sender retries."""
    url = service.elector.leader_url if service.elector else None
    if not url or service.elector is None or service.elector.holder == service.elector.config.identity:
        return JSONResponse({"detail": "no health leader at the moment; retry"}, status_code=503)
    headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
    target = f"{url.rstrip('/')}{request.url.path}"
    try:
        async with httpx.AsyncClient(timeout=FORWARD_TIMEOUT_S) as client:
            answer = await client.request(
                request.method,
                target,
                params=request.query_params,
                content=await request.body(),
                headers=headers,
            )
    except httpx.HTTPError as exc:
        return JSONResponse({"detail": f"the health leader did not answer: {exc}"}, status_code=503)
    kept = {k: v for k, v in answer.headers.items() if k.lower() == "content-type"}
    return Response(answer.content, status_code=answer.status_code, headers=kept)
