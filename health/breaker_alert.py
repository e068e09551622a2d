"""The alert the health service raises while its circuit breaker holds automatic drains:
HealthCircuitBreakerOpen, one for the whole held batch, posted to the Alertmanager (API v2) and resolved
when the breaker closes.

A module of its own: it is the service's one outgoing notification, with its own labels and
annotations (alerting's routing depends on them), apart from the breaker's rule (health/breaker.py).
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import httpx

from .breaker import BREAKER_RUNBOOK
from .sources import split_urls

log = logging.getLogger("health.service")


class BreakerAlert:
    """Sends the alert after each batch while the breaker is open, and once more when it has closed."""

    def __init__(self, url: str | None, cluster: str, refresh_interval_s: float) -> None:
        self.url = url  # one Alertmanager, or an HA pair comma-separated; None: no alert
        self.cluster = cluster
        self.refresh_interval_s = refresh_interval_s
        self.open = False  # whether the last alert that reached an Alertmanager said open

    def send(self, breaker: dict[str, Any], now: float) -> None:
        if not self.url:
            return
        if not breaker["open"] and not self.open:
            return
        alert = self.alert(breaker, now)
        sent = 0
        for url in split_urls(self.url):  # like Prometheus: to every Alertmanager of the pair
            try:
                httpx.post(f"{url}/api/v2/alerts", json=[alert], timeout=3).raise_for_status()
                sent += 1
            except httpx.HTTPError as exc:
                log.warning("event=breaker_alert_failed alertmanager=%s error=%s", url, exc)
        if sent:
            self.open = breaker["open"]

    def alert(self, breaker: dict[str, Any], now: float) -> dict[str, Any]:
        """Firing while open (ends a few refreshes ahead, so it lapses if the service stops sending);
        resolved (ends now) once closed."""
        ends = now + 4 * self.refresh_interval_s if breaker["open"] else now
        return {
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


def iso_z(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat().replace("+00:00", "Z")
