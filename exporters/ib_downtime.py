"""How long each InfiniBand port was down, from the kernel's own "Link down" / "Link up" lines.

A port that drops for milliseconds between two scrapes reads ACTIVE at both: only its counters
(link_downed) and the kernel log know. The mlx5 driver logs each change with the time it happened::

    mlx5_core 0000:3c:00.0: mlx5_port_change_event:307:(pid 0): Link down
    mlx5_core 0000:3c:00.0: mlx5_port_change_event:307:(pid 0): Link up

so pairing a port's down with its next up gives the length of every cut, however short, and their sum
is the port's cumulative down-time. A ConnectX function in InfiniBand mode has one port (``port`` 1); its
PCI address names the HCA, and sysfs (``class/infiniband/<device>/device``) names the device.

Its own module: the pairing and its state are the same whichever reader (kmsg, file, journald) brings
the lines (exporters/xid.py owns the reading and the state file).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from .gpus import normalize_bdf

_MLX5_LINK = re.compile(
    r"mlx5_core (?P<bdf>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]):.*?\bLink (?P<dir>up|down)\b",
    re.IGNORECASE,
)
# A "Link up" without its "Link down" (the down was before the agent started, or in a lost line) adds
# nothing; a down that never comes up is counted until now by the caller (``down_since``).


def parse_link_change(text: str) -> tuple[str, bool] | None:
    """``("0000:3c:00.0", False)`` from an mlx5_core "Link down" line (True for "Link up"), else None."""
    if "mlx5_core" not in text:
        return None
    match = _MLX5_LINK.search(text)
    if not match:
        return None
    return match.group("bdf").lower(), match.group("dir").lower() == "up"


@dataclass
class PortDowntime:
    """Per HCA (PCI address): completed cuts, their summed length, the longest, and an open cut."""

    cuts: int = 0
    seconds: float = 0.0
    longest: float = 0.0
    down_since: float | None = None

    def change(self, up: bool, when: float) -> None:
        if not up:
            if self.down_since is None:  # a repeated "down" keeps the first time
                self.down_since = when
            return
        if self.down_since is None:
            return
        length = max(0.0, when - self.down_since)
        self.cuts += 1
        self.seconds += length
        self.longest = max(self.longest, length)
        self.down_since = None


@dataclass
class DowntimeTracker:
    """Every port's down-time, saved and restored with the kernel log reader's position."""

    ports: dict[str, PortDowntime] = field(default_factory=dict)

    def feed(self, text: str, when: float | None) -> bool:
        """Counts one kernel line; True when it was a link change. A line without a time (a reader
        that does not say when) cannot be paired and is left to the event counter."""
        change = parse_link_change(text)
        if change is None or when is None:
            return False
        self.ports.setdefault(change[0], PortDowntime()).change(change[1], when)
        return True

    def state(self) -> dict[str, list]:
        return {
            bdf: [p.cuts, round(p.seconds, 6), round(p.longest, 6), p.down_since]
            for bdf, p in self.ports.items()
        }

    def restore(self, saved: object) -> None:
        """From :meth:`state`'s output; anything malformed is a ValueError for the caller to report."""
        if not isinstance(saved, dict):
            raise ValueError("ib_downtime: expected an object")
        ports = {}
        for bdf, value in saved.items():
            cuts, seconds, longest, since = value
            ports[str(bdf)] = PortDowntime(int(cuts), float(seconds), float(longest), since and float(since))
        self.ports = ports


def device_names(sysfs_root: str) -> dict[str, str]:
    """PCI address -> IB device name (``0000:3c:00.0`` -> ``mlx5_1``) from sysfs; empty when absent."""
    base = os.path.join(sysfs_root, "class", "infiniband")
    names: dict[str, str] = {}
    try:
        devices = os.listdir(base)
    except OSError:
        return names
    for device in devices:
        link = os.path.join(base, device, "device")
        bdf = normalize_bdf(os.path.basename(os.path.realpath(link))) if os.path.islink(link) else None
        if bdf:
            names[bdf.lower()] = device
    return names
