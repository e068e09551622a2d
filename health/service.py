"""The health service: a background refresher that fuses the sources into the engine, and a FastAPI
app that answers from the published snapshot in memory (never from a source, so a slow Prometheus
cannot slow the scheduler's prolog).

Writes (drain, resume, overrides) need a bearer token with the right scope; reads are open when the
policy says so (``api.open_reads``). Tokens come from FLEETSIGHT_HEALTH_TOKENS or the file named by
FLEETSIGHT_HEALTH_TOKENS_FILE, never from the policy file, and are never logged.
"""

import datetime as dt
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import httpx
from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from pydantic import BaseModel, Field

from fleetsight import auth

from .discovery import DEFAULT_PORTS
from .discovery import add_routes as add_discovery_routes
from .engine import BREAKER_RUNBOOK, STATES, HealthEngine, Observation, young_interval
from .policy import Policy, PolicyError, parse_duration
from .sources import Sources, split_urls

log = logging.getLogger("health.service")
State = Literal[STATES]  # type: ignore[valid-type]  # the API's schema lists the states
SCOPES = ("read", "drain", "override")


# ---------------------------------------------------------------------------------- tokens
def load_tokens(environ: Mapping[str, str] = os.environ) -> dict[str, frozenset[str]]:
    """FLEETSIGHT_HEALTH_TOKENS and FLEETSIGHT_HEALTH_TOKENS_FILE (fleetsight.auth's scheme)."""
    try:
        return auth.load_tokens("FLEETSIGHT_HEALTH", SCOPES, environ)
    except auth.TokenError as exc:
        raise PolicyError(str(exc)) from None


# ---------------------------------------------------------------------------------- rendered answers
class JSONBytes(Response):
    media_type = "application/json"


class Rendered:
    """The read answers, serialised once per refresh: a request copies bytes, it does not walk the fleet."""

    def __init__(self, snapshot: dict[str, Any], drain_list: list[dict[str, Any]]) -> None:
        self.updated = snapshot["updated"]
        self.node_json = {n: json.dumps(item).encode() for n, item in snapshot["nodes"].items()}
        self.items = [
            {k: v for k, v in item.items() if k != "history"} for item in snapshot["nodes"].values()
        ]
        self.fitness = {
            n: (item["fit"], item["state"], dedupe(r["summary"] or r["signal"] for r in item["reasons"]))
            for n, item in snapshot["nodes"].items()
        }
        self.drain_json = json.dumps(
            {"count": len(drain_list), "nodes": drain_list, "breaker": snapshot.get("breaker")}
        ).encode()
        self.lists: dict[tuple[str, ...], bytes] = {}

    def node_list(self, states: list[str]) -> bytes:
        key = tuple(sorted(set(states)))
        cached = self.lists.get(key)
        if cached is None:
            items = [i for i in self.items if not key or i["state"] in key]
            cached = json.dumps({"updated": self.updated, "count": len(items), "nodes": items}).encode()
            self.lists[key] = cached
        return cached


def dedupe(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


# ---------------------------------------------------------------------------------- the service
class HealthService:
    """Owns the engine, the sources and the refresh thread."""

    def __init__(
        self,
        policy: Policy,
        sources: Sources,
        state_dir: Path | None = None,
        tokens: Mapping[str, frozenset[str]] | None = None,
        cluster: str = "",
        breaker_alert_url: str | None = None,
        discovery_ports: dict[str, int] | None = None,
    ) -> None:
        self.policy = policy
        self.discovery_ports = discovery_ports or DEFAULT_PORTS  # per-node scrape jobs (http_sd)
        self.sources = sources
        self.engine = HealthEngine(policy, state_dir, now=time.time())
        self.tokens = tokens or {}
        self.cluster = cluster
        self.breaker_alert_url = breaker_alert_url
        self.lock = threading.Lock()  # serialises engine writes (refresh vs operator actions)
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.refreshes = 0
        self.source_errors: dict[str, int] = {}
        self.source_detail: dict[str, str] = {}
        self.last_refresh_seconds = 0.0
        self.rendered = Rendered(self.engine.snapshot(), [])

    def refresh(self, now: float | None = None) -> list[dict[str, Any]]:
        now = time.time() if now is None else now
        started = time.monotonic()
        results = self.sources.collect(now)
        nodes: dict[str, str] = {}
        for result in results:
            for node, unit in result.nodes.items():
                if unit or node not in nodes:
                    nodes[node] = unit
            if not result.ok:
                self.source_errors[result.name] = self.source_errors.get(result.name, 0) + 1
            self.source_detail[result.name] = result.error
        fill_units(nodes, self.policy.breaker.nodes_per_unit)
        observation = Observation(
            nodes=nodes,
            signals=[s for r in results for s in r.signals],
            scheduler={n: v for r in results for n, v in r.scheduler.items()},
            sources_ok={r.name: r.ok for r in results},
        )
        with self.lock:
            changes = self.engine.update(observation, now)
            self.engine.save()
            self.rendered = Rendered(self.engine.snapshot(), self.engine.drain_list())
        for event in changes:
            log.info(
                "event=state_change node=%s from=%s to=%s reasons=%s",
                event["node"],
                event["from"],
                event["to"],
                ",".join(event["reasons"]),
            )
        self._send_breaker_alert(now)
        self.refreshes += 1
        self.last_refresh_seconds = time.monotonic() - started
        return changes

    def _send_breaker_alert(self, now: float) -> None:
        """One alert for the whole held batch (Alertmanager API v2), resolved when the breaker closes."""
        if not self.breaker_alert_url:
            return
        breaker = self.engine.breaker
        was_open = getattr(self, "_breaker_alert_open", False)
        if not breaker["open"] and not was_open:
            return
        ends = now + 4 * self.policy.refresh_interval_s if breaker["open"] else now
        alert = {
            "labels": {
                "alertname": "HealthCircuitBreakerOpen",
                "severity": "critical",
                "team": "sre",
                "cluster": self.cluster or "default",
            },
            "annotations": {
                "summary": f"Health circuit breaker holds {len(breaker['held'])} node(s) from auto-drain",
                "description": f"{breaker['scope']}; held: {', '.join(breaker['held'])}. Look for a common "
                "cause (leaf switch, PDU, file system) before draining by hand.",
                "runbook_url": BREAKER_RUNBOOK,
            },
            "startsAt": iso_z(breaker["since"] or now),
            "endsAt": iso_z(ends),
        }
        sent = 0
        for url in split_urls(self.breaker_alert_url):  # like Prometheus: to every Alertmanager of the pair
            try:
                httpx.post(f"{url}/api/v2/alerts", json=[alert], timeout=3).raise_for_status()
                sent += 1
            except httpx.HTTPError as exc:
                log.warning("event=breaker_alert_failed alertmanager=%s error=%s", url, exc)
        if sent:
            self._breaker_alert_open = breaker["open"]

    def run_forever(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.refresh()
            except Exception:  # the service keeps serving its last state and says so in /v1/status
                log.exception("event=refresh_failed")
                self.source_errors["refresh"] = self.source_errors.get("refresh", 0) + 1
            self.stop_event.wait(self.policy.refresh_interval_s)

    def start(self) -> None:
        self.thread = threading.Thread(target=self.run_forever, name="health-refresh", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread:
            self.thread.join(timeout=10)
        self.sources.close()


def iso_z(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat().replace("+00:00", "Z")


def fill_units(nodes: dict[str, str], per_unit: int) -> None:
    """Nodes with no unit label: units of ``per_unit`` nodes in name order."""
    for index, node in enumerate(sorted(nodes)):
        if not nodes[node]:
            nodes[node] = f"unit{index // per_unit + 1:02d}"


# ---------------------------------------------------------------------------------- metrics
class HealthCollector(Collector):
    def __init__(self, service: HealthService) -> None:
        self.service = service

    def collect(self) -> Iterator[Any]:
        snapshot = self.service.engine.snapshot()
        state = GaugeMetricFamily(
            "fleetsight_node_health_state",
            "1 for the node's current health state (one series per state)",
            labels=["cluster", "node", "state"],
        )
        for node, item in snapshot["nodes"].items():
            for name in STATES:
                state.add_metric([self.service.cluster, node, name], 1.0 if item["state"] == name else 0.0)
        yield state
        breaker = GaugeMetricFamily(
            "fleetsight_health_circuit_breaker_open", "1 while automatic drains are held"
        )
        breaker.add_metric([], 1.0 if snapshot.get("breaker", {}).get("open") else 0.0)
        yield breaker
        source_up = GaugeMetricFamily(
            "fleetsight_health_source_up", "1 if the last read of a source worked", labels=["source"]
        )
        for name, ok in snapshot.get("sources", {}).items():
            source_up.add_metric([name], 1.0 if ok else 0.0)
        yield source_up
        errors = CounterMetricFamily(
            "fleetsight_health_source_errors", "Failed reads per source", labels=["source"]
        )
        for name, count in self.service.source_errors.items():
            errors.add_metric([name], count)
        yield errors
        yield GaugeMetricFamily(
            "fleetsight_health_refresh_duration_seconds",
            "Duration of the last refresh",
            value=self.service.last_refresh_seconds,
        )


# ---------------------------------------------------------------------------------- API models
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
    state: State = Field(description=f"One of {', '.join(STATES)}")
    reason: str = Field(min_length=3, max_length=500)
    expires_in: str = Field(description="Every override expires (e.g. 30m, 8h)")


def create_app(service: HealthService) -> FastAPI:
    app = FastAPI(
        title="FleetSight health service",
        version="1",
        description="One health state per node, with reasons and provenance, for schedulers and operators.",
        responses=auth.ERROR_RESPONSES,
    )
    app.add_middleware(auth.BodyLimit)
    registry = CollectorRegistry()
    registry.register(HealthCollector(service))
    policy = service.policy

    require = auth.TokenGuard(service.tokens, policy.open_reads).require

    Reader = Annotated[str, Depends(require("read"))]
    Drainer = Annotated[str, Depends(require("drain"))]
    Overrider = Annotated[str, Depends(require("override"))]
    add_discovery_routes(app, service, require("read"), service.discovery_ports)

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
            if service.engine.overrides.pop(node, None) is None:
                raise HTTPException(404, f"node {node!r} has no override")
        service.refresh()
        return known_node(node)

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
            "updated": snapshot["updated"],
            "refreshes": service.refreshes,
            "states": counts,
            "breaker": snapshot.get("breaker"),
            "sources": {
                n: {"ok": ok, "error": service.source_detail.get(n, "")}
                for n, ok in snapshot.get("sources", {}).items()
            },
        }

    return app


def serve_app(app: FastAPI, host: str, port: int, tls: dict[str, Any] | None = None) -> None:
    """``tls``: fleetsight.webconfig.uvicorn_tls's arguments (--web.config.file), or plain HTTP."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False, **(tls or {}))


def nodes_from_file(path: Path | None) -> Iterable[str]:
    if path is None:
        return []
    return [
        line.split("#")[0].strip() for line in path.read_text().splitlines() if line.split("#")[0].strip()
    ]
