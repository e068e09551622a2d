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

from prometheus_client.core import Metric

from exporters.core import Families, Problems, Source, list_dir, read_text
from exporters.gpus import normalize_bdf

PORT_LABELS = ["device", "port"]

# PMA counters with names of their own (rules and dashboards use these); (metric, multiplier).
NAMED_COUNTERS: dict[str, tuple[str, int, str]] = {
    "port_xmit_data": ("transmit_bytes", 4, "Bytes transmitted (the PMA counts 4-byte words)."),
    "port_rcv_data": ("receive_bytes", 4, "Bytes received (the PMA counts 4-byte words)."),
    "port_xmit_packets": ("transmit_packets", 1, "Packets transmitted."),
    "port_rcv_packets": ("receive_packets", 1, "Packets received."),
    "symbol_error": ("symbol_errors", 1, "Minor link errors detected on a physical lane."),
    "link_downed": ("link_downed", 1, "Times the link training failed and the link went down."),
    "link_error_recovery": ("link_error_recovery", 1, "Successful link error recoveries."),
    "port_rcv_errors": ("receive_errors", 1, "Packets received with an error."),
    "port_xmit_discards": ("transmit_discards", 1, "Outbound packets discarded (port down, congestion)."),
    "port_xmit_wait": ("transmit_wait", 1, "Ticks the port had data to send but no credits."),
    "local_link_integrity_errors": (
        "local_link_integrity_errors",
        1,
        "Local physical errors over threshold.",
    ),
    "excessive_buffer_overrun_errors": ("excessive_buffer_overrun_errors", 1, "Buffer overrun errors."),
    "port_rcv_remote_physical_errors": ("receive_remote_physical_errors", 1, "Packets with EBP received."),
}
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

    def __init__(self, sysfs_root: str, rescan_s: float = 60.0) -> None:
        self.class_dir = os.path.join(sysfs_root, "class", "infiniband")
        self.rescan_s = rescan_s
        # (device, port, port dir, counter names, hw counter names), rescanned once a minute.
        self._ports: list[tuple[str, str, str, list[str], list[str]]] = []
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
                counters = list_dir(os.path.join(port_dir, "counters"))
                hw = [c for c in list_dir(os.path.join(port_dir, "hw_counters")) if c not in NOT_COUNTERS]
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
            "fleetsight_infiniband_port_rate_bits_per_second", "Port rate (all lanes).", PORT_LABELS
        )
        lanes_g = f.gauge(
            "fleetsight_infiniband_port_width", "Active lanes of the port (1X, 2X, 4X).", PORT_LABELS
        )
        other = f.counter(
            "fleetsight_infiniband_port_counter",
            "PMA port counters without a metric of their own, by sysfs name.",
            [*PORT_LABELS, "counter"],
        )
        hw_family = f.counter(
            "fleetsight_infiniband_port_hw_counter",
            "Driver hw_counters of the port (RDMA retransmits, CNPs, out-of-sequence...), by sysfs name.",
            [*PORT_LABELS, "counter"],
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
                rate_g.add_metric(labels, rate[0])
                if rate[1]:
                    lanes_g.add_metric(labels, rate[1])
            self._counters(f, other, labels, port_dir, counters)
            for name in hw:
                value = parse_counter(read_text(f"{port_dir}/hw_counters/{name}"))
                if value is not None:
                    hw_family.add_metric([*labels, name], value)
        return f.all()

    def _counters(self, f: Families, other, labels: list[str], port_dir: str, counters: list[str]) -> None:
        for name in counters:
            value = parse_counter(read_text(f"{port_dir}/counters/{name}"))
            if value is None:
                continue  # "N/A (no PMA)" and friends
            named = NAMED_COUNTERS.get(name)
            if named is None:
                other.add_metric([*labels, name], value)
                continue
            metric, multiplier, doc = named
            f.counter(f"fleetsight_infiniband_port_{metric}", doc, PORT_LABELS).add_metric(
                labels, value * multiplier
            )
