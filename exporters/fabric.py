"""The fabric exporter: the whole InfiniBand fabric as UFM sees it.

UFM's REST resources give the inventory and state: ``/ufmRest/resources/ports`` (every port, one
request: link state, speed, width, severity, and its peer), ``/ufmRest/resources/systems`` (switch
model and health), ``/ufmRest/app/events``; the port counters come from UFM Telemetry's CSV endpoint
(``/csv/metrics``: ``node_guid,port_guid,port_num,PortXmitDataExtended,...``). A background loop
fetches them every ``interval_s`` (systems less often) and renders the exposition text once; a scrape
only sends those bytes, so it costs the same for 200 ports or 20,000.

PortXmitData/PortRcvData are PMA counters in 4-byte words (InfiniBand spec); UFM Telemetry passes them
on raw, so they are multiplied by 4 (``data_unit="words"``; pass ``bytes`` for a UFM that converts).
"""

from __future__ import annotations

import csv
import gzip
import io
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

from exporters.core import kv, start_http_server, tls_verify

log = logging.getLogger("fleetsight.exporters.fabric")

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


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def label_text(pairs: list[tuple[str, str]]) -> str:
    """``{a="1",b="2"}`` without the empty labels (Prometheus treats empty as absent)."""
    inner = ",".join(f'{k}="{_esc(v)}"' for k, v in pairs if v)
    return "{" + inner + "}"


@dataclass
class PortRow:
    labels: str
    up: float
    logical: int | None
    physical: int | None
    rate: float | None
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


def _row(port: dict, by_name: dict[str, dict], system_types: dict[str, str]) -> PortRow:
    system = str(port.get("system_name", ""))
    number = str(port.get("number", port.get("external_number", "")))
    peer = by_name.get(str(port.get("peer", "")))
    peer_system = str(port.get("peer_node_name", "") or (peer or {}).get("system_name", ""))
    peer_port = str(port.get("peer_port_dname", "") or (peer or {}).get("number", ""))
    pairs: list[tuple[str, str]]
    if _is_switch(port, system_types):
        pairs = [("side", "switch"), ("switch", system), ("switch_port", str(port.get("dname") or number))]
        if peer is not None and not _is_switch(peer, system_types):
            node, device = host_and_device(str(peer.get("node_description", "")), peer_system)
            pairs += [
                ("node", node),
                ("hca_port", f"{device}/{peer.get('number', '')}" if device else peer_port),
            ]
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
        labels=label_text(pairs),
        up=float(logical == 4 and physical == 5),
        logical=logical,
        physical=physical,
        rate=rate,
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


@dataclass
class Snapshot:
    text: bytes = b""
    gzipped: bytes = b""
    ports: int = 0


@dataclass
class PartState:
    success: bool = False
    errors: int = 0
    duration_s: float = 0.0
    last_success: float = 0.0


@dataclass
class FabricExporter:
    ufm_url: str
    telemetry_url: str | None = None
    interval_s: float = 30.0
    systems_every: int = 5
    timeout_s: float = 10.0
    verify_tls: bool | str = True
    credentials: tuple[str, str] | None = None
    data_unit: str = "words"
    cluster_labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.base = self.ufm_url.rstrip("/")
        self.client = httpx.Client(
            auth=httpx.BasicAuth(*self.credentials) if self.credentials else None,
            timeout=httpx.Timeout(self.timeout_s),
            verify=tls_verify(self.verify_tls),
        )
        self.parts = {name: PartState() for name in ("ports", "systems", "events", "telemetry")}
        self.system_types: dict[str, str] = {}
        self.systems: list[dict] = []
        self.events_seen: set[int] = set()
        self.event_counts: dict[tuple[str, str], int] = {}
        self.snapshot = Snapshot()
        self.refreshes = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()

    # -- fetching ---------------------------------------------------------------------------------
    def _get_json(self, path: str) -> object:
        response = self.client.get(self.base + path)
        response.raise_for_status()
        return response.json()

    def _part(self, name: str, fetch):
        state = self.parts[name]
        started = time.perf_counter()
        try:
            result = fetch()
        except (httpx.HTTPError, ValueError, TypeError, KeyError) as exc:
            state.success = False
            state.errors += 1
            state.duration_s = time.perf_counter() - started
            log.warning(kv(event="ufm_fetch_failed", part=name, error=str(exc) or repr(exc)))
            return None
        state.success, state.duration_s, state.last_success = True, time.perf_counter() - started, time.time()
        return result

    def _ports(self) -> list[dict]:
        ports = self._get_json("/ufmRest/resources/ports")
        if not isinstance(ports, list):
            raise ValueError("ports: expected a JSON list")
        return ports

    def _systems(self) -> list[dict]:
        systems = self._get_json("/ufmRest/resources/systems")
        if not isinstance(systems, list):
            raise ValueError("systems: expected a JSON list")
        return [s for s in systems if isinstance(s, dict)]

    def _events(self) -> None:
        events = self._get_json("/ufmRest/app/events")
        if not isinstance(events, list):
            raise ValueError("events: expected a JSON list")
        for event in events:
            if not isinstance(event, dict) or not isinstance(event.get("id"), int):
                continue
            if event["id"] in self.events_seen:
                continue
            self.events_seen.add(event["id"])
            key = (str(event.get("severity", "")), str(event.get("category", "")))
            self.event_counts[key] = self.event_counts.get(key, 0) + 1
        if len(self.events_seen) > 200_000:  # UFM keeps a window of recent events; so do we
            self.events_seen = set(sorted(self.events_seen)[-100_000:])

    def _telemetry(self) -> dict[tuple[str, str], dict[str, float]]:
        assert self.telemetry_url
        response = self.client.get(self.telemetry_url)
        response.raise_for_status()
        return parse_telemetry_csv(response.text)

    def refresh(self) -> None:
        """One round of fetching and rendering; never raises for a bad or absent UFM."""
        if self.refreshes % self.systems_every == 0 or not self.systems:
            systems = self._part("systems", self._systems)
            if systems is not None:
                self.systems = systems
                self.system_types = {
                    str(s.get("system_name", "")): str(s.get("type", "")).lower() for s in systems
                }
        ports = self._part("ports", self._ports)
        self._part("events", self._events)
        telemetry = self._part("telemetry", self._telemetry) if self.telemetry_url else None
        text = self.render(ports, telemetry)
        with self.lock:
            self.snapshot = Snapshot(text, gzip.compress(text, compresslevel=1), len(ports or []))
        self.refreshes += 1

    # -- rendering --------------------------------------------------------------------------------
    def render(self, ports: list[dict] | None, telemetry: dict | None) -> bytes:
        out: list[str] = []
        rows = port_rows(ports, self.system_types) if ports is not None else []
        gauges = [
            (
                "fleetsight_fabric_port_up",
                "1 when the port's physical link is up and its logical state Active.",
                lambda r: r.up,
            ),
            (
                "fleetsight_fabric_port_logical_state",
                "Logical state (1 Down, 2 Init, 3 Armed, 4 Active).",
                lambda r: r.logical,
            ),
            (
                "fleetsight_fabric_port_physical_state",
                "Physical state (2 Polling, 3 Disabled, 5 LinkUp...).",
                lambda r: r.physical,
            ),
            (
                "fleetsight_fabric_port_rate_bits_per_second",
                "Active rate: lanes x per-lane speed.",
                lambda r: r.rate,
            ),
            ("fleetsight_fabric_port_width", "Active lanes.", lambda r: r.width),
            (
                "fleetsight_fabric_port_healthy",
                "1 when UFM rates the port's severity Info.",
                lambda r: r.healthy,
            ),
        ]
        for name, doc, value_of in gauges:
            out.append(f"# HELP {name} {doc}\n# TYPE {name} gauge\n")
            out.extend(f"{name}{r.labels} {v}\n" for r in rows if (v := value_of(r)) is not None)
        if telemetry is not None:
            self._render_counters(out, rows, telemetry)
        self._render_systems(out)
        self._render_self(out, len(rows))
        return "".join(out).encode()

    def _render_counters(self, out: list[str], rows: list[PortRow], telemetry: dict) -> None:
        multiplier = 4.0 if self.data_unit == "words" else 1.0
        matched = [(r, telemetry.get(r.key_port) or telemetry.get(r.key_node)) for r in rows]
        for column, (suffix, kind) in COUNTERS.items():
            name = f"fleetsight_fabric_port_{suffix}_total"
            factor = multiplier if kind == "data" else 1.0
            out.append(f"# HELP {name} UFM Telemetry port counter ({column}).\n# TYPE {name} counter\n")
            out.extend(
                f"{name}{r.labels} {values[column] * factor}\n"
                for r, values in matched
                if values is not None and column in values
            )

    def _render_systems(self, out: list[str]) -> None:
        out.append("# HELP fleetsight_fabric_switch_healthy 1 when UFM rates the switch's severity Info.\n")
        out.append("# TYPE fleetsight_fabric_switch_healthy gauge\n")
        info = []
        for system in self.systems:
            if str(system.get("type", "")).lower() != "switch":
                continue
            name = str(system.get("system_name", ""))
            severity = str(system.get("severity", ""))
            healthy = SEVERITY_RANK.get(severity.strip().lower(), 3) == 0
            out.append(f"fleetsight_fabric_switch_healthy{label_text([('switch', name)])} {float(healthy)}\n")
            pairs = [
                ("switch", name),
                ("model", str(system.get("model", ""))),
                ("severity", severity),
                ("state", str(system.get("state", ""))),
            ]
            info.append(f"fleetsight_fabric_switch_info{label_text(pairs)} 1.0\n")
        out.append("# HELP fleetsight_fabric_switch_info Switch model, severity and state (value 1).\n")
        out.append("# TYPE fleetsight_fabric_switch_info gauge\n")
        out.extend(info)
        out.append("# HELP fleetsight_fabric_events_total UFM events by severity and category.\n")
        out.append("# TYPE fleetsight_fabric_events_total counter\n")
        for (severity, category), count in sorted(self.event_counts.items()):
            labels = label_text([("severity", severity), ("category", category)])
            out.append(f"fleetsight_fabric_events_total{labels} {count}\n")

    def _render_self(self, out: list[str], ports: int) -> None:
        out.append("# HELP fleetsight_fabric_ports Ports UFM reported in the last refresh.\n")
        out.append(f"# TYPE fleetsight_fabric_ports gauge\nfleetsight_fabric_ports {ports}\n")
        families = [
            (
                "fleetsight_collector_success",
                "gauge",
                "1 when the last fetch of this UFM resource succeeded.",
                lambda s: float(s.success),
            ),
            (
                "fleetsight_collector_duration_seconds",
                "gauge",
                "Duration of the last fetch.",
                lambda s: s.duration_s,
            ),
            (
                "fleetsight_collector_last_success_timestamp_seconds",
                "gauge",
                "Unix time of the last good fetch.",
                lambda s: s.last_success,
            ),
        ]
        for name, kind, doc, value_of in families:
            out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
            for part, state in self.parts.items():
                if part == "telemetry" and not self.telemetry_url:
                    continue
                out.append(f'{name}{{collector="fabric_{part}"}} {value_of(state)}\n')
        out.append("# HELP fleetsight_collector_errors_total Failed fetches by UFM resource.\n")
        out.append("# TYPE fleetsight_collector_errors_total counter\n")
        for part, state in self.parts.items():
            labels = f'{{collector="fabric_{part}",source="ufm"}}'
            out.append(f"fleetsight_collector_errors_total{labels} {state.errors}\n")

    # -- running ----------------------------------------------------------------------------------
    def run_forever(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                self.refresh()
            except Exception as exc:  # keep serving the last snapshot whatever went wrong
                log.exception(kv(event="refresh_crashed", error=repr(exc)))
            self.stop.wait(max(0.5, self.interval_s - (time.monotonic() - started)))

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run_forever, name="ufm-refresh", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self.stop.set()
        self.client.close()


def serve_fabric(listen: str, exporter: FabricExporter) -> ThreadingHTTPServer:
    host, _, port = listen.rpartition(":")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                with exporter.lock:
                    snapshot = exporter.snapshot
                wants_gzip = "gzip" in self.headers.get("Accept-Encoding", "")
                body = snapshot.gzipped if wants_gzip else snapshot.text
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                if wants_gzip:
                    self.send_header("Content-Encoding", "gzip")
            elif path == "/":
                body = b"<h1>FleetSight fabric exporter</h1><a href='/metrics'>/metrics</a>\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
            else:
                body = b"not found\n"
                self.send_response(404)
                self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return start_http_server(host, int(port), Handler)


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
