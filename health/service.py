"""The health service: events in (Alertmanager's webhook, the anomaly service's flags and clears), a
worker thread that decides only the nodes they name, in batches, a slow reconcile sweep that re-reads
every source and repairs what an event missed, and a FastAPI app that answers from the published
snapshot in memory (never from a source, so a slow Prometheus cannot slow the scheduler's prolog).

This module holds :class:`HealthService`, the owner of the engine, the event queue and the worker loop;
the parts it is assembled from live next door: the REST API and its tokens (health/api.py), the event
intake (health/intake.py), the sweep (health/sweep.py), the read answers (health/rendered.py), the
metrics (health/metrics.py), the breaker's alert (health/breaker_alert.py) and the replica roles
(health/replica.py). Those see the service through health/service_protocol.py, not through this module.
"""

import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import replica, sweep
from .breaker_alert import BreakerAlert
from .discovery import DEFAULT_PORTS
from .engine import HealthEngine
from .intake import DELAY_BUCKETS
from .model import Signal
from .policy import Policy
from .rendered import Rendered
from .sources import Sources

log = logging.getLogger("health.service")
# A restart loses at most this much of a held reason's age (it may release that much early).
SAVE_EVERY_S = 30.0


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
        self.breaker_alert = BreakerAlert(breaker_alert_url, cluster, policy.refresh_interval_s)
        self.lock = threading.Lock()  # serialises engine writes (refresh vs operator actions)
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.refreshes = 0
        self.source_errors: dict[str, int] = {}
        self.source_detail: dict[str, str] = {}
        self.last_refresh_seconds = 0.0
        self.dcgm_fields: list[dict[str, Any]] | None = None  # from the Prometheus source
        self.rendered = Rendered(self.engine.snapshot(), [], cluster=cluster)
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
        self.leading = False  # this replica took over and writes (health/replica.py)
        self.replica_etag: str | None = None  # the leader's state last copied

    @property
    def is_writer(self) -> bool:
        return self.elector is None or self.elector.is_leader

    def render_copy(self) -> None:
        """A follower's reads: the leader's snapshot as copied (health/replica.py)."""
        self.rendered = Rendered(self.engine.snapshot(), self.engine.drain_list(), cluster=self.cluster)
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
            self.publish(changes, touched=touched)
        self._observe_delays(batch)
        self.announce(changes, now)
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

    def publish(self, changes: list[dict[str, Any]], full: bool = False, touched: bool = True) -> None:
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
            cluster=self.cluster,
        )

    def announce(self, changes: list[dict[str, Any]], now: float) -> None:
        """After a batch: log its state changes, raise or resolve the breaker's alert, count it."""
        for event in changes:
            log.info(
                "event=state_change node=%s from=%s to=%s reasons=%s replica=%s",
                event["node"],
                event["from"],
                event["to"],
                ",".join(event["reasons"]),
                event.get("replica", ""),
            )
        self.breaker_alert.send(self.engine.breaker, now)
        self.refreshes += 1

    def run_forever(self) -> None:
        """Wake on events (after ``batch`` more to gather a burst) or every ``interval`` for the
        housekeeping; sweep every ``reconcile`` (soon again after a sweep a source failed). An exception
        never stops the loop: the service keeps serving its last state and says so in /v1/status."""
        next_sweep = 0.0
        next_scheduler = 0.0
        while not self.stop_event.is_set():
            try:
                if self.elector is not None and not replica.lead(self):
                    next_sweep = 0.0  # a takeover sweeps at once
                    continue
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + self.policy.reconcile_interval_s
                    sweep.reconcile(self)
                    if not all(self.engine.sources_ok.values()) or self.inventory_pending:
                        next_sweep = time.monotonic() + self.policy.refresh_interval_s  # incomplete
                    if self.event_lag() > 0:
                        # Events that woke the loop just before this sweep was due: their wake is spent,
                        # and while a source fails the loop sweeps every refresh interval and never ticks,
                        # so they would wait until the sources recovered (an alert forwarded to a leader
                        # with no Alertmanager to read, 2026-11-30: never decided).
                        self.process()
                else:
                    next_scheduler = self._tick(next_scheduler)
            except Exception:
                log.exception("event=refresh_failed")
                self.source_errors["refresh"] = self.source_errors.get("refresh", 0) + 1
            timeout = min(self.policy.refresh_interval_s, max(0.0, next_sweep - time.monotonic()))
            if self.wake.wait(timeout):
                self.stop_event.wait(self.policy.batch_s)  # let the rest of a burst arrive
                self.wake.clear()

    def _tick(self, next_scheduler: float) -> float:
        """Between sweeps: the scheduler every tick while a drain awaits its progress (draining ->
        drained), else every ``refresh.scheduler``; then the queued events. Returns the next poll."""
        now = time.time()
        if self.engine.awaiting_scheduler() or time.monotonic() >= next_scheduler:
            sweep.poll_scheduler(self, now)
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
