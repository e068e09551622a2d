"""NVIDIA Xid and NVSwitch SXid events (and a few other kernel events) from the kernel log.

Forms seen across driver generations, with or without a syslog/dmesg prefix::

    NVRM: Xid (0000:03:00): 13, 0003 00000000 0000a1c0 ...                        (pre-R400, no "PCI:")
    NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.                    (R4xx)
    NVRM: Xid (PCI:0000:b1:00): 79, pid='<unknown>', name=<unknown>, GPU has ...   (R5xx)
    NVRM: Xid (PCI:0000:18:00): 94, pid=2532, name=python3, Contained ECC error    (R535+)
    NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x...)    (R560+ NVLink)
    nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 ...       (NVSwitch)

Counting is by Xid code and GPU; the category and recommended action come from
:mod:`fleetsight.xid_catalog`. The reader's position and the counts are saved in a state file, so a
restart neither counts old lines again nor resets the counters.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import time
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import Metric

from fleetsight.xid_catalog import lookup

from .core import Problems, Source, kv, register_collector
from .exposition import Families
from .gpus import GpuMap, normalize_bdf
from .ib_downtime import DowntimeTracker, PortDowntime, device_names
from .kernlog import FileReader, JournalReader, KmsgReader, LogLine
from .state import save_json

log = logging.getLogger("fleetsight.exporters.xid")

_XID = re.compile(
    r"(?:NVRM|nvidia-nvswitch\d*): (?P<kind>S?Xid) "
    r"\((?:PCI:)?(?P<bdf>[0-9a-fA-F]{1,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\): "
    r"(?P<code>\d{1,6})(?P<rest>.*)$"
)
_SXID_SEVERITY = re.compile(r"^,\s*(Fatal|Non-fatal)", re.IGNORECASE)
_MLX5 = re.compile(
    r"mlx5_core (?P<bdf>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]).*?Link (?P<dir>up|down)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class XidEvent:
    kind: str  # "Xid" or "SXid"
    code: int
    pci_bdf: str
    severity: str = ""  # SXid: "fatal" / "non-fatal" when the line says


def parse_xid(line: str) -> XidEvent | None:
    """The Xid/SXid in a kernel log line, or None; never raises on any input."""
    if "Xid" not in line:  # cheap pre-check: most lines are not Xids
        return None
    match = _XID.search(line)
    if not match:
        return None
    bdf = normalize_bdf(match.group("bdf"))
    if bdf is None:
        return None
    severity = ""
    if match.group("kind") == "SXid":
        # The NVSwitch driver spreads one SXid over several lines ("..., Non-fatal, Link 32 ...",
        # "..., Severity 0 Engine instance ...", "..., Data {...}"); only the first names the severity,
        # and only that one is the event.
        sev = _SXID_SEVERITY.match(match.group("rest"))
        if sev is None:
            return None
        severity = sev.group(1).lower()
    return XidEvent(match.group("kind"), int(match.group("code")), bdf, severity)


def other_event(line: str) -> tuple[str, str] | None:
    """(kind, pci_bdf) of kernel events worth counting besides Xids: Lustre errors, IB link changes."""
    if "LustreError" in line:
        return "lustre_error", ""
    if "Lustre:" in line:
        if "was lost" in line:
            return "lustre_connection_lost", ""
        if "ptlrpc_expire_one_request" in line or "timed out for slow reply" in line:
            return "lustre_rpc_timeout", ""
    if "mlx5_core" in line:
        match = _MLX5.search(line)
        if match:
            return f"ib_link_{match.group('dir').lower()}", match.group("bdf").lower()
    return None


class XidSource(Source):
    """Counts Xids (and other kernel events) in the kernel log.

    With a state file, the reader's position and the counts are saved together after every scrape
    that moved them, so a restarted agent neither counts old lines again nor starts its ``_total``
    counters from 0. A state that cannot be written is reported (``errors_total{source="state"}``,
    ``fleetsight_kernel_log_state_persisted 0``) and counting goes on in memory.
    """

    name = "xid"

    def __init__(
        self,
        mode: str,
        path: str,
        gpu_map: GpuMap,
        state_file: str | None = None,
        procfs_root: str = "/proc",
        journalctl: str = "journalctl",
        save_state: bool = True,
        sysfs_root: str | None = None,
    ) -> None:
        self.mode, self.path, self.gpu_map, self.state_file = mode, path, gpu_map, state_file
        # Each IB port's cuts and down-time from its Link down/up lines (exporters/ib_downtime.py); sysfs
        # names the device of each HCA's PCI address.
        self.downtime = DowntimeTracker()
        self.sysfs_root = sysfs_root
        self._ib_devices: dict[str, str] = {}
        self.procfs_root, self.journalctl = procfs_root, journalctl
        self.save_state = save_state and state_file is not None
        # The source the counts belong to: a state saved for another one is not this log's history.
        self.source_id = "journald" if mode == "journald" else f"{mode}:{path}"
        # (kind, code, bdf, severity) -> [count, last seen]; kind-other (kind, bdf) -> count
        self.xids: dict[tuple[str, int, str, str], list[float]] = {}
        self.others: dict[tuple[str, str], int] = {}
        self.lines_read = 0
        self.load_problem = ""  # why the saved state could not be read: reported on the first scrape
        self.save_problem = ""  # why the last save failed: reported on every scrape until one succeeds
        self.persisted = False
        self._position = self._load_state()
        self._saved_position = self._position
        self.reader: FileReader | KmsgReader | JournalReader | None = None

    # -- state ------------------------------------------------------------------------------------
    def _load_state(self) -> dict | None:
        if not self.state_file:
            return None
        try:
            with open(self.state_file) as f:
                state = json.load(f)
            if state.get("source", self.source_id) != self.source_id:
                saved, now = state["source"], self.source_id
                log.warning(kv(event="state_other_source", file=self.state_file, saved=saved, now=now))
                return None
            for key, value in state.get("xids", {}).items():
                kind, code, bdf, severity = key.split("|")
                self.xids[(kind, int(code), bdf, severity)] = [float(value[0]), float(value[1])]
            for key, value in state.get("others", {}).items():
                kind, bdf = key.split("|")
                self.others[(kind, bdf)] = int(value)
            self.downtime.restore(state.get("ib_downtime", {}))
            self.lines_read = int(state.get("lines_read", 0))
            self.persisted = True
            return state.get("position")
        except (FileNotFoundError, NotADirectoryError):  # nothing saved yet (a save would say why)
            return None
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            self.xids.clear()
            self.others.clear()
            self.downtime = DowntimeTracker()
            self.lines_read = 0
            self.load_problem = f"{self.state_file} unreadable, starting afresh: {exc!r}"
            log.warning(kv(event="state_unreadable", file=self.state_file, error=repr(exc)))
            return None

    def _save_state(self, position: dict) -> None:
        assert self.state_file is not None
        state = {
            "source": self.source_id,
            "position": position,
            "xids": {"|".join(map(str, k)): v for k, v in self.xids.items()},
            "others": {"|".join(k): v for k, v in self.others.items()},
            "ib_downtime": self.downtime.state(),
            "lines_read": self.lines_read,
        }
        save_json(self.state_file, state)

    def _persist(self, counted: bool) -> None:
        """Saves the state when the position or the counts moved since the last save (or a save failed);
        a failure is reported on every scrape until a save succeeds."""
        if not self.save_state or self.reader is None:
            return
        position = self.reader.position()
        if not counted and position == self._saved_position and self.persisted:
            return
        try:
            self._save_state(position)
        except OSError as exc:
            if not self.save_problem:  # log when it starts failing, not on every scrape
                log.error(
                    kv(
                        event="state_unwritable",
                        file=self.state_file,
                        error=repr(exc),
                        detail="counting in memory; a restart would count the current log again",
                    )
                )
            self.persisted = False
            self.save_problem = f"{self.state_file}: {exc}"
            return
        if self.save_problem:
            log.info(kv(event="state_writable_again", file=self.state_file))
        self._saved_position, self.persisted, self.save_problem = position, True, ""

    # -- reading ----------------------------------------------------------------------------------
    def _reader(self):
        if self.reader is None:
            if self.mode == "kmsg":
                self.reader = KmsgReader(self.path, self.procfs_root, self._position)
            elif self.mode == "journald":
                self.reader = JournalReader(self.journalctl, self._position)
            else:
                self.reader = FileReader(self.path, self._position)
        return self.reader

    def _count(self, line: LogLine) -> None:
        event = parse_xid(line.text)
        if event is not None:
            key = (event.kind, event.code, event.pci_bdf, event.severity)
            entry = self.xids.setdefault(key, [0.0, 0.0])
            entry[0] += 1
            entry[1] = max(entry[1], line.timestamp or time.time())
            return
        self.downtime.feed(line.text, line.timestamp)
        other = other_event(line.text)
        if other is not None:
            self.others[other] = self.others.get(other, 0) + 1

    def gather(self, problems: Problems) -> list[Metric]:
        try:
            lines = self._reader().poll()
        except OSError as exc:
            problems.add(self.mode, f"{self.path}: {exc}")
            lines = []
        except RuntimeError as exc:
            problems.add(self.mode, str(exc))
            lines = []
        for line in lines:
            self._count(line)
        self.lines_read += len(lines)
        self._persist(bool(lines))
        for problem in (self.load_problem, self.save_problem):
            if problem:
                problems.add("state", problem)
        self.load_problem = ""
        return self._families()

    def _families(self) -> list[Metric]:
        f = Families()
        labels = ["xid", "pci_bdf", "gpu", "uuid", "category", "action"]
        xid_total = f.counter("fleetsight_gpu_xid_errors", "NVIDIA Xid events in the kernel log.", labels)
        xid_last = f.gauge(
            "fleetsight_gpu_xid_last_seen_timestamp_seconds",
            "Unix time of the last Xid of this code on this GPU.",
            labels,
        )
        sxid_labels = ["sxid", "pci_bdf", "severity"]
        sxid_total = f.counter(
            "fleetsight_nvswitch_sxid_errors", "NVSwitch SXid events in the kernel log.", sxid_labels
        )
        sxid_last = f.gauge(
            "fleetsight_nvswitch_sxid_last_seen_timestamp_seconds",
            "Unix time of the last SXid of this code on this NVSwitch.",
            sxid_labels,
        )
        lines = f.counter("fleetsight_kernel_log_lines", "Kernel log lines read by the agent.", [])
        lines.add_metric([], self.lines_read)
        persisted = f.gauge(
            "fleetsight_kernel_log_state_persisted",
            "1 when the kernel log position and the Xid counts are saved on disk (a restart continues from"
            " them), 0 when they are kept in memory only.",
            [],
        )
        persisted.add_metric([], 1.0 if self.persisted and self.save_state else 0.0)
        for (kind, code, bdf, severity), (count, last) in sorted(self.xids.items()):
            if kind == "SXid":
                sxid_total.add_metric([str(code), bdf, severity], count)
                sxid_last.add_metric([str(code), bdf, severity], last)
                continue
            gpu = self.gpu_map.lookup(bdf)
            info = lookup(code)
            values = [str(code), bdf, str(gpu.index) if gpu else "", gpu.uuid if gpu else "", info.category]
            values.append(info.action)
            xid_total.add_metric(values, count)
            xid_last.add_metric(values, last)
        events = f.counter(
            "fleetsight_kernel_events",
            "Other kernel log events: lustre_error, lustre_connection_lost, lustre_rpc_timeout, ib_link_down,"
            " ib_link_up.",
            ["kind", "pci_bdf"],
        )
        for (kind, bdf), count in sorted(self.others.items()):
            events.add_metric([kind, bdf], count)
        self._downtime_families(f)
        return f.all()

    def _downtime_families(self, f: Families) -> None:
        """Each IB port's cuts and down-time from the kernel's Link down/up lines, whatever the port's
        state at scrape time (a cut of milliseconds between two scrapes counts)."""
        if self.sysfs_root and (
            not self._ib_devices or not set(self.downtime.ports) <= set(self._ib_devices)
        ):
            self._ib_devices = device_names(self.sysfs_root)
        # Every HCA of the host from its first scrape, at 0: a counter that first appears with its first
        # cut already in it would hide that cut from increase().
        for bdf in self._ib_devices:
            self.downtime.ports.setdefault(bdf, PortDowntime())
        if not self.downtime.ports:
            return
        labels = ["device", "port", "pci_bdf"]
        seconds = f.counter(
            "fleetsight_infiniband_port_down_seconds",
            "Seconds the port was down, summed over its completed cuts (kernel Link down -> Link up).",
            labels,
        )
        cuts = f.counter(
            "fleetsight_infiniband_port_cuts",
            "Completed cuts (Link down then Link up) in the kernel log.",
            labels,
        )
        longest = f.gauge(
            "fleetsight_infiniband_port_longest_cut_seconds", "The longest completed cut's length.", labels
        )
        since = f.gauge(
            "fleetsight_infiniband_port_down_since_timestamp_seconds",
            "Unix time of the Link down line of a cut not yet followed by Link up (absent when up).",
            labels,
        )
        for bdf, port in sorted(self.downtime.ports.items()):
            values = [self._ib_devices.get(bdf, ""), "1", bdf]  # one IB port per ConnectX PCI function
            seconds.add_metric(values, port.seconds)
            cuts.add_metric(values, port.cuts)
            longest.add_metric(values, port.longest)
            if port.down_since is not None:
                since.add_metric(values, port.down_since)

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()


def kernel_log_mode(opts: Any) -> str:
    """``journald``, ``kmsg`` (records with sequence numbers: /dev/kmsg or a file of its records) or
    ``file`` (a syslog-format file such as /var/log/kern.log)."""
    if opts.journald:
        return "journald"
    if opts.kernel_log_format == "kmsg":
        return "kmsg"
    if opts.kernel_log_format == "syslog":
        return "file"
    try:
        is_device = stat.S_ISCHR(os.stat(opts.kmsg_file).st_mode)
    except OSError:
        is_device = False
    return "kmsg" if is_device or opts.kmsg_file == "/dev/kmsg" else "file"


@register_collector("xid", position=30)
def xid_collector(opts: Any, gpu_map: GpuMap) -> Source:
    state_file = os.path.join(opts.state_dir, f"xid-{opts.node}.json") if opts.state_dir else None
    return XidSource(
        kernel_log_mode(opts),
        opts.kmsg_file,
        gpu_map,
        state_file,
        opts.procfs_root,
        opts.journalctl,
        save_state=not opts.state_read_only,
        sysfs_root=opts.sysfs_root,
    )
