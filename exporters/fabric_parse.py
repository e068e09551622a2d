"""What UFM's documents say, as plain data: each port of ``/ufmRest/resources/ports`` as a row labelled
with both ends of its link, and UFM Telemetry's counter CSV per (GUID, port number).

Its own module because it changes with UFM's document formats (field names, speeds, CSV columns across
versions), not with how the fabric exporter fetches them (exporters/fabric_sources.py) or serves them
(exporters/fabric.py); its functions take text and lists, so the tests feed them any document.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass

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


def capability_rate(speeds: object, widths: object) -> float | None:
    """Bytes/s of the fastest link a port may train at, from UFM's lists (``enabled_speed``/
    ``enabled_width`` or ``supported_*``: ``["SDR", ..., "NDR"]``, ``["1x", "2x", "4x"]``); None when
    either list is missing or holds nothing known."""
    if not isinstance(speeds, list) or not isinstance(widths, list):
        return None
    lanes = [rate for rate in (lane_rate(str(s)) for s in speeds) if rate is not None]
    counts = [n for n in (parse_width(str(w)) for w in widths) if n is not None]
    if not lanes or not counts:
        return None
    return max(lanes) * 1e9 * max(counts) / 8


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
    enabled_rate_bytes: float | None = None  # the widest enabled width x the fastest enabled speed
    supported_rate_bytes: float | None = None  # the same over what the port supports


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
        labels=nonempty_labels(pairs),
        up=float(logical == 4 and physical == 5),
        logical=logical,
        physical=physical,
        rate_bytes=rate / 8 if rate is not None else None,
        width=width,
        healthy=float(severity == 0),
        enabled_rate_bytes=capability_rate(port.get("enabled_speed"), port.get("enabled_width")),
        supported_rate_bytes=capability_rate(port.get("supported_speed"), port.get("supported_width")),
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


def nonempty_labels(pairs: list[tuple[str, str]]) -> dict[str, str]:
    """Labels without the empty ones (Prometheus treats an empty label as absent)."""
    return {k: v for k, v in pairs if v}
