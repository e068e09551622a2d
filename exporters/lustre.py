"""Lustre I/O statistics: clients (llite, osc, mdc), servers (obdfilter, mdt) where present, and job
statistics only when asked for (they are costly on a busy server).

Sources, in order: ``<procfs>/fs/lustre``, ``<sysfs>/kernel/debug/lustre`` (where 2.12+ moved some
stats), ``<sysfs>/fs/lustre``, or the output of ``lctl get_param`` (``--lctl``). The stats layout is
``name  count samples [unit] min max sum [sumsq]``; instance folders are ``<fs>-<hex>`` (llite),
``<fs>-OST0000-osc-<hex>`` (osc), ``<fs>-MDT0000-mdc-<hex>`` (mdc), ``<fs>-OST0000`` (obdfilter).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from prometheus_client.core import Metric

from .core import Problems, Source, list_dir, read_text, register_collector
from .exposition import Families

CLIENT_COMPONENTS = ("llite", "osc", "mdc")
SERVER_COMPONENTS = ("obdfilter", "mdt")
RESCAN_S = 60.0
STATS_FILES = {
    "llite": ("stats",),
    "osc": ("stats", "rpc_stats"),
    "mdc": ("stats", "rpc_stats"),
    "obdfilter": ("stats",),
    "mdt": ("md_stats",),
}

_TARGET = re.compile(r"^(?P<fs>.+?)-(?P<target>(?:OST|MDT)[0-9a-fA-F]{4})(?:-(?:osc|mdc|lwp)-.*)?$")
_LLITE = re.compile(r"^(?P<fs>.+)-[0-9a-fA-F]{6,}$")
_LCTL_HEADER = re.compile(r"^(?P<component>[a-z_]+)\.(?P<instance>\S+)\.(?P<file>[a-z_]+)=\s*$")
_JOB_ID = re.compile(r"^-\s+job_id:\s*(\S.*?)\s*$")
_JOB_STAT = re.compile(r"^\s+(\w+):\s*\{\s*samples:\s*(\d+),\s*unit:\s*(\w+)(?:.*?sum:\s*(\d+))?")


class StatLine(NamedTuple):
    name: str
    count: int
    unit: str
    total: int | None  # the "sum" column; absent on counters like "open 5 samples [reqs]"


_STAT_LINE = re.compile(
    r"^(?P<name>\S+)[ \t]+(?P<count>\d+)[ \t]+samples[ \t]+\[(?P<unit>[^\]]*)\]"
    r"(?:[ \t]+-?\d+[ \t]+-?\d+[ \t]+(?P<sum>\d+))?",
    re.MULTILINE,
)
_IN_FLIGHT = re.compile(r"^(read|write) RPCs in flight:[ \t]*(\d+)", re.MULTILINE | re.IGNORECASE)
_PENDING = re.compile(r"^pending (read|write) pages:[ \t]*(\d+)", re.MULTILINE | re.IGNORECASE)


def parse_stats(text: str) -> list[StatLine]:
    """The counters of a Lustre ``stats`` file (``name count samples [unit] min max sum [sumsq]``);
    lines that do not parse (snapshot_time, garbage) are skipped."""
    return [
        StatLine(name, int(count), unit, int(total) if total else None)
        for name, count, unit, total in _STAT_LINE.findall(text)
    ]


@dataclass
class RpcStats:
    in_flight: dict[str, int]
    pending_pages: dict[str, int]
    rpcs: dict[str, int]


def parse_rpc_stats(text: str) -> RpcStats:
    """Current RPCs in flight, pending pages, and RPCs sent (the sum of the pages-per-RPC histogram's
    read and write columns). Only the header and the first histogram are read: that is all exported."""
    start = text.find("pages per rpc")
    header = text if start < 0 else text[:start]
    stats = RpcStats(
        {m.group(1).lower(): int(m.group(2)) for m in _IN_FLIGHT.finditer(header)},
        {m.group(1).lower(): int(m.group(2)) for m in _PENDING.finditer(header)},
        {"read": 0, "write": 0},
    )
    if start < 0:
        return stats
    end = text.find("\n\n", start)
    read = write = 0
    for line in text[start : end if end > 0 else len(text)].splitlines()[1:]:
        left, bar, right = line.partition("|")
        cells = left.split()
        columns = right.split()
        if bar and len(cells) >= 2 and columns and cells[1].isdigit() and columns[0].isdigit():
            read += int(cells[1])
            write += int(columns[0])
    stats.rpcs["read"], stats.rpcs["write"] = read, write
    return stats


def parse_job_stats(text: str) -> dict[str, dict[str, tuple[int, int | None]]]:
    """``{job_id: {stat: (samples, sum)}}`` from a ``job_stats`` file (YAML-like)."""
    jobs: dict[str, dict[str, tuple[int, int | None]]] = {}
    current: dict[str, tuple[int, int | None]] | None = None
    for line in text.splitlines():
        job = _JOB_ID.match(line)
        if job:
            current = jobs.setdefault(job.group(1).strip("'\""), {})
            continue
        stat = _JOB_STAT.match(line)
        if stat and current is not None:
            total = int(stat.group(4)) if stat.group(4) else None
            current[stat.group(1)] = (int(stat.group(2)), total)
    return jobs


def split_instance(component: str, instance: str) -> tuple[str, str]:
    """(fs, target) of an instance folder name; target is "" for llite."""
    if component == "llite":
        match = _LLITE.match(instance)
        return (match.group("fs") if match else instance), ""
    match = _TARGET.match(instance)
    if match:
        return match.group("fs"), match.group("target")
    return instance, ""


class LustreSource(Source):
    name = "lustre"

    def __init__(
        self,
        procfs_root: str,
        sysfs_root: str,
        lctl: str | None = None,
        job_stats: bool = False,
        required: bool = False,
    ) -> None:
        self.roots = [
            os.path.join(procfs_root, "fs", "lustre"),
            os.path.join(sysfs_root, "kernel", "debug", "lustre"),
            os.path.join(sysfs_root, "fs", "lustre"),
        ]
        self.lctl = shlex.split(lctl) if lctl else None
        self.job_stats = job_stats
        # Enabled by default on every node, so a host with no Lustre client (a cluster on GPFS or NFS)
        # must not read as a failing collector (ExporterDown); when asked for by name it must.
        self.required = required
        self._paths: list[tuple[tuple[str, str, str], str]] = []
        self._listed_at = -1e18
        self._names: dict[tuple[str, str], tuple[str, str]] = {}  # instance folder -> (fs, target)

    def _files(self, problems: Problems) -> dict[tuple[str, str, str], str]:
        """``{(component, instance, file): text}`` from the lustre folders or ``lctl get_param``."""
        if self.lctl:
            return self._from_lctl(problems)
        now = time.monotonic()
        if now - self._listed_at > RESCAN_S or not self._paths:
            self._paths = self._list()
            self._listed_at = now
        found: dict[tuple[str, str, str], str] = {}
        for key, path in self._paths:
            text = read_text(path)
            if text is not None:
                found[key] = text
            else:
                self._listed_at = -1e18  # a target went away (unmount): list again next time
        return found

    def _list(self) -> list[tuple[tuple[str, str, str], str]]:
        """Which stats files exist; listed once a minute, not on every scrape."""
        paths: dict[tuple[str, str, str], str] = {}
        for component, names in STATS_FILES.items():
            wanted = (*names, "job_stats") if self.job_stats and component in SERVER_COMPONENTS else names
            for root in self.roots:
                for instance in list_dir(os.path.join(root, component)):
                    for name in wanted:
                        path = os.path.join(root, component, instance, name)
                        if (component, instance, name) not in paths and os.path.isfile(path):
                            paths[(component, instance, name)] = path
        return sorted(paths.items())

    def _from_lctl(self, problems: Problems) -> dict[tuple[str, str, str], str]:
        params = [
            "llite.*.stats",
            "osc.*.stats",
            "osc.*.rpc_stats",
            "mdc.*.stats",
            "mdc.*.rpc_stats",
            "obdfilter.*.stats",
            "mdt.*.md_stats",
        ]
        if self.job_stats:
            params += ["obdfilter.*.job_stats", "mdt.*.job_stats"]
        assert self.lctl is not None
        try:
            result = subprocess.run(
                [*self.lctl, "get_param", *params],
                capture_output=True,
                text=True,
                timeout=10,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            problems.add("lctl", str(exc))
            return {}
        # lctl exits non-zero when one pattern matches nothing (no server targets on a client): fine.
        return parse_lctl_output(result.stdout)

    def gather(self, problems: Problems) -> list[Metric]:
        files = self._files(problems)
        if not files and not self.lctl:
            if self.required and not any(os.path.isdir(root) for root in self.roots):
                problems.add("lustre", "no Lustre statistics found (is the client mounted?)")
            return []
        f = Families()
        names = self._names
        for (component, instance, name), text in files.items():
            split = names.get((component, instance))
            if split is None:
                split = names[(component, instance)] = split_instance(component, instance)
            fs, target = split
            if name in ("stats", "md_stats"):
                self._stats(f, component, fs, target, parse_stats(text))
            elif name == "rpc_stats":
                self._rpc_stats(f, component, fs, target, parse_rpc_stats(text))
            elif name == "job_stats":
                self._job_stats(f, fs, target, parse_job_stats(text))
        return f.all()

    @staticmethod
    def _stats(f: Families, component: str, fs: str, target: str, lines: list[StatLine]) -> None:
        """Bytes per target; operation counts per fs (llite) or summed over a fs's targets (osc,
        mdc: a client with 100 OSTs would otherwise export a thousand op series nobody graphs)."""
        server = component in SERVER_COMPONENTS
        side = "server" if server else "client"
        if component == "llite":
            labels, values = ["fs"], [fs]
            # full names, so that a search for a rule's metric finds its producer (tests tie them)
            read_name, write_name = (
                "fleetsight_lustre_client_read_bytes",
                "fleetsight_lustre_client_write_bytes",
            )
        else:
            labels, values = ["fs", "target", "component"], [fs, target, component]
            read_name = (
                "fleetsight_lustre_server_read_bytes"
                if server
                else "fleetsight_lustre_client_target_read_bytes"
            )
            write_name = (
                "fleetsight_lustre_server_write_bytes"
                if server
                else "fleetsight_lustre_client_target_write_bytes"
            )
        summed = component in ("osc", "mdc")
        if summed:
            ops = f.summed(
                "fleetsight_lustre_client_rpc_operations",
                "Lustre client RPCs by type (osc, mdc stats sample counts), summed over the fs's targets.",
                ["fs", "component", "op"],
            )
            # Summed inline: a 100-OST client has a thousand of these lines a scrape.
            totals = ops.__dict__.setdefault("totals", {})
            for line in lines:
                key = (fs, component, line.name)
                totals[key] = totals.get(key, 0.0) + line.count
        else:
            ops = f.counter(
                f"fleetsight_lustre_{side}_operations",
                "Lustre operations (sample counts) by stats name.",
                [*labels, "op"],
            )
        for line in lines:
            if not summed:
                ops.add_metric([*values, line.name], line.count)
            if line.total is not None:
                if line.name == "read_bytes":
                    f.counter(read_name, "Bytes read through Lustre.", labels).add_metric(values, line.total)
                elif line.name == "write_bytes":
                    f.counter(write_name, "Bytes written through Lustre.", labels).add_metric(
                        values, line.total
                    )
                elif line.name == "req_waittime":
                    f.counter(
                        f"fleetsight_lustre_{side}_rpc_wait_seconds",
                        "Total time RPCs waited for a reply (req_waittime sum).",
                        labels,
                    ).add_metric(values, line.total / 1e6)
                    f.counter(
                        f"fleetsight_lustre_{side}_rpc_requests",
                        "RPCs that got a reply (req_waittime count).",
                        labels,
                    ).add_metric(values, line.count)

    @staticmethod
    def _rpc_stats(f: Families, component: str, fs: str, target: str, stats: RpcStats) -> None:
        """RPCs in flight per target (they pile up in front of a slow OST); RPCs sent and pages waiting
        summed per fs, which keeps a 100-OST client at two series per OST here."""
        in_flight = f.gauge(
            "fleetsight_lustre_client_rpcs_in_flight",
            "RPCs in flight to the target.",
            ["fs", "target", "component", "op"],
        )
        pending = f.summed(
            "fleetsight_lustre_client_pending_pages",
            "Pages waiting to be sent, summed over the fs's targets.",
            ["fs", "component", "op"],
            kind="gauge",
        )
        rpcs = f.summed(
            "fleetsight_lustre_client_rpcs",
            "Bulk RPCs sent (pages-per-RPC histogram), summed over the fs's targets.",
            ["fs", "component", "op"],
        )
        for op, value in stats.in_flight.items():
            in_flight.add_metric([fs, target, component, op], value)
        for op, value in stats.pending_pages.items():
            pending.add_metric([fs, component, op], value)
        for op, value in stats.rpcs.items():
            rpcs.add_metric([fs, component, op], value)

    @staticmethod
    def _job_stats(
        f: Families, fs: str, target: str, jobs: dict[str, dict[str, tuple[int, int | None]]]
    ) -> None:
        labels = ["fs", "target", "hpc_job"]
        read = f.counter("fleetsight_lustre_job_read_bytes", "Bytes read by a job on a target.", labels)
        write = f.counter("fleetsight_lustre_job_write_bytes", "Bytes written by a job on a target.", labels)
        ops = f.counter(
            "fleetsight_lustre_job_operations", "Operations of a job on a target.", [*labels, "op"]
        )
        for job, stats in sorted(jobs.items()):
            for name, (samples, total) in stats.items():
                if name == "read_bytes" and total is not None:
                    read.add_metric([fs, target, job], total)
                elif name == "write_bytes" and total is not None:
                    write.add_metric([fs, target, job], total)
                ops.add_metric([fs, target, job, name], samples)


def parse_lctl_output(text: str) -> dict[tuple[str, str, str], str]:
    """Splits ``lctl get_param a.*.stats b.*.stats`` output (``osc.<instance>.stats=`` then the
    file's lines) into one text per parameter."""
    found: dict[tuple[str, str, str], list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        header = _LCTL_HEADER.match(line)
        if header:
            key = (header.group("component"), header.group("instance"), header.group("file"))
            current = found.setdefault(key, [])
            continue
        if current is not None:
            current.append(line)
    return {key: "\n".join(lines) for key, lines in found.items()}


@register_collector("lustre", position=50)
def lustre_collector(opts: Any, _gpu_map: Any) -> Source:
    return LustreSource(
        opts.procfs_root, opts.sysfs_root, opts.lctl, opts.lustre_jobstats, opts.lustre_required
    )
