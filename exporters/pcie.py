"""PCIe link speed and width from sysfs, for GPUs, NICs, NVMe drives, NVSwitches and the switches
above them.

The kernel writes ``current_link_speed`` as ``"32.0 GT/s PCIe"`` (5.x+), ``"8 GT/s"`` (older kernels),
``"Unknown"`` or ``"Unknown speed"`` (link down); ``current_link_width`` as a lane count. A link below
its maximum is the "PCIe link downgrade" of IBM's failure table. Note that idle NVIDIA GPUs lower
their link *speed* to save power, so the width is the sturdier downgrade signal (both are exported).
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

from prometheus_client.core import Metric

from .core import Problems, Source, list_dir, read_text, register_collector
from .exposition import Families
from .gpus import NVIDIA_VENDOR, GpuMap, normalize_bdf

_SPEED = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*GT/s")
_WIDTH = re.compile(r"^\s*[xX]?([0-9]+)\s*$")

LABELS = ["pci_bdf", "kind", "vendor", "device", "class", "gpu"]
VALID_WIDTHS = {1, 2, 4, 8, 12, 16, 32}


def parse_speed(text: str | None) -> float | None:
    """Transfers per second from a link speed string; None for "Unknown" or garbage."""
    if text is None:
        return None
    match = _SPEED.match(text)
    if not match:
        return None
    value = float(match.group(1))
    return value * 1e9 if value > 0 else None


def parse_width(text: str | None) -> int | None:
    if text is None:
        return None
    match = _WIDTH.match(text)
    if not match:
        return None
    width = int(match.group(1))
    # 63 is what an all-ones config space (a device gone from the bus) reads as; 0 a link in training.
    return width if width in VALID_WIDTHS else None


def device_kind(vendor: str, pci_class: str) -> str | None:
    """What FleetSight watches, by PCI class code; None for everything else."""
    base = pci_class[:6]  # 0xCCSS: class and subclass
    if base in ("0x0300", "0x0302"):
        return "gpu" if vendor == NVIDIA_VENDOR else None
    if base in ("0x0207", "0x0200"):
        return "nic"
    if pci_class.startswith("0x010802"):
        return "nvme"
    if base == "0x0680" and vendor == NVIDIA_VENDOR:
        return "nvswitch"
    if base == "0x0604":
        return "switch"
    return None


class PcieSource(Source):
    name = "pcie"

    def __init__(self, sysfs_root: str, gpu_map: GpuMap, rescan_s: float = 60.0) -> None:
        self.devices_dir = os.path.join(sysfs_root, "bus", "pci", "devices")
        self.gpu_map = gpu_map
        self.rescan_s = rescan_s
        self._inventory: list[tuple[str, list[str]]] = []  # (device dir, label values)
        self._scanned_at = -1e18

    def _scan(self) -> list[tuple[str, list[str]]]:
        """The devices to watch with their identity labels; rescanned once a minute, not per scrape."""
        chosen: dict[str, tuple[str, str, str, str]] = {}
        bridges: dict[str, tuple[str, str, str]] = {}
        real_paths: dict[str, str] = {}
        for name in list_dir(self.devices_dir):
            path = os.path.join(self.devices_dir, name)
            vendor = (read_text(os.path.join(path, "vendor")) or "").strip().lower()
            device = (read_text(os.path.join(path, "device")) or "").strip().lower()
            pci_class = (read_text(os.path.join(path, "class")) or "").strip().lower()
            kind = device_kind(vendor, pci_class)
            if kind is not None and not os.path.exists(os.path.join(path, "max_link_speed")):
                continue  # conventional PCI or an integrated device: it has no PCIe link to watch
            if kind == "switch":
                bridges[name] = (vendor, device, pci_class)
            elif kind is not None:
                chosen[name] = (kind, vendor, device, pci_class)
                real_paths[name] = os.path.realpath(path)
        # Real sysfs: devices/<bdf> are links into the topology, so the bridges above a device are the
        # folders on its real path. A flat tree (fixtures, the twin) has no topology: keep all bridges.
        above: set[str] = set()
        for real in real_paths.values():
            above.update(part for part in real.split(os.sep) if part in bridges)
        flat = not any(os.path.islink(os.path.join(self.devices_dir, n)) for n in chosen)
        for name, (vendor, device, pci_class) in bridges.items():
            if flat or name in above:
                chosen[name] = ("switch", vendor, device, pci_class)
        inventory = []
        for name, (kind, vendor, device, pci_class) in sorted(chosen.items()):
            bdf = normalize_bdf(name) or name
            gpu = self.gpu_map.lookup(bdf) if kind == "gpu" else None
            labels = [bdf, kind, vendor, device, pci_class, str(gpu.index) if gpu else ""]
            inventory.append((os.path.join(self.devices_dir, name), labels))
        return inventory

    def gather(self, problems: Problems) -> list[Metric]:
        now = time.monotonic()
        if now - self._scanned_at > self.rescan_s or not self._inventory:
            if not os.path.isdir(self.devices_dir):
                problems.add("sysfs", f"{self.devices_dir} is missing")
                return []
            self._inventory = self._scan()
            self._scanned_at = now
        f = Families()
        speed = f.gauge("fleetsight_pcie_link_speed_transfers_per_second", "Current PCIe link speed.", LABELS)
        max_speed = f.gauge(
            "fleetsight_pcie_link_max_speed_transfers_per_second", "Maximum PCIe link speed.", LABELS
        )
        width = f.gauge("fleetsight_pcie_link_width", "Current PCIe link width (lanes).", LABELS)
        max_width = f.gauge("fleetsight_pcie_link_max_width", "Maximum PCIe link width (lanes).", LABELS)
        downgraded = f.gauge(
            "fleetsight_pcie_link_downgraded",
            "1 when the link runs below its maximum speed or width.",
            LABELS,
        )
        up = f.gauge(
            "fleetsight_pcie_link_up", "0 when the link's current speed and width are unreadable.", LABELS
        )
        speed_down = f.gauge(
            "fleetsight_pcie_link_speed_downgraded", "1 when the link runs below its maximum speed.", LABELS
        )
        width_down = f.gauge(
            "fleetsight_pcie_link_width_downgraded", "1 when the link runs below its maximum width.", LABELS
        )
        for path, labels in self._inventory:
            values = [read_text(os.path.join(path, attr)) for attr in ATTRS]
            if values[0] is None and values[2] is None:
                # The device went away (hot unplug, fallen off the bus): rescan next time.
                problems.add("sysfs", f"{path}: link attributes unreadable")
                self._scanned_at = -1e18
                continue
            cur_s, max_s = parse_speed(values[0]), parse_speed(values[1])
            cur_w, max_w = parse_width(values[2]), parse_width(values[3])
            for family, value in ((speed, cur_s), (max_speed, max_s), (width, cur_w), (max_width, max_w)):
                if value is not None:
                    family.add_metric(labels, value)
            if max_s is None and max_w is None:
                continue  # nothing to compare against: no verdict
            # A link whose current speed and width read "Unknown"/garbage while its maximum is known is
            # down (a device fallen off the bus reads all-ones): the worst downgrade there is.
            link_up = cur_s is not None or cur_w is not None
            up.add_metric(labels, float(link_up))
            speed_low = max_s is not None and (cur_s is None or cur_s < max_s)
            width_low = max_w is not None and (cur_w is None or cur_w < max_w)
            speed_down.add_metric(labels, float(speed_low))
            width_down.add_metric(labels, float(width_low))
            downgraded.add_metric(labels, float(speed_low or width_low))
        return f.all()


ATTRS = ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width")


@register_collector("pcie", position=10)
def pcie_collector(opts: Any, gpu_map: GpuMap) -> Source:
    return PcieSource(opts.sysfs_root, gpu_map)
