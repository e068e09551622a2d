"""The node's logs as a real host writes them: the kernel's lines in syslog's form (with the dmesg
uptime stamp), NVIDIA Fabric Manager's log (its own lines, and its line for each NVSwitch error the
switch driver logs), the BMC's SEL records of power supplies, and each job's per-rank logs.

Its own module: these formats change with the daemons' and tools' own, apart from the sysfs and procfs
files (twin/sysfs_tree.py, twin/lustre_client_files.py). Logs only grow: each flush appends what the
simulation produced since the last one.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from . import layout
from .sim import Simulation


class LogFiles:
    """Every node's log files under OUT."""

    def __init__(self, out: Path, sim: Simulation) -> None:
        self.out = out
        self.sim = sim
        self.psu_logged = sim.psu_ok.copy()  # PSU states the SEL has recorded
        self.sel_records = [0] * len(sim.nodes)  # last SEL record id per node

    def flush(self) -> None:
        """Append the kernel, Fabric Manager, SEL and application log lines produced since the last
        flush."""
        self._write_kernel_lines()
        self._write_sel()
        self._write_rank_logs()

    def _write_kernel_lines(self) -> None:
        """The kernel's lines, and Fabric Manager's (its own, and its view of the switch driver's)."""
        sim = self.sim
        by_node: dict[int, list[str]] = defaultdict(list)
        fabric: dict[int, list[str]] = defaultdict(list)
        for line in sorted(sim.kernel_lines, key=lambda item: item.t):
            unix = sim.unix(line.t)
            if line.log == "fabricmanager":  # Fabric Manager's own line (twin/blind_spot_faults.py fmlog)
                fabric[line.node].append(f"[{fabric_manager_stamp(unix)}] {line.text}\n")
                continue
            stamp = dmesg_stamp(unix - sim.boot_unix[line.node])
            by_node[line.node].append(
                f"{syslog_time(unix)} {sim.nodes[line.node]} kernel: {stamp} {line.text}\n"
            )
            fm_line = fabric_manager_line(unix, line.node, line.text)
            if fm_line:
                fabric[line.node].append(fm_line)
        sim.kernel_lines.clear()
        for node, lines in by_node.items():
            with open(layout.kernel_log(self.out, sim.nodes[node]), "a") as handle:
                handle.writelines(lines)
        for node, lines in fabric.items():
            with open(layout.fabric_manager_log(self.out, sim.nodes[node]), "a") as handle:
                handle.writelines(lines)

    def _write_sel(self) -> None:
        """A SEL record per PSU that failed or recovered since the last flush, as the BMC logs it."""
        sim = self.sim
        for node, psu in np.argwhere(sim.psu_ok != self.psu_logged):
            failed = not sim.psu_ok[node, psu]
            self.sel_records[node] += 1
            line = sel_line(self.sel_records[node], sim.unix(), int(psu), failed)
            with open(layout.bmc_sel_log(self.out, sim.nodes[node]), "a") as handle:
                handle.write(line)
            self.psu_logged[node, psu] = sim.psu_ok[node, psu]

    def _write_rank_logs(self) -> None:
        """Each rank's application log lines, in its job's folder on its node."""
        sim = self.sim
        by_rank: dict[tuple[int, str, int], list[str]] = defaultdict(list)
        for line in sim.app_lines:
            stamp = dt.datetime.fromtimestamp(sim.unix(line.t), dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
            by_rank[(line.node, line.job, line.rank)].append(f"[{stamp}] {line.text}\n")
        sim.app_lines.clear()
        made: set[str] = set()
        for (node, job, rank), lines in by_rank.items():
            directory = str(layout.job_log_dir(self.out, sim.nodes[node], job))
            if directory not in made:
                os.makedirs(directory, exist_ok=True)
                made.add(directory)
            with open(f"{directory}/rank-{rank}.log", "a") as handle:
                handle.writelines(lines)


def syslog_time(unix: float) -> str:
    return dt.datetime.fromtimestamp(unix, dt.UTC).isoformat(timespec="microseconds")


def dmesg_stamp(uptime: float) -> str:
    uptime = max(0.0, uptime)
    seconds = int(uptime)
    return f"[{seconds:5d}.{int((uptime - seconds) * 1e6):06d}]"


# The switch driver's first line of an error: switch index, PCI domain and the rest of the BDF, code, link.
SXID_LINE = re.compile(
    r"nvidia-nvswitch(\d+): SXid \(PCI:([0-9a-fA-F]+):([0-9a-fA-F:.]+)\): (\d+), "
    r"(Fatal|Non-fatal), Link (\d+)"
)


def fabric_manager_stamp(unix: float) -> str:
    """Fabric Manager's time stamp: "Mar 07 2024 11:52:28" (UTC on the twin)."""
    return dt.datetime.fromtimestamp(unix, dt.UTC).strftime("%b %d %Y %H:%M:%S")


def fabric_manager_line(unix: float, node: int, kernel_text: str) -> str | None:
    """Fabric Manager's own line for an NVSwitch error the switch driver logged (FM learns of it from the
    driver and names the switch by bus id (8-digit domain), physical id and port); None for other lines."""
    match = SXID_LINE.match(kernel_text)
    if match is None:
        return None
    switch, domain, bus, code, severity, link = match.groups()
    stamp = fabric_manager_stamp(unix)
    return (
        f"[{stamp}] [ERROR] [tid {2000 + node}] detected NVSwitch {severity.lower()} error {code} on fid 0 "
        f"on NVSwitch pci bus id {int(domain, 16):08x}:{bus} physical id {switch} port {link}\n"
    )


def sel_line(record: int, unix: float, psu: int, failed: bool) -> str:
    """One `ipmitool sel elist` line: a power supply's failure asserted, or deasserted when it is back."""
    stamp = dt.datetime.fromtimestamp(unix, dt.UTC)
    state = "Asserted" if failed else "Deasserted"
    return (
        f"{record:>4x} | {stamp:%m/%d/%Y} | {stamp:%H:%M:%S} | Power Supply PSU{psu} | Failure detected | "
        f"{state}\n"
    )
