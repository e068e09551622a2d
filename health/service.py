"""The health service: events in (Alertmanager's webhook, the anomaly service's flags and clears), a
worker thread that decides only the nodes they name, in batches, a slow reconcile sweep that re-reads
every source and repairs what an event missed, and a FastAPI app that answers from the published
snapshot in memory (never from a source, so a slow Prometheus cannot slow the scheduler's prolog).

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
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from pydantic import BaseModel, Field

from fleetsight import auth
from fleetsight.secrets import SecretFileError, read_secret_file

from .discovery import DEFAULT_PORTS
from .discovery import add_routes as add_discovery_routes
from .engine import BREAKER_RUNBOOK, OVERRIDE_STATES, STATES, HealthEngine, Signal, young_interval
from .jobs import add_routes as add_job_routes
from .policy import Policy, PolicyError, parse_duration
from .replica import add_replica_routes, leader_status
from .sources import Sources, split_urls
from .validation import add_routes as add_validation_routes

log = logging.getLogger("health.service")
State = Literal[OVERRIDE_STATES]  # type: ignore[valid-type]  # the states an operator may set
SCOPES = ("read", "drain", "override", "events")
# fleetsight_health_event_delay_seconds: receipt of an event -> its decision published
# A restart loses at most this much of a held reason's age (it may release that much early).
SAVE_EVERY_S = 30.0
DELAY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
# The sweep replaces a signal source's firing signals only when every configured producer of it answered.
PRODUCERS = {
    "alertmanager": ("alertmanager",),
    "prometheus": ("prometheus",),
    "anomaly": ("prometheus", "anomaly"),
}


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


# ---------------------------------------------------------------------------------- rendered answers
class JSONBytes(Response):
    media_type = "application/json"


class Rendered:
    """The read answers, serialised once per refresh: a request copies bytes, it does not walk the fleet."""

    def __init__(
        self,
        snapshot: dict[str, Any],
        drain_list: list[dict[str, Any]],
        previous: "Rendered | None" = None,
        changed: Iterable[str] | None = None,
    ) -> None:
        """With ``previous`` and ``changed``: only the changed nodes are serialised again (an event batch
        costs its own nodes, not the fleet)."""
        self.updated = snapshot["updated"]
        nodes = snapshot["nodes"]
        incremental = previous is not None and changed is not None and len(previous.node_json) == len(nodes)
        names = list(changed or ()) if incremental else list(nodes)
        self.node_json = dict(previous.node_json) if incremental and previous else {}
        self.items = dict(previous.items) if incremental and previous else {}
        self.fitness = dict(previous.fitness) if incremental and previous else {}
        for n in names:
            item = nodes[n]
            self.node_json[n] = json.dumps(item).encode()
            self.items[n] = {k: v for k, v in item.items() if k != "history"}
            self.fitness[n] = (
                item["fit"],
                item["state"],
                dedupe(r["summary"] or r["signal"] for r in item["reasons"]),
            )
        self.drain_json = json.dumps(
            {"count": len(drain_list), "nodes": drain_list, "breaker": snapshot.get("breaker")}
        ).encode()
        self.lists: dict[tuple[str, ...], bytes] = {}

    def node_list(self, states: list[str]) -> bytes:
        key = tuple(sorted(set(states)))
        cached = self.lists.get(key)
        if cached is None:
            items = [self.items[n] for n in sorted(self.items) if not key or self.items[n]["state"] in key]
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
        self.dcgm_fields: list[dict[str, Any]] | None = None  # from the Prometheus source
        self.rendered = Rendered(self.engine.snapshot(), [])
        self.queue: list[tuple[float, str, list[tuple[Signal, bool]]]] = []  # (received, kind, items)
        self.queue_lock = threading.Lock()
        self.wake = threading.Event()
        self.events_received: dict[str, int] = {}
        self.delay_counts = [0] * (len(DELAY_BUCKETS) + 1)  # per bucket, the last one +Inf
        self.saved_at = float("-inf")
        self.delay_sum = 0.0
        self.repairs = {"added": 0, "removed": 0}
        self.sweeps = 0
        self.inventory_pending = False  # the last sweep's Prometheus knew no node yet
        self.sweep_started: float | None = None
        self.last_reconcile_seconds = 0.0
        self.reconcile_cpu_seconds = 0.0
        self.elector: Any = None  # health/leader.py's LeaderElector (two replicas); None: the only writer
        self.peer_token: str | None = None  # the events token, to copy the leader's state with
        self._leading = False
        self._replica_etag: str | None = None

    @property
    def is_writer(self) -> bool:
        return self.elector is None or self.elector.is_leader

    def render_copy(self) -> None:
        """A follower's reads: the leader's snapshot as copied (health/replica.py)."""
        self.rendered = Rendered(self.engine.snapshot(), self.engine.drain_list())
        self.refreshes += 1

    # ------------------------------------------------------------------------------ events in
    def receive(self, kind: str, items: list[tuple[Signal, bool]]) -> None:
        """Queue what a webhook said ((signal, firing) pairs) and wake the worker; the request returns
        at once, so Alertmanager never waits on the engine."""
        with self.queue_lock:
            self.queue.append((time.time(), kind, items))
        self.events_received[kind] = self.events_received.get(kind, 0) + len(items)
        self.wake.set()

    def event_lag(self, now: float | None = None) -> float:
        """Age of the oldest event not yet decided (0 when none waits)."""
        with self.queue_lock:
            oldest = self.queue[0][0] if self.queue else None
        return 0.0 if oldest is None else max(0.0, (time.time() if now is None else now) - oldest)

    def process(self, now: float | None = None) -> list[dict[str, Any]]:
        """Decide the queued events and whatever else is due, as one batch: one save, one render."""
        now = time.time() if now is None else now
        started = time.monotonic()
        with self.queue_lock:
            batch, self.queue = self.queue, []
        with self.lock:
            for _, _, items in batch:
                for signal, firing in items:
                    if firing:
                        self.engine.set_signal(signal, now)
                    else:
                        self.engine.clear_signal(signal.node, signal.key, now)
            touched = bool(self.engine.dirty)  # events or an operator's action, not just the clock
            changes = self.engine.process(now)
            self._publish(changes, touched=touched)
        self._observe_delays(batch)
        self._after(changes, now)
        self.last_refresh_seconds = time.monotonic() - started
        return changes

    def _observe_delays(self, batch: list[tuple[float, str, list[tuple[Signal, bool]]]]) -> None:
        done = time.time()
        for received, _, items in batch:
            delay = max(0.0, done - received)
            index = next((i for i, bound in enumerate(DELAY_BUCKETS) if delay <= bound), len(DELAY_BUCKETS))
            self.delay_counts[index] += len(items)
            self.delay_sum += delay * len(items)

    def refresh(self, now: float | None = None) -> list[dict[str, Any]]:
        """Decide now what operators changed (the API's writes), with any queued events."""
        return self.process(now)

    def reconcile(self, now: float | None = None) -> dict[str, int]:
        """The safety net: read every source in full, make the engine's firing signals match what
        answered, and count each difference as a repair (an event that was lost)."""
        now = time.time() if now is None else now
        started = time.monotonic()
        cpu = time.process_time()
        results = self.sources.collect(now)
        nodes = self._merge_results(results)
        ok = {r.name for r in results if r.ok}
        configured = {n for n, url in self._urls().items() if url}
        covered = {
            source
            for source, producers in PRODUCERS.items()
            if (wanted := configured & set(producers)) and wanted <= ok
        }
        signals = [s for r in results for s in r.signals]
        repairs = {"added": 0, "removed": 0}
        with self.lock:
            self.engine.set_inventory(nodes)
            self.engine.sources_ok = {r.name: r.ok for r in results}
            if "scheduler" in ok:
                self.engine.set_scheduler({n: v for r in results for n, v in r.scheduler.items()})
                self.engine.replace_source({"scheduler"}, signals, now)
            added, removed = self.engine.replace_source(covered, signals, now, quiet_since=self.sweep_started)
            if self.sweeps:  # the first sweep is the start, not a repair
                repairs = {"added": added, "removed": removed}
            changes = self.engine.process(now)
            self._publish(changes, full=True)
        self._after(changes, now)
        for kind, count in repairs.items():
            self.repairs[kind] += count
        if any(repairs.values()):
            log.warning("event=reconcile_repaired added=%d removed=%d", repairs["added"], repairs["removed"])
        self.sweeps += 1
        # A Prometheus that answered no node yet (started with the service, nothing scraped): the breaker's
        # units (su, rack) come from those series, so sweep again soon rather than in `reconcile`.
        prometheus = next((r for r in results if r.name == "prometheus"), None)
        self.inventory_pending = prometheus is not None and prometheus.ok and not prometheus.nodes
        self.sweep_started = now  # events after this are newer than the next sweep's read
        self.last_reconcile_seconds = time.monotonic() - started
        self.reconcile_cpu_seconds = time.process_time() - cpu
        return repairs

    def poll_scheduler(self, now: float) -> None:
        """The scheduler's drain progress (draining -> drained) and DOWN nodes, each tick: only nodes
        whose view changed are re-decided."""
        if not self.sources.scheduler_url:
            return
        results = [r for r in self.sources.collect_one("scheduler", now) if r.name == "scheduler"]
        for result in results:
            if not result.ok:
                self.source_errors["scheduler"] = self.source_errors.get("scheduler", 0) + 1
                self.source_detail["scheduler"] = result.error
                continue
            with self.lock:
                self.engine.set_scheduler(result.scheduler)
                self.engine.replace_source({"scheduler"}, result.signals, now)

    def _urls(self) -> dict[str, str | None]:
        return {
            "alertmanager": self.sources.alertmanager_url,
            "prometheus": self.sources.prometheus_url,
            "anomaly": self.sources.anomaly_url,
        }

    def _merge_results(self, results: list[Any]) -> dict[str, str]:
        nodes: dict[str, str] = {}
        for result in results:
            for node, unit in result.nodes.items():
                if unit or node not in nodes:
                    nodes[node] = unit
            if not result.ok:
                self.source_errors[result.name] = self.source_errors.get(result.name, 0) + 1
            self.source_detail[result.name] = result.error
            if result.dcgm_fields is not None:
                self.dcgm_fields = result.dcgm_fields
        fill_units(nodes, self.policy.breaker.nodes_per_unit)
        return nodes

    def _publish(self, changes: list[dict[str, Any]], full: bool = False, touched: bool = True) -> None:
        """Re-render after a batch that re-decided anything (a quiet tick does nothing). Save after events,
        state changes and sweeps; a tick that only aged held reasons saves every SAVE_EVERY_S, so that
        the state file is not rewritten every few seconds while some node holds a reason."""
        if not (changes or self.engine.changed or full) and self.refreshes:
            return
        if changes or full or touched or time.monotonic() - self.saved_at >= SAVE_EVERY_S:
            self.engine.save()
            self.saved_at = time.monotonic()
        self.rendered = Rendered(
            self.engine.snapshot(),
            self.engine.drain_list(),
            previous=None if full else self.rendered,
            changed=self.engine.changed,
        )

    def _after(self, changes: list[dict[str, Any]], now: float) -> None:
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
        """Wake on events (after ``batch`` more to gather a burst) or every ``interval`` for the
        housekeeping; sweep every ``reconcile`` (soon again after a sweep a source failed). An exception
        never stops the loop: the service keeps serving its last state and says so in /v1/status."""
        next_sweep = 0.0
        next_scheduler = 0.0
        while not self.stop_event.is_set():
            try:
                if self.elector is not None and not self._lead():
                    next_sweep = 0.0  # a takeover sweeps at once
                    continue
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + self.policy.reconcile_interval_s
                    self.reconcile()
                    if not all(self.engine.sources_ok.values()) or self.inventory_pending:
                        next_sweep = time.monotonic() + self.policy.refresh_interval_s  # incomplete
                else:
                    next_scheduler = self._tick(next_scheduler)
            except Exception:
                log.exception("event=refresh_failed")
                self.source_errors["refresh"] = self.source_errors.get("refresh", 0) + 1
            timeout = min(self.policy.refresh_interval_s, max(0.0, next_sweep - time.monotonic()))
            if self.wake.wait(timeout):
                self.stop_event.wait(self.policy.batch_s)  # let the rest of a burst arrive
                self.wake.clear()

    def _lead(self) -> bool:
        """With two replicas: follow (copy the leader's state) until the Lease is ours, then take over
        once. Returns whether this replica writes."""
        from . import replica

        if self.elector.is_leader:
            if not self._leading:
                replica.take_over(self)
                self._leading = True
            return True
        self._leading = False
        # wait first: a copy that keeps failing must not spin this loop
        self.stop_event.wait(self.elector.config.retry_s)
        self._replica_etag = replica.follow(self, self._replica_etag)
        return False

    def _tick(self, next_scheduler: float) -> float:
        """Between sweeps: the scheduler every tick while a drain awaits its progress (draining ->
        drained), else every ``refresh.scheduler``; then the queued events. Returns the next poll."""
        now = time.time()
        if self.engine.awaiting_scheduler() or time.monotonic() >= next_scheduler:
            self.poll_scheduler(now)
            next_scheduler = time.monotonic() + self.policy.scheduler_interval_s
        self.sources.refresh_dcgm_fields(now)
        self.process(now)
        return next_scheduler

    def start(self) -> None:
        self.thread = threading.Thread(target=self.run_forever, name="health-refresh", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.wake.set()
        if self.thread:
            self.thread.join(timeout=10)
        if self.elector is not None:
            self.elector.stop()  # hands the Lease over at once
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
            "Duration of the last event batch (or housekeeping tick)",
            value=self.service.last_refresh_seconds,
        )
        yield from self._event_metrics()

    def _event_metrics(self) -> Iterator[Any]:
        service = self.service
        yield GaugeMetricFamily(
            "fleetsight_health_event_lag_seconds",
            "Age of the oldest received event not yet decided (0: none waiting)",
            value=service.event_lag(),
        )
        buckets, total = [], 0
        for bound, count in zip((*map(str, DELAY_BUCKETS), "+Inf"), service.delay_counts, strict=True):
            total += count
            buckets.append((bound, total))
        yield HistogramMetricFamily(
            "fleetsight_health_event_delay_seconds",
            "From an event's receipt to its decision published (drain list, API, metrics)",
            buckets=buckets,
            sum_value=service.delay_sum,
        )
        received = CounterMetricFamily(
            "fleetsight_health_events", "Alerts and flags received by webhook", labels=["source"]
        )
        for kind, count in sorted(service.events_received.items()):
            received.add_metric([kind], count)
        yield received
        repairs = CounterMetricFamily(
            "fleetsight_health_reconcile_repairs",
            "Signals the reconcile sweep had to add or remove: non-zero means an event was lost",
            labels=["kind"],
        )
        for kind, count in service.repairs.items():
            repairs.add_metric([kind], count)
        yield repairs
        yield CounterMetricFamily(
            "fleetsight_health_reconcile_sweeps", "Reconcile sweeps since the start", value=service.sweeps
        )
        yield GaugeMetricFamily(
            "fleetsight_health_reconcile_duration_seconds",
            "Duration of the last reconcile sweep",
            value=service.last_reconcile_seconds,
        )
        yield GaugeMetricFamily(
            "fleetsight_health_reconcile_cpu_seconds",
            "CPU time the process used during the last reconcile sweep",
            value=service.reconcile_cpu_seconds,
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
    state: State = Field(description=f"One of {', '.join(OVERRIDE_STATES)}")
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
    add_job_routes(app, service, require("read"))
    add_validation_routes(app, service, require("read"))
    add_event_routes(app, service, require("events"))
    add_replica_routes(app, service, require("events"))

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
            if not service.engine.remove_override(node):
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
            # Needed DCGM fields that dcgm-exporter does not publish, and what they blind (null until
            # Prometheus has answered; [] when nothing is missing).
            "dcgm_fields": {"missing": service.dcgm_fields},
            "leader": leader_status(service),
        }

    return app


# ---------------------------------------------------------------------------------- events in
class WebhookAlert(BaseModel):
    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: str | None = None  # Alertmanager's field names
    endsAt: str | None = None
    fingerprint: str | None = None


class AlertmanagerNotification(BaseModel):
    """Alertmanager's webhook body (version 4); the fields the service reads are checked."""

    version: str
    status: str
    receiver: str = ""
    groupKey: str = ""
    alerts: list[WebhookAlert] = Field(max_length=100000)


class AnomalyEvent(BaseModel):
    event: Literal["flag", "clear"]
    node: str = Field(min_length=1)
    hpc_job: str = ""
    cause: str = ""
    score: float = 1.0
    since: str | None = None


class AnomalyEvents(BaseModel):
    events: list[AnomalyEvent] = Field(min_length=1, max_length=100000)


def add_event_routes(app: FastAPI, service: HealthService, require_events: Any) -> None:
    """Alertmanager's webhook and the anomaly service's flags and clears (scope ``events``): queued and
    answered at once; the worker decides them in batches."""

    @app.post(
        "/v1/events/alertmanager",
        summary="Alertmanager webhook receiver (scope: events)",
        status_code=202,
        dependencies=[Depends(require_events)],
    )
    def alertmanager_events(body: AlertmanagerNotification) -> dict[str, Any]:
        if body.version != "4":
            raise HTTPException(422, f"webhook version {body.version!r}: version 4 is read")
        now = time.time()
        items = []
        for alert in body.alerts:
            signal = service.sources.alert_signal(alert.model_dump(), now)
            if signal is not None:  # an alert with no node label says nothing about a node
                items.append((signal, alert.status == "firing"))
        service.receive("alertmanager", items)
        return {"accepted": len(items), "ignored": len(body.alerts) - len(items)}

    @app.post(
        "/v1/events/anomaly",
        summary="The anomaly service's straggler flags and clears (scope: events)",
        status_code=202,
        dependencies=[Depends(require_events)],
    )
    def anomaly_events(body: AnomalyEvents) -> dict[str, Any]:
        now = time.time()
        items = []
        for event in body.events:
            signal = service.sources.straggler_event(event.model_dump(), now)
            if signal is not None:
                items.append((signal, event.event == "flag"))
        service.receive("anomaly", items)
        return {"accepted": len(items)}


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
