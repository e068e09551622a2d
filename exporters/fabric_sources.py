"""The fabric exporter's sources: one per UFM resource (``fabric_systems``, ``fabric_ports``,
``fabric_events``, ``fabric_telemetry`` in the ``fleetsight_collector_*`` self-metrics), sharing one
UFM connection and what its last refresh learned.

Its own module because it changes with what the exporter fetches and publishes (metric names, peers kept
across a flap, event counting), not with UFM's document formats (exporters/fabric_parse.py) or the
serving of the exposition (exporters/fabric.py).
"""

from __future__ import annotations

import httpx
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.samples import Sample

from .core import Problems, Source, tls_verify
from .fabric_parse import COUNTERS, SEVERITY_RANK, PortRow, nonempty_labels, parse_telemetry_csv, port_rows


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
                nonempty_labels([("switch", name)]),
                float(SEVERITY_RANK.get(severity.strip().lower(), 3) == 0),
            )
            pairs = [
                ("switch", name),
                ("model", str(system.get("model", ""))),
                ("severity", severity),
                ("state", str(system.get("state", ""))),
            ]
            _add(info, nonempty_labels(pairs), 1.0)
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
    (
        "fleetsight_fabric_port_enabled_rate_bytes_per_second",
        "The fastest rate the port may train at: its widest enabled width x its fastest enabled speed.",
        "enabled_rate_bytes",
    ),
    (
        "fleetsight_fabric_port_supported_rate_bytes_per_second",
        "The fastest rate the port supports: its widest supported width x its fastest supported speed.",
        "supported_rate_bytes",
    ),
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
            _add(info, nonempty_labels(pairs), 1.0)
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
            _add(events, nonempty_labels([("severity", severity), ("category", category)]), count)
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
