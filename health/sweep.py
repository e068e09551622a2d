"""The reconcile sweep, the safety net under the events: read every source in full, make the engine's
firing signals match what answered, and count each difference as a repair (an event that was lost). Also
the scheduler's poll between sweeps (drain progress, DOWN nodes).

A module of its own: the sweep is the service's one full read of the fleet, with its own rules (which
producers must answer before a source's signals are replaced, how nodes without a unit get one), apart
from the event intake and the worker loop that calls it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .service_protocol import Service

log = logging.getLogger("health.service")
# The sweep replaces a signal source's firing signals only when every configured producer of it answered.
PRODUCERS = {
    "alertmanager": ("alertmanager",),
    "prometheus": ("prometheus",),
    "anomaly": ("prometheus", "anomaly"),
}


def reconcile(service: Service, now: float | None = None) -> dict[str, int]:
    """One sweep; returns the repairs it made (none on the first: that one is the start)."""
    now = time.time() if now is None else now
    started = time.monotonic()
    cpu = time.process_time()
    results = service.sources.collect(now)
    nodes = merge_results(service, results)
    ok = {r.name for r in results if r.ok}
    covered = covered_sources(service, ok)
    signals = [s for r in results for s in r.signals]
    repairs = {"added": 0, "removed": 0}
    with service.lock:
        engine = service.engine
        engine.set_inventory(nodes)
        engine.sources_ok = {r.name: r.ok for r in results}
        if "scheduler" in ok:
            engine.set_scheduler({n: v for r in results for n, v in r.scheduler.items()})
            engine.replace_source({"scheduler"}, signals, now)
        added, removed = engine.replace_source(covered, signals, now, quiet_since=service.sweep_started)
        if service.sweeps:  # the first sweep is the start, not a repair
            repairs = {"added": added, "removed": removed}
        changes = engine.process(now)
        service.publish(changes, full=True)
    service.announce(changes, now)
    for kind, count in repairs.items():
        service.repairs[kind] += count
    if any(repairs.values()):
        log.warning("event=reconcile_repaired added=%d removed=%d", repairs["added"], repairs["removed"])
    service.sweeps += 1
    # A Prometheus that answered no node yet (started with the service, nothing scraped): the breaker's
    # units (su, rack) come from those series, so sweep again soon rather than in `reconcile`.
    prometheus = next((r for r in results if r.name == "prometheus"), None)
    service.inventory_pending = prometheus is not None and prometheus.ok and not prometheus.nodes
    service.sweep_started = now  # events after this are newer than the next sweep's read
    service.last_reconcile_seconds = time.monotonic() - started
    service.reconcile_cpu_seconds = time.process_time() - cpu
    return repairs


def covered_sources(service: Service, answered: set[str]) -> set[str]:
    """The signal sources whose every configured producer answered this sweep."""
    urls = {
        "alertmanager": service.sources.alertmanager_url,
        "prometheus": service.sources.prometheus_url,
        "anomaly": service.sources.anomaly_url,
    }
    configured = {n for n, url in urls.items() if url}
    return {
        source
        for source, producers in PRODUCERS.items()
        if (wanted := configured & set(producers)) and wanted <= answered
    }


def poll_scheduler(service: Service, now: float) -> None:
    """The scheduler's drain progress (draining -> drained) and DOWN nodes, each tick: only nodes
    whose view changed are re-decided."""
    if not service.sources.scheduler_url:
        return
    results = [r for r in service.sources.collect_one("scheduler", now) if r.name == "scheduler"]
    for result in results:
        if not result.ok:
            service.source_errors["scheduler"] = service.source_errors.get("scheduler", 0) + 1
            service.source_detail["scheduler"] = result.error
            continue
        with service.lock:
            service.engine.set_scheduler(result.scheduler)
            service.engine.replace_source({"scheduler"}, result.signals, now)


def merge_results(service: Service, results: list[Any]) -> dict[str, str]:
    """The fleet's nodes and units from every source's answer; counts each failed source and keeps
    what each said about itself (and the DCGM fields Prometheus lacks)."""
    nodes: dict[str, str] = {}
    for result in results:
        for node, unit in result.nodes.items():
            if unit or node not in nodes:
                nodes[node] = unit
        if not result.ok:
            service.source_errors[result.name] = service.source_errors.get(result.name, 0) + 1
        service.source_detail[result.name] = result.error
        if result.dcgm_fields is not None:
            service.dcgm_fields = result.dcgm_fields
    fill_units(nodes, service.policy.breaker.nodes_per_unit)
    return nodes


def fill_units(nodes: dict[str, str], per_unit: int) -> None:
    """Nodes with no unit label: units of ``per_unit`` nodes in name order."""
    for index, node in enumerate(sorted(nodes)):
        if not nodes[node]:
            nodes[node] = f"unit{index // per_unit + 1:02d}"
