"""The health service's own metrics (``GET /metrics``): every node's state, the breaker, the sources'
health, and how fast events become decisions (lag, delay histogram, reconcile repairs).

A module of its own: the series names are a contract with Prometheus's rules and the dashboards, and the
collector only reads the service (through health/service_protocol.py), at scrape time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from .intake import DELAY_BUCKETS
from .model import STATES
from .service_protocol import Service


class HealthCollector(Collector):
    def __init__(self, service: Service) -> None:
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
