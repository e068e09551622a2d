"""The health service as the modules around it see it: typing Protocols for what the routes, the sweep,
the metrics and the replica roles read and write on the service.

A module of its own so that those modules depend on this small description rather than on
health/service.py, which imports them to assemble itself: no import circle, and each of them can be
tested with any object that has these attributes.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Protocol

from .engine import HealthEngine
from .model import Signal
from .policy import Policy
from .rendered import Rendered
from .sources import Sources

Changes = list[dict[str, Any]]  # the state-change events one batch produced


class ServiceReads(Protocol):
    """What a read-only route needs: the policy, the sources, the engine's snapshot and the cluster."""

    policy: Policy
    sources: Sources
    engine: HealthEngine
    cluster: str


class Service(ServiceReads, Protocol):
    """The whole service: its state, its counters and the few actions the other modules call."""

    tokens: Mapping[str, frozenset[str]]
    discovery_ports: dict[str, int]
    lock: threading.Lock  # serialises engine writes (the worker vs operator actions)
    stop_event: threading.Event
    wake: threading.Event  # set to decide queued events (or re-decide dirty nodes) now
    rendered: Rendered
    refreshes: int
    source_errors: dict[str, int]
    source_detail: dict[str, str]
    dcgm_fields: list[dict[str, Any]] | None
    last_refresh_seconds: float
    # events in
    events_received: dict[str, int]
    delay_counts: list[int]
    delay_sum: float
    # the reconcile sweep
    repairs: dict[str, int]
    sweeps: int
    inventory_pending: bool
    sweep_started: float | None
    last_reconcile_seconds: float
    reconcile_cpu_seconds: float
    # two replicas (health/leader.py, health/replica.py)
    elector: Any
    peer_token: str | None
    leading: bool
    replica_etag: str | None

    @property
    def is_writer(self) -> bool: ...

    def receive(self, kind: str, items: list[tuple[Signal, bool]]) -> None: ...

    def event_lag(self, now: float | None = None) -> float: ...

    def refresh(self, now: float | None = None) -> Changes: ...

    def render_copy(self) -> None: ...

    def publish(self, changes: Changes, full: bool = False, touched: bool = True) -> None: ...

    def announce(self, changes: Changes, now: float) -> None: ...
