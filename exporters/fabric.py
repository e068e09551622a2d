"""The fabric exporter: the whole InfiniBand fabric as UFM sees it.

UFM's REST resources give the inventory and state: ``/ufmRest/resources/ports`` (every port, one
request: link state, speed, width, severity, and its peer), ``/ufmRest/resources/systems`` (switch
model and health), ``/ufmRest/app/events``; the port counters come from UFM Telemetry's CSV endpoint
(``/csv/metrics``: ``node_guid,port_guid,port_num,PortXmitDataExtended,...``). Each resource is a
:class:`~exporters.core.Source` (``fabric_systems``, ``fabric_ports``, ``fabric_events``,
``fabric_telemetry`` in the ``fleetsight_collector_*`` self-metrics; exporters/fabric_sources.py, reading
UFM's documents with exporters/fabric_parse.py); a :class:`~exporters.runners.CachedRunner` gathers them
every ``interval_s`` (systems less often) and renders the exposition once; a scrape only sends those
bytes, so it costs the same for 200 ports or 20,000.

PortXmitData/PortRcvData are PMA counters in 4-byte words (InfiniBand spec); UFM Telemetry passes them
on raw, so they are multiplied by 4 (``data_unit="words"``; pass ``bytes`` for a UFM that converts).
"""

from __future__ import annotations

import os

import httpx

from .core import Source
from .fabric_sources import FabricEvents, FabricPorts, FabricSystems, FabricTelemetry, Ufm
from .runners import CachedRunner, Snapshot
from .serving import Page, html_page, metrics_page


class FabricExporter:
    """The fabric's sources behind a :class:`~exporters.runners.CachedRunner`: a background loop refreshes
    every ``interval_s`` (systems every ``systems_every`` refreshes); a scrape sends the snapshot."""

    def __init__(
        self,
        ufm_url: str,
        telemetry_url: str | None = None,
        interval_s: float = 30.0,
        systems_every: int = 5,
        timeout_s: float = 10.0,
        verify_tls: bool | str = True,
        credentials: tuple[str, str] | None = None,
        data_unit: str = "words",
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.ufm = Ufm(ufm_url, telemetry_url, timeout_s, verify_tls, credentials, transport)
        sources: list[Source] = [
            FabricSystems(self.ufm, systems_every),
            FabricPorts(self.ufm),
            FabricEvents(self.ufm),
        ]
        if telemetry_url:
            sources.append(FabricTelemetry(self.ufm, data_unit))
        self.runner = CachedRunner(sources, interval_s)

    @property
    def snapshot(self) -> Snapshot:
        return self.runner.snapshot

    def refresh(self) -> Snapshot:
        return self.runner.refresh()

    def start(self) -> None:
        self.runner.start()

    def page(self, path: str) -> Page | None:
        if path == "/metrics":
            snapshot = self.runner.snapshot
            return metrics_page(snapshot.text, snapshot.gzipped)
        if path == "/":
            return html_page("<h1>FleetSight fabric exporter</h1><a href='/metrics'>/metrics</a>\n")
        return None

    def close(self) -> None:
        self.runner.close()


def ufm_credentials(secret_file: str | None) -> tuple[str, str] | None:
    """``FLEETSIGHT_UFM_USERNAME``/``FLEETSIGHT_UFM_PASSWORD`` or a ``user:password`` secret file."""
    if secret_file:
        with open(secret_file) as f:
            text = f.read().strip()
        if ":" not in text:
            raise ValueError(f"{secret_file}: expected 'user:password'")
        user, password = text.split(":", 1)
        return user, password
    user = os.environ.get("FLEETSIGHT_UFM_USERNAME")
    return (user, os.environ.get("FLEETSIGHT_UFM_PASSWORD", "")) if user else None
