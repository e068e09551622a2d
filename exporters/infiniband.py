"""InfiniBand ports from sysfs: state, physical state, rate, link layer, every counter and hw_counter.

Layout: ``class/infiniband/<dev>/ports/<n>/{state,phys_state,rate,link_layer}`` hold strings like
``4: ACTIVE``, ``5: LinkUp``, ``400 Gb/sec (4X NDR)``, ``InfiniBand``; ``counters/*`` the PMA port
counters, where ``port_xmit_data``/``port_rcv_data`` count 4-byte words; ``hw_counters/*`` the
driver's own counters. A device without a PMA answers ``N/A (no PMA)``: skipped, not an error.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

from prometheus_client.core import Metric

from .core import Problems, Source, list_dir, read_text, register_collector
from .exposition import Families
from .gpus import normalize_bdf

PORT_LABELS = ["device", "port"]
Counter = tuple[str, str, int, str]  # (file path, metric name, multiplier, help)

# Every PMA counter has a metric of its own, as node_exporter does:
# ``fleetsight_infiniband_port_<sysfs name without "port_">_total`` (``symbol_error`` ->
# ``..._symbol_error_total``, ``port_xmit_wait`` -> ``..._xmit_wait_total``); the data counters count
# 4-byte words and are exported in bytes (``..._xmit_data_bytes_total``). Every hw_counter likewise as
# ``fleetsight_infiniband_port_hw_<name>_total``. The descriptions of the counters rules use:
COUNTER_DOCS = {
    "port_xmit_data": "Bytes transmitted (the PMA counts 4-byte words).",
    "port_rcv_data": "Bytes received (the PMA counts 4-byte words).",
    "port_xmit_packets": "Packets transmitted.",
    "port_rcv_packets": "Packets received.",
    "symbol_error": "Minor link errors detected on a physical lane.",
    "link_downed": "Times the link training failed and the link went down.",
    "link_error_recovery": "Successful link error recoveries.",
    "port_rcv_errors": "Packets received with an error.",
    "port_xmit_discards": "Outbound packets discarded (port down, congestion).",
    "port_xmit_wait": "Ticks the port had data to send but no credits (congestion).",
    "local_link_integrity_errors": "Local physical errors over threshold.",
    "excessive_buffer_overrun_errors": "Buffer overrun errors.",
    "port_rcv_remote_physical_errors": "Packets with EBP received.",
}
DATA_COUNTERS = ("port_xmit_data", "port_rcv_data")
_NOT_NAME = re.compile(r"[^a-z0-9_]")


def counter_metric(sysfs_name: str, hw: bool = False) -> tuple[str, int, str]:
    """(metric name without ``_total``, multiplier, help) of a sysfs counter file."""
    base = _NOT_NAME.sub("_", sysfs_name.lower())
    if hw:
        return f"fleetsight_infiniband_port_hw_{base}", 1, f"Driver hw_counter {sysfs_name} of the port."
    base = base.removeprefix("port_")
    doc = COUNTER_DOCS.get(sysfs_name, f"PMA port counter {sysfs_name}.")
    if sysfs_name in DATA_COUNTERS:
        return f"fleetsight_infiniband_port_{base}_bytes", 4, doc
    return f"fleetsight_infiniband_port_{base}", 1, doc


# hw_counters that are settings or gauges, not counters.
NOT_COUNTERS = {"lifespan"}

_STATE = re.compile(r"^\s*(\d+)\s*:\s*(\S.*?)\s*$")
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec(?:\s*\((\d+)X\s*([A-Z]*)\))?")
_INT = re.compile(r"^\s*(\d+)\s*$")


def parse_state(text: str | None) -> tuple[int, str] | None:
    """``(4, "ACTIVE")`` from ``"4: ACTIVE"``."""
    if text is None:
        return None
    match = _STATE.match(text)
    return (int(match.group(1)), match.group(2)) if match else None


def parse_rate(text: str | None) -> tuple[float, int | None, str] | None:
    """``(4e11, 4, "NDR")`` from ``"400 Gb/sec (4X NDR)"``."""
    if text is None:
        return None
    match = _RATE.match(text)
    if not match:
        return None
    lanes = int(match.group(2)) if match.group(2) else None
    return float(match.group(1)) * 1e9, lanes, match.group(3) or ""


def parse_counter(text: str | None) -> int | None:
    """A counter value; None for ``N/A (no PMA)``, empty or garbage."""
    if text is None:
        return None
    match = _INT.match(text)
    return int(match.group(1)) if match else None


class InfinibandSource(Source):
    name = "infiniband"

    def __init__(self, sysfs_root: str, rescan_s: float = 60.0, required: bool = False) -> None:
        self.class_dir = os.path.join(sysfs_root, "class", "infiniband")
        self.rescan_s = rescan_s
        # Enabled by default on every node, so a host without RDMA devices (no IB or RoCE HCA, no
        # driver loaded) must not read as a failing collector (ExporterDown); when asked for by name
        # it must.
        self.required = required
        # (device, port, port dir, counters, hw counters), rescanned once a minute; a counter is
        # (file path, metric name, multiplier, help).
        self._ports: list[tuple[str, str, str, list[Counter], list[Counter]]] = []
        self._pci: dict[str, str] = {}
        self._scanned_at = -1e18

    def _scan(self) -> None:
        ports = []
        pci = {}
        for device in list_dir(self.class_dir):
            pci[device] = self._device_bdf(device)
            ports_dir = os.path.join(self.class_dir, device, "ports")
            for port in list_dir(ports_dir):
                port_dir = os.path.join(ports_dir, port)
                counters = [
                    (f"{port_dir}/counters/{name}", *counter_metric(name))
                    for name in list_dir(os.path.join(port_dir, "counters"))
                ]
                hw = [
                    (f"{port_dir}/hw_counters/{name}", *counter_metric(name, hw=True))
                    for name in list_dir(os.path.join(port_dir, "hw_counters"))
                    if name not in NOT_COUNTERS
                ]
                ports.append((device, port, port_dir, counters, hw))
        self._ports, self._pci = ports, pci

    def _device_bdf(self, device: str) -> str:
        """The HCA's PCI address: ``device`` is a link to the PCI device (or, in flat trees, a file)."""
        link = os.path.join(self.class_dir, device, "device")
        if os.path.islink(link):
            return normalize_bdf(os.path.basename(os.path.realpath(link))) or ""
        return normalize_bdf(read_text(link) or "") or ""

    def gather(self, problems: Problems) -> list[Metric]:
        now = time.monotonic()
        if now - self._scanned_at > self.rescan_s or not self._ports:
            if not os.path.isdir(self.class_dir):
                if self.required:
                    problems.add("sysfs", f"{self.class_dir} is missing")
                return []
            self._scan()
            self._scanned_at = now
        f = Families()
        info = f.gauge(
            "fleetsight_infiniband_port_info",
            "Identity of an IB port (value 1): state and rate as the kernel words them, HCA PCI address.",
            [*PORT_LABELS, "link_layer", "state", "phys_state", "rate", "pci_bdf"],
        )
        up = f.gauge(
            "fleetsight_infiniband_port_up",
            "1 when the port is ACTIVE and its physical link is LinkUp.",
            PORT_LABELS,
        )
        state_g = f.gauge(
            "fleetsight_infiniband_port_state",
            "Logical port state (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE).",
            PORT_LABELS,
        )
        phys_g = f.gauge(
            "fleetsight_infiniband_port_physical_state",
            "Physical port state (2 Polling, 3 Disabled, 5 LinkUp, 6 LinkErrorRecovery...).",
            PORT_LABELS,
        )
        rate_g = f.gauge(
            "fleetsight_infiniband_port_rate_bytes_per_second",
            "Port signalling rate, all lanes (400 Gb/s NDR 4X reads 5e10).",
            PORT_LABELS,
        )
        lanes_g = f.gauge(
            "fleetsight_infiniband_port_width", "Active lanes of the port (1X, 2X, 4X).", PORT_LABELS
        )
        for device, port, port_dir, counters, hw in self._ports:
            labels = [device, port]
            state = parse_state(read_text(port_dir + "/state"))
            phys = parse_state(read_text(port_dir + "/phys_state"))
            rate_text = read_text(port_dir + "/rate")
            rate = parse_rate(rate_text)
            link_layer = (read_text(port_dir + "/link_layer") or "").strip()
            if state is None and phys is None:
                problems.add("sysfs", f"{port_dir}: state unreadable")
                self._scanned_at = -1e18  # the device may have gone: rescan next time
                continue
            info.add_metric(
                [
                    *labels,
                    link_layer,
                    state[1] if state else "",
                    phys[1] if phys else "",
                    (rate_text or "").strip(),
                    self._pci.get(device, ""),
                ],
                1.0,
            )
            up.add_metric(labels, float(bool(state and phys and state[0] == 4 and phys[0] == 5)))
            if state:
                state_g.add_metric(labels, state[0])
            if phys:
                phys_g.add_metric(labels, phys[0])
            if rate:
                rate_g.add_metric(labels, rate[0] / 8)
                if rate[1]:
                    lanes_g.add_metric(labels, rate[1])
            self._counters(f, labels, counters)
            self._counters(f, labels, hw)
        return f.all()

    @staticmethod
    def _counters(f: Families, labels: list[str], counters: list[Counter]) -> None:
        for path, metric, multiplier, doc in counters:
            value = parse_counter(read_text(path))
            if value is not None:  # "N/A (no PMA)" and friends are skipped
                f.counter(metric, doc, PORT_LABELS).add_metric(labels, value * multiplier)


@register_collector("infiniband", position=20)
def infiniband_collector(opts: Any, _gpu_map: Any) -> Source:
    return InfinibandSource(opts.sysfs_root, required=opts.infiniband_required)
