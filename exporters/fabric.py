"""The fabric exporter: the whole InfiniBand fabric as UFM sees it.

UFM's REST resources give the inventory and state: ``/ufmRest/resources/ports`` (every port, one
request: link state, speed, width, severity, and its peer), ``/ufmRest/resources/systems`` (switch
model and health), ``/ufmRest/app/events``; the port counters come from UFM Telemetry's CSV endpoint
(``/csv/metrics``: ``node_guid,port_guid,port_num,PortXmitDataExtended,...``). Each resource is a
:class:`~exporters.core.Source` (``fabric_systems``, ``fabric_ports``, ``fabric_events``,
``fabric_telemetry`` in the ``fleetsight_collector_*`` self-metrics); a
:class:`~exporters.core.CachedRunner` gathers them every ``interval_s`` (systems less often) and
renders the exposition once; a scrape only sends those bytes, so it costs the same for 200 ports or
20,000.

PortXmitData/PortRcvData are PMA counters in 4-byte words (InfiniBand spec); UFM Telemetry passes them
on raw, so they are multiplied by 4 (``data_unit="words"``; pass ``bytes`` for a UFM that converts).
"""

from __future__ import annotations

import csv
import io
import os
import re
from dataclasses import dataclass

import httpx
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.samples import Sample

from .core import CachedRunner, Problems, Snapshot, Source, tls_verify
from .serving import Page, html_page, metrics_page

LANE_GBPS = {
    "SDR": 2.5,
    "DDR": 5.0,
    "QDR": 10.0,
    "FDR10": 10.0,
    "FDR": 14.0,
    "EDR": 25.0,
    "HDR": 50.0,
    "NDR": 100.0,
    "XDR": 200.0,
}
LOGICAL = {"down": 1, "init": 2, "initialize": 2, "armed": 3, "active": 4}
PHYSICAL = {
    "sleep": 1,
    "polling": 2,
    "disabled": 3,
    "port configuration training": 4,
    "link up": 5,
    "linkup": 5,
    "link error recovery": 6,
    "phy test": 7,
    "down": 3,
}
SEVERITY_RANK = {"info": 0, "warning": 1, "minor": 2, "critical": 3}
# Telemetry counter -> (metric suffix, kind). Column names vary across UFM Telemetry versions
# ("SymbolErrorCounterExtended" / "SymbolErrorCounter", "port_num" / "Port_Number"), so columns are
# matched case-insensitively with any "Extended" suffix dropped.
COUNTERS = {
    "portxmitdata": ("transmit_bytes", "data"),
    "portrcvdata": ("receive_bytes", "data"),
    "portxmitpkts": ("transmit_packets", None),
    "portrcvpkts": ("receive_packets", None),
    "symbolerrorcounter": ("symbol_errors", None),
    "linkdownedcounter": ("link_downed", None),
    "linkerrorrecoverycounter": ("link_error_recovery", None),
    "portrcverrors": ("receive_errors", None),
    "portxmitdiscards": ("transmit_discards", None),
    "portxmitwait": ("transmit_wait", None),
}
KEY_COLUMNS = {
    "node_guid": "node_guid",
    "port_guid": "port_guid",
    "port_num": "port_num",
    "port_number": "port_num",
}


def column_key(name: str) -> str:
    key = name.strip().lower()
    return key[: -len("extended")] if key.endswith("extended") else key


_SPEED_NUMBER = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*G")
_WIDTH = re.compile(r"(\d+)\s*[xX]")


def norm_guid(value: object) -> str:
    text = str(value or "").strip().lower()
    return text[2:] if text.startswith("0x") else text


def lane_rate(speed: str) -> float | None:
    """Gb/s per lane from UFM's ``active_speed`` (``"NDR"``, ``"HDR"``, ``"25.78125 Gbps"``)."""
    text = speed.strip().upper()
    if text in LANE_GBPS:
        return LANE_GBPS[text]
    for name in sorted(LANE_GBPS, key=len, reverse=True):
        if text.startswith(name):
            return LANE_GBPS[name]
    match = _SPEED_NUMBER.search(text)
    return float(match.group(1)) if match else None


def parse_width(width: str) -> int | None:
    match = _WIDTH.search(width or "")
    return int(match.group(1)) if match else None


@dataclass
class PortRow:
    labels: dict[str, str]
    up: float
    logical: int | None
    physical: int | None
    rate_bytes: float | None  # bytes per second
    width: int | None
    healthy: float
    key_port: tuple[str, str]
    key_node: tuple[str, str]


def host_and_device(node_description: str, system_name: str) -> tuple[str, str]:
    """("n0001", "mlx5_0") from a host port's node description ``"n0001 mlx5_0"``."""
    parts = node_description.split()
    if len(parts) >= 2:
        return parts[0], parts[-1]
    return system_name or node_description, ""


def port_rows(ports: list[dict], system_types: dict[str, str]) -> list[PortRow]:
    """One row per port, labelled with both ends of its link."""
    by_name = {str(p.get("name", "")): p for p in ports if isinstance(p, dict)}
    rows = []
    for port in ports:
        if not isinstance(port, dict):
            continue
        rows.append(_row(port, by_name, system_types))
    return rows


def _is_switch(port: dict, system_types: dict[str, str]) -> bool:
    kind = system_types.get(str(port.get("system_name", "")), "")
    if kind:
        return kind == "switch"
    description = str(port.get("description", "")).lower()
    return "switch" in description or not str(port.get("node_description", "")).strip().count(" ")


def _peer_host(port: dict, peer: dict | None, system_types: dict[str, str]) -> tuple[str, str] | None:
    """(node, hca_port) of the host cabled to a switch port, or None when the peer is a switch or unknown.

    UFM names the peer on the port itself (``peer``, ``peer_node_name``, ``peer_port_dname``,
    ``peer_node_description``); the peer's own port object, when listed, is preferred: its
    ``node_description`` ("n0001 mlx5_0") and ``number`` give the HCA device and port as the host's
    sysfs names them, so the switch side and the node agent's host side join on (node, device, port).
    """
    if peer is not None:
        if _is_switch(peer, system_types):
            return None
        description, system = str(peer.get("node_description", "")), str(peer.get("system_name", ""))
        node, device = host_and_device(description, system)
        return node, f"{device}/{peer.get('number', '')}" if device else str(peer.get("number", ""))
    description = str(port.get("peer_node_description", "")).split()
    # A host's node description is "<host> <device>"; a switch's is its name alone.
    if len(description) < 2 or system_types.get(description[0], "host") == "switch":
        return None
    number = str(port.get("peer_port_dname", "")).rsplit("/", 1)[-1]
    return description[0], f"{description[-1]}/{number}" if number else description[-1]


def _row(port: dict, by_name: dict[str, dict], system_types: dict[str, str]) -> PortRow:
    system = str(port.get("system_name", ""))
    number = str(port.get("number", port.get("external_number", "")))
    peer = by_name.get(str(port.get("peer", "")))
    peer_system = str(port.get("peer_node_name", "") or (peer or {}).get("system_name", ""))
    peer_port = str(port.get("peer_port_dname", "") or (peer or {}).get("number", ""))
    pairs: list[tuple[str, str]]
    if _is_switch(port, system_types):
        pairs = [("side", "switch"), ("switch", system), ("switch_port", str(port.get("dname") or number))]
        host = _peer_host(port, peer, system_types)
        if host is not None:
            pairs += [("node", host[0]), ("hca_port", host[1])]
        elif peer_system:
            pairs += [("peer_switch", peer_system), ("peer_switch_port", peer_port)]
    else:
        node, device = host_and_device(str(port.get("node_description", "")), system)
        pairs = [("side", "host"), ("node", node), ("hca_port", f"{device}/{number}" if device else number)]
        if peer_system:
            pairs += [("switch", peer_system), ("switch_port", peer_port)]
    logical = LOGICAL.get(str(port.get("logical_state", "")).strip().lower())
    physical = PHYSICAL.get(str(port.get("physical_state", "")).strip().lower())
    width = parse_width(str(port.get("active_width", "")))
    lane = lane_rate(str(port.get("active_speed", "")))
    rate = lane * 1e9 * width if lane is not None and width else None
    severity = SEVERITY_RANK.get(str(port.get("severity", "info")).strip().lower(), 3)
    name = str(port.get("name", ""))
    guid = norm_guid(port.get("guid") or name.split("_", 1)[0])
    system_guid = norm_guid(port.get("systemID") or port.get("system_guid") or name.split("_", 1)[0])
    return PortRow(
        labels=_labels(pairs),
        up=float(logical == 4 and physical == 5),
        logical=logical,
        physical=physical,
        rate_bytes=rate / 8 if rate is not None else None,
        width=width,
        healthy=float(severity == 0),
        key_port=(guid, number),
        key_node=(system_guid, number),
    )


def parse_telemetry_csv(text: str) -> dict[tuple[str, str], dict[str, float]]:
    """``{(guid, port_num): {column: value}}``, keyed by both the port GUID and the node GUID."""
    try:
        return _telemetry_rows(csv.DictReader(io.StringIO(text, newline="")))
    except csv.Error as exc:
        raise ValueError(f"telemetry CSV: {exc}") from exc


def _telemetry_rows(reader: csv.DictReader) -> dict[tuple[str, str], dict[str, float]]:
    table: dict[tuple[str, str], dict[str, float]] = {}
    columns = {name: column_key(name) for name in reader.fieldnames or [] if isinstance(name, str)}
    keys = {KEY_COLUMNS[k]: name for name, k in columns.items() if k in KEY_COLUMNS}
    if "port_num" not in keys or not ({"port_guid", "node_guid"} & set(keys)):
        raise ValueError("telemetry CSV: no port_num and node_guid/port_guid columns in its header")
    counters = {name: k for name, k in columns.items() if k in COUNTERS}
    for row in reader:
        port_num = str(row.get(keys.get("port_num", ""), "") or "").strip()
        values: dict[str, float] = {}
        for name, counter in counters.items():
            raw = row.get(name)
            if not isinstance(raw, str) or raw in ("", "N/A"):
                continue
            try:
                values[counter] = float(raw)
            except ValueError:
                continue
        for guid_column in ("port_guid", "node_guid"):
            guid = norm_guid(row.get(keys.get(guid_column, ""), ""))
            if guid:
                table.setdefault((guid, port_num), values)
    return table


class Ufm:
    """The UFM connection and what one refresh learned, shared by the fabric's sources (each fetches
    one resource; the ports need the systems' types, the counters need the ports)."""

    def __init__(
        self,
        ufm_url: str,
        telemetry_url: str | None = None,
        timeout_s: float = 10.0,
        verify_tls: bool | str = True,
        credentials: tuple[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base = ufm_url.rstrip("/")
        self.telemetry_url = telemetry_url
        self.client = httpx.Client(
            auth=httpx.BasicAuth(*credentials) if credentials else None,
            timeout=httpx.Timeout(timeout_s),
            verify=tls_verify(verify_tls),
            transport=transport,  # None: the network; the twin's backfill answers in-process
        )
        self.system_types: dict[str, str] = {}
        self.rows: list[PortRow] = []

    def get_json(self, path: str) -> object:
        response = self.client.get(self.base + path)
        response.raise_for_status()
        return response.json()

    def get_list(self, path: str, what: str) -> list[dict]:
        body = self.get_json(path)
        if not isinstance(body, list):
            raise ValueError(f"{what}: expected a JSON list")
        return [item for item in body if isinstance(item, dict)]

    def close(self) -> None:
        self.client.close()


FETCH_ERRORS = (httpx.HTTPError, ValueError, TypeError, KeyError)


def _ufm_problem(problems: Problems, what: str, exc: Exception) -> None:
    problems.add("ufm", f"{what}: {exc or repr(exc)}")


def _gauge(name: str, doc: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc)


def _counter(name: str, doc: str) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc)


def _add(family: Metric, labels: dict[str, str], value: float) -> None:
    """A sample whose label set is its own: a port's labels depend on what is at the other end."""
    family.samples.append(
        Sample(family.name + "_total" if family.type == "counter" else family.name, labels, value)
    )


class FabricSystems(Source):
    """Switches (``/ufmRest/resources/systems``), fetched every ``every`` refreshes: they rarely change."""

    name = "fabric_systems"
    error_sources = ("ufm",)

    def __init__(self, ufm: Ufm, every: int = 5) -> None:
        self.ufm, self.every = ufm, every
        self.systems: list[dict] = []
        self.rounds = 0

    def gather(self, problems: Problems) -> list[Metric]:
        if self.rounds % self.every == 0 or not self.systems:
            try:
                self.systems = self.ufm.get_list("/ufmRest/resources/systems", "systems")
                self.ufm.system_types = {
                    str(s.get("system_name", "")): str(s.get("type", "")).lower() for s in self.systems
                }
            except FETCH_ERRORS as exc:
                _ufm_problem(problems, "systems", exc)
        self.rounds += 1
        healthy = _gauge("fleetsight_fabric_switch_healthy", "1 when UFM rates the switch's severity Info.")
        info = _gauge("fleetsight_fabric_switch_info", "Switch model, severity and state (value 1).")
        for system in self.systems:
            if str(system.get("type", "")).lower() != "switch":
                continue
            name = str(system.get("system_name", ""))
            severity = str(system.get("severity", ""))
            _add(
                healthy,
                _labels([("switch", name)]),
                float(SEVERITY_RANK.get(severity.strip().lower(), 3) == 0),
            )
            pairs = [
                ("switch", name),
                ("model", str(system.get("model", ""))),
                ("severity", severity),
                ("state", str(system.get("state", ""))),
            ]
            _add(info, _labels(pairs), 1.0)
        return [healthy, info]

    def close(self) -> None:
        self.ufm.close()


PORT_GAUGES = [
    (
        "fleetsight_fabric_port_up",
        "1 when the port's physical link is up and its logical state Active.",
        "up",
    ),
    ("fleetsight_fabric_port_logical_state", "Logical state (1 Down, 2 Init, 3 Armed, 4 Active).", "logical"),
    (
        "fleetsight_fabric_port_physical_state",
        "Physical state (2 Polling, 3 Disabled, 5 LinkUp...).",
        "physical",
    ),
    (
        "fleetsight_fabric_port_rate_bytes_per_second",
        "Active signalling rate: lanes x per-lane speed, in bytes (NDR 4X reads 5e10).",
        "rate_bytes",
    ),
    ("fleetsight_fabric_port_width", "Active lanes.", "width"),
    ("fleetsight_fabric_port_healthy", "1 when UFM rates the port's severity Info.", "healthy"),
]


class FabricPorts(Source):
    """Every port (``/ufmRest/resources/ports``, one request), labelled with both ends of its link."""

    name = "fabric_ports"
    error_sources = ("ufm",)

    def __init__(self, ufm: Ufm) -> None:
        self.ufm = ufm
        # (switch, switch_port) -> (node, hca_port), remembered: while a link is down UFM reports no
        # peer, and that is exactly when an alert must still name the host (and its jobs).
        self.peers: dict[tuple[str, str], tuple[str, str]] = {}

    def gather(self, problems: Problems) -> list[Metric]:
        try:
            ports = self.ufm.get_list("/ufmRest/resources/ports", "ports")
        except FETCH_ERRORS as exc:
            _ufm_problem(problems, "ports", exc)
            ports = []
        self.ufm.rows = port_rows(ports, self.ufm.system_types)
        self._remember_peers(self.ufm.rows)
        families = []
        for name, doc, attribute in PORT_GAUGES:
            family = _gauge(name, doc)
            samples = family.samples
            for row in self.ufm.rows:
                value = getattr(row, attribute)
                if value is not None:
                    samples.append(Sample(name, row.labels, value))
            families.append(family)
        count = _gauge("fleetsight_fabric_ports", "Ports UFM reported in the last refresh.")
        count.add_metric([], len(self.ufm.rows))
        return [*families, count, self._peer_info()]

    def _remember_peers(self, rows: list[PortRow]) -> None:
        """Learn each switch port's host; give a port whose link is down the host it last had, so its
        series keep one label set across a flap instead of splitting in two."""
        for row in rows:
            labels = row.labels
            if labels.get("side") != "switch" or "peer_switch" in labels:
                continue
            key = (labels.get("switch", ""), labels.get("switch_port", ""))
            if "node" in labels:
                self.peers[key] = (labels["node"], labels.get("hca_port", ""))
            elif key in self.peers:
                labels["node"], labels["hca_port"] = self.peers[key]

    def _peer_info(self) -> Metric:
        info = _gauge(
            "fleetsight_fabric_switch_port_peer_info",
            "1 per switch port cabled to a host: the host (node) and its HCA port (device/port) behind it, "
            "as last seen up (kept while the link is down).",
        )
        for (switch, switch_port), (node, hca_port) in sorted(self.peers.items()):
            pairs = [("switch", switch), ("switch_port", switch_port), ("node", node), ("hca_port", hca_port)]
            _add(info, _labels(pairs), 1.0)
        return info


class FabricEvents(Source):
    """UFM events (``/ufmRest/app/events``), each counted once by its id."""

    name = "fabric_events"
    error_sources = ("ufm",)

    def __init__(self, ufm: Ufm) -> None:
        self.ufm = ufm
        self.seen: set[int] = set()
        self.counts: dict[tuple[str, str], int] = {}

    def gather(self, problems: Problems) -> list[Metric]:
        try:
            self._count(self.ufm.get_list("/ufmRest/app/events", "events"))
        except FETCH_ERRORS as exc:
            _ufm_problem(problems, "events", exc)
        events = _counter("fleetsight_fabric_events", "UFM events by severity and category.")
        for (severity, category), count in sorted(self.counts.items()):
            _add(events, _labels([("severity", severity), ("category", category)]), count)
        return [events]

    def _count(self, events: list[dict]) -> None:
        for event in events:
            if not isinstance(event.get("id"), int) or event["id"] in self.seen:
                continue
            self.seen.add(event["id"])
            key = (str(event.get("severity", "")), str(event.get("category", "")))
            self.counts[key] = self.counts.get(key, 0) + 1
        if len(self.seen) > 200_000:  # UFM keeps a window of recent events; so do we
            self.seen = set(sorted(self.seen)[-100_000:])


class FabricTelemetry(Source):
    """Port counters from UFM Telemetry's CSV, matched to the ports by GUID and port number."""

    name = "fabric_telemetry"
    error_sources = ("ufm",)

    def __init__(self, ufm: Ufm, data_unit: str = "words") -> None:
        self.ufm = ufm
        self.multiplier = 4.0 if data_unit == "words" else 1.0

    def gather(self, problems: Problems) -> list[Metric]:
        assert self.ufm.telemetry_url
        try:
            response = self.ufm.client.get(self.ufm.telemetry_url)
            response.raise_for_status()
            telemetry = parse_telemetry_csv(response.text)
        except FETCH_ERRORS as exc:
            _ufm_problem(problems, "telemetry", exc)
            return []
        rows = self.ufm.rows
        matched = [(r, telemetry.get(r.key_port) or telemetry.get(r.key_node)) for r in rows]
        families = []
        for column, (suffix, kind) in COUNTERS.items():
            family = _counter(f"fleetsight_fabric_port_{suffix}", f"UFM Telemetry port counter ({column}).")
            sample_name = f"fleetsight_fabric_port_{suffix}_total"
            factor = self.multiplier if kind == "data" else 1.0
            family.samples.extend(
                Sample(sample_name, r.labels, values[column] * factor)
                for r, values in matched
                if values is not None and column in values
            )
            families.append(family)
        return families


class FabricExporter:
    """The fabric's sources behind a :class:`~exporters.core.CachedRunner`: a background loop refreshes
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


def _labels(pairs: list[tuple[str, str]]) -> dict[str, str]:
    """Labels without the empty ones (Prometheus treats an empty label as absent)."""
    return {k: v for k, v in pairs if v}


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
