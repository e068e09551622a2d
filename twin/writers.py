"""Writes the simulation's state as the files a real host has: a sysfs tree, a procfs tree with the
Lustre client statistics, the kernel log, the job's per-rank logs, the PCIe bandwidth probe's JSON,
plus the run's meta.json (what a real cluster's inventory and scheduler show) and, outside the
output folder, the ground truth (twin/truth.py).

On a disk file system every file written costs: a new inode or a rename is ~100 us of kernel time on
ext4 and every changed file dirties a page that must go to disk. So a file is written only when its
content changes (a node has ~860 files, ~80 of which change in a tick: the busy IB counters and the
Lustre stats), and the IB counters are compared as numbers before any string is formatted. How a
changed file is written depends on what a reader may see:

- single-value sysfs files (counters, state, link speed) grow in place with one ``pwrite``: a reader's
  one small read sees the old or the new value, never an empty file;
- multi-line files (Lustre ``stats``, ``rpc_stats``, ``import``, the servers' ``job_stats``, the
  probe's JSON), new files and
  values that shrink (a counter reset by a reboot) go through a temporary file and a rename, so a
  reader never sees half of one and half of another.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from . import hardware as hw
from . import layout
from . import sim as simmod
from . import truth as truthmod
from .lustre_servers import LustreServers, server_names
from .sim import Simulation

IB_STATE = {True: "4: ACTIVE", False: "1: DOWN"}
IB_PHYS = {True: "5: LinkUp", False: "3: Disabled"}
IB_RATE = {4: "400 Gb/sec (4X NDR)", 2: "200 Gb/sec (2X NDR)", 1: "100 Gb/sec (1X NDR)"}
IB_RATE_DOWN = "10 Gb/sec (4X SDR)"


def syslog_time(unix: float) -> str:
    return dt.datetime.fromtimestamp(unix, dt.UTC).isoformat(timespec="microseconds")


def dmesg_stamp(uptime: float) -> str:
    uptime = max(0.0, uptime)
    seconds = int(uptime)
    return f"[{seconds:5d}.{int((uptime - seconds) * 1e6):06d}]"


class FileCache:
    """Remembers what each file holds so that unchanged files are not rewritten."""

    def __init__(self) -> None:
        self.content: dict[str, str] = {}
        self.writes = 0
        self.renames = 0

    def put(self, path: str, text: str, atomic: bool = False) -> None:
        """Write text to path unless it holds it already; atomic: always replace by rename."""
        old = self.content.get(path)
        if old == text:
            return
        if old is None:
            old = read_existing(path)  # a restart into the same folder keeps what is still right
            if old == text:
                self.content[path] = text
                return
        data = text.encode()
        if atomic or old is None or len(text) < len(old):
            tmp = f"{path}.tmp"
            with open(tmp, "wb") as handle:
                handle.write(data)
            os.replace(tmp, path)
            self.renames += 1
        else:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.pwrite(fd, data, 0)
            finally:
                os.close(fd)
        self.content[path] = text
        self.writes += 1

    def forget(self, path: str) -> None:
        self.content.pop(path, None)


def read_existing(path: str) -> str | None:
    """What a file left by an earlier run holds (None if there is none or it is not text)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 1 << 20).decode()
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)


class TreeWriter:
    """Per-node file trees under OUT/nodes/<node>/ and the run's files under OUT/."""

    def __init__(self, out: Path, sim: Simulation, truth: Path | None = None) -> None:
        self.out = out
        self.sim = sim
        self.truth_path = truth if truth is not None else truthmod.default_truth_path(out)
        truthmod.check_outside(self.truth_path, out)
        self.cache = FileCache()
        self.node_roots = [str(layout.node_root(out, name)) for name in sim.nodes]
        self.agent_down: dict[int, bool] = {}
        fsname = sim.scenario.cluster.lustre_fsname
        self.llite_dirs = [f"{fsname}-{inst}" for inst in sim.lustre_instance]
        self.truth_text = ""
        self.meta_text = ""
        self.meta_jobs: list[tuple[str, int]] | None = None
        self.port_dirs = [
            [f"{root}/sys/class/infiniband/{name}/ports/1" for name in hw.IB_DEVICES]
            for root in self.node_roots
        ]
        # The GPU index of each PCI function (-1: not a GPU), to tell which fell off the bus.
        self.pci_gpu_column = np.array([d.index if d.kind == "gpu" else -1 for d in sim.pci])
        self.written: dict[str, np.ndarray] = {}  # per-tick values last written, by file kind
        self.psu_logged = sim.psu_ok.copy()  # PSU states the SEL has recorded
        self.sel_records = [0] * len(sim.nodes)  # last SEL record id per node
        self.servers = LustreServers(out, sim)  # the OSS and MDS job_stats of the jobs' I/O

    # ------------------------------------------------------------------------------- layout
    def create(self) -> None:
        """The directory skeleton and the files that never change."""
        self.out.mkdir(parents=True, exist_ok=True)
        truthmod.write_lines(self.truth_path, [])
        truthmod.write_scenario(truthmod.scenario_path(self.truth_path), scenario_info(self.sim))
        self.write_meta()
        for index, root in enumerate(self.node_roots):
            self._create_node(index, Path(root))
        self.servers.create()

    def _create_node(self, index: int, root: Path) -> None:
        sim = self.sim
        node = sim.nodes[index]
        for path in ("var/log", "fleetsight", "sys/bus/pci/devices", "sys/class/infiniband", "sys/fs/lustre"):
            (root / path).mkdir(parents=True, exist_ok=True)
        layout.kernel_log(self.out, node).touch()
        for device in sim.pci:
            base = root / "sys/bus/pci/devices" / device.bdf
            base.mkdir(exist_ok=True)
            self._static(base, vendor=device.vendor, device=device.device, **{"class": device.pci_class})
            self._static(
                base,
                max_link_speed=hw.PCIE_GEN_SPEED[device.gen],
                max_link_width=str(device.width),
            )
        for port, name in enumerate(hw.IB_DEVICES):
            base = root / "sys/class/infiniband" / name
            (base / "ports/1/counters").mkdir(parents=True, exist_ok=True)
            (base / "ports/1/hw_counters").mkdir(parents=True, exist_ok=True)
            guid = hw.hca_guid(sim.scenario.seed, node, port)
            self._static(
                base,
                node_guid=hw.sysfs_guid(guid),
                sys_image_guid=hw.sysfs_guid(guid),
                fw_ver="28.39.1002",
                hca_type="MT4129",
                board_id="MT_0000000838",
                node_desc=f"{node} {name}",
                node_type="1: CA",
            )
            link = base / "device"
            if not link.is_symlink():
                link.symlink_to(f"../../../bus/pci/devices/{hw.HCA_BDFS[port]}")
            self._static(
                base / "ports/1",
                link_layer="InfiniBand",
                lid=f"0x{index * 16 + port + 1:x}",
                sm_lid="0x1",
                lid_mask_count="0",
                cap_mask="0xa751e84a",
            )
        self._static(root / "sys/fs/lustre", version="2.15.4", health_check="healthy")
        self._create_lustre(index, root)

    def _create_lustre(self, index: int, root: Path) -> None:
        sim = self.sim
        fsname = sim.scenario.cluster.lustre_fsname
        inst = sim.lustre_instance[index]
        llite = root / "proc/fs/lustre/llite" / self.llite_dirs[index]
        llite.mkdir(parents=True, exist_ok=True)
        self._static(
            root / "sys/fs/lustre/llite" / self.llite_dirs[index],
            max_read_ahead_mb="1024",
            uuid=f"{fsname}-client",
        )
        for ost in range(sim.scenario.cluster.lustre_osts):
            name = f"{fsname}-OST{ost:04x}-osc-{inst}"
            (root / "proc/fs/lustre/osc" / name).mkdir(parents=True, exist_ok=True)
            self._static(
                root / "sys/fs/lustre/osc" / name,
                active="1",
                max_rpcs_in_flight="8",
                ost_conn_uuid=f"10.10.{ost // 4}.{10 + ost}@o2ib",
            )
        for mdt in range(sim.scenario.cluster.lustre_mdts):
            name = f"{fsname}-MDT{mdt:04x}-mdc-{inst}"
            (root / "proc/fs/lustre/mdc" / name).mkdir(parents=True, exist_ok=True)
            self._static(root / "sys/fs/lustre/mdc" / name, active="1", max_rpcs_in_flight="8")

    def _static(self, directory: Path, **files: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        for name, value in files.items():
            self.cache.put(str(directory / name), f"{value}\n")

    def meta(self) -> dict[str, Any]:
        sim = self.sim
        scenario = sim.scenario
        topo = sim.topology
        nodes = []
        for index, name in enumerate(sim.nodes):
            nodes.append(
                {
                    "name": name,
                    "rack": topo.rack(index),
                    "scalable_unit": topo.su(index),
                    "gpus": [
                        {"gpu": g, "pci_bdf": bdf, "uuid": sim.gpu_uuids[index][g], "model": hw.GPU_MODEL}
                        for g, bdf in enumerate(hw.GPU_BDFS)
                    ],
                    "hcas": [
                        {
                            "device": dev,
                            "port": 1,
                            "pci_bdf": hw.HCA_BDFS[p],
                            "guid": hw.hca_guid(scenario.seed, name, p),
                            "netdev": hw.netdev_name(hw.HCA_BDFS[p]),
                            "fabric": "compute" if p < hw.COMPUTE_PORTS else "storage",
                            "leaf": topo.leaf(index, p)[0],
                            "leaf_port": topo.leaf(index, p)[1],
                        }
                        for p, dev in enumerate(hw.IB_DEVICES)
                    ],
                    "psus": [f"PSU{i}" for i in range(scenario.cluster.psus_per_node)],
                    # Where the node's sources lie, relative to OUT (and its BMC, below the twin's URL):
                    # what a stack runner needs to point a node agent at this node, without this code.
                    "sources": layout.node_sources(name),
                }
            )
        return {
            "cluster": scenario.cluster.name,
            "start": sim.iso(0.0),
            "start_unix": sim.start_unix,
            "tick_seconds": scenario.tick,
            "duration_seconds": scenario.duration,
            "sku": scenario.cluster.sku,
            "lustre": {
                "fsname": scenario.cluster.lustre_fsname,
                "osts": scenario.cluster.lustre_osts,
                "servers": server_names(scenario.cluster.lustre_osts),
            },
            "jobs": [
                {
                    "id": job.spec.id,
                    "name": job.spec.name,
                    "user": job.spec.user,
                    "state": job.state,
                    "nodes": [sim.nodes[i] for i in job.nodes] if job.state == "RUNNING" else [],
                    "allocations": job.allocations,
                }
                for job in sim.jobs
            ],
            "nodes": nodes,
        }

    # ------------------------------------------------------------------------------- per tick
    def write_state(self) -> None:
        """Everything that changes: IB ports and counters, PCIe links, Lustre stats, the probe's JSON.

        A crashed host writes nothing. IB and PCIe values are compared with what was last written as
        arrays, so only the files whose value changed are formatted and written."""
        sim = self.sim
        alive = sim.alive[:, None]
        self._write_ib_links(alive)
        self._write_ib_counters(alive)
        self._write_pci(alive)
        for index, root in enumerate(self.node_roots):
            if sim.alive[index]:
                self._write_lustre(index, root)
                self._write_probe(index, root)
            self._mark_agent(index, root, sim.answers(index, "node_agent"))
        # The servers stay up when a client dies; their job_stats grow by what the clients sent.
        self.servers.update()
        for path, text in self.servers.files().items():
            self.cache.put(path, text, atomic=True)

    def _mark_agent(self, index: int, root: str, answers: bool) -> None:
        """The node agent's down marker (layout.AGENT_DOWN_FILE), written or removed when it changes."""
        if self.agent_down.get(index, False) == (not answers):
            return
        marker = Path(root) / layout.AGENT_DOWN_FILE
        if answers:
            marker.unlink(missing_ok=True)
        else:
            marker.write_text("the node agent does not answer (host down or telemetry_dropout)\n")
        self.agent_down[index] = not answers

    def _changed(self, key: str, values: np.ndarray, alive: np.ndarray) -> tuple[list, list, list]:
        """(nodes, columns, values) where values differ from the last written ones, on live hosts."""
        last = self.written.get(key)
        if last is None:  # the type's largest value stands for "never written": no value reaches it
            self.written[key] = last = np.full_like(values, np.iinfo(values.dtype).max)
        changed = (values != last) & alive
        nodes, columns = np.nonzero(changed)
        fresh = values[nodes, columns]
        last[nodes, columns] = fresh
        return nodes.tolist(), columns.tolist(), fresh.tolist()

    def _write_ib_links(self, alive: np.ndarray) -> None:
        sim = self.sim
        put = self.cache.put
        link = np.where(sim.ib_up, sim.ib_width.astype(np.int64), -1)  # -1: down, whatever the width
        for node, port, width in zip(*self._changed("link", link, alive), strict=True):
            base = self.port_dirs[node][port]
            up = width >= 0
            put(f"{base}/state", IB_STATE[up] + "\n")
            put(f"{base}/phys_state", IB_PHYS[up] + "\n")
            put(f"{base}/rate", (IB_RATE.get(width, IB_RATE[4]) if up else IB_RATE_DOWN) + "\n")

    def _write_ib_counters(self, alive: np.ndarray) -> None:
        sim = self.sim
        put = self.cache.put
        for group, counters in (("counters", sim.ib_counters), ("hw_counters", sim.ib_hw_counters)):
            for counter, values in counters.items():
                key = f"{group}/{counter}"
                for node, port, value in zip(*self._changed(key, values, alive), strict=True):
                    put(f"{self.port_dirs[node][port]}/{key}", f"{value}\n")

    def _write_pci(self, alive: np.ndarray) -> None:
        sim = self.sim
        put = self.cache.put
        # A device that fell off the bus reads all-ones config space: speed Unknown, width 63.
        gone = self.pci_gpu_column[None, :] >= 0
        gone = gone & ~sim.gpu_present[:, np.maximum(self.pci_gpu_column, 0)]
        link = np.where(gone, -1, sim.pci_gen.astype(np.int64) * 1000 + sim.pci_width)
        for node, d, code in zip(*self._changed("pci", link, alive), strict=True):
            base = f"{self.node_roots[node]}/sys/bus/pci/devices/{sim.pci[d].bdf}"
            speed = "Unknown" if code < 0 else hw.PCIE_GEN_SPEED[code // 1000]
            width = "63" if code < 0 else str(code % 1000)
            put(f"{base}/current_link_speed", speed + "\n")
            put(f"{base}/current_link_width", width + "\n")

    def _write_probe(self, index: int, root: str) -> None:
        sim = self.sim
        gpus = [
            {
                "gpu": g,
                "pci_bdf": hw.GPU_BDFS[g],
                "uuid": sim.gpu_uuids[index][g],
                "host_to_device_bytes_per_second": round(float(sim.h2d_bandwidth[index, g]), -6),
            }
            for g in range(simmod.G)
            if sim.gpu_present[index, g]
        ]
        # The probe runs between jobs in real life; the twin re-measures at most once a minute.
        measured = sim.unix() - (sim.t % 60.0)
        self.cache.put(
            str(layout.pcie_bandwidth_file(self.out, self.sim.nodes[index])),
            json.dumps({"measured_at": round(measured, 3), "gpus": gpus}) + "\n",
            atomic=True,
        )

    def _write_lustre(self, index: int, root: str) -> None:
        sim = self.sim
        fsname = sim.scenario.cluster.lustre_fsname
        inst = sim.lustre_instance[index]
        now = sim.unix()
        start = float(sim.lustre_stats_start[index])

        put = self.cache.put
        header = stats_header(now, start)
        put(
            f"{root}/proc/fs/lustre/llite/{self.llite_dirs[index]}/stats",
            header + stats_lines(sim.llite, (index,), simmod.LLITE_STATS, simmod.LLITE_UNITS),
        )
        slow = {
            f.state.get("ost")
            for f in sim.faults
            if f.spec.kind == "lustre_ost_slow" and f.started and not f.ended
        }
        for ost in range(sim.scenario.cluster.lustre_osts):
            base = f"{root}/proc/fs/lustre/osc/{fsname}-OST{ost:04x}-osc-{inst}"
            put(
                f"{base}/stats",
                header + stats_lines(sim.osc, (index, ost), simmod.OSC_STATS, simmod.OSC_UNITS),
            )
            put(f"{base}/rpc_stats", rpc_stats(now, start, sim.osc_rpcs[index, ost]))
            state = "DISCONN" if ost in slow and int(now) % 60 < 5 else "FULL"
            put(f"{base}/import", import_file(f"{fsname}-OST{ost:04x}", inst, state, ost))
        for mdt in range(sim.scenario.cluster.lustre_mdts):
            base = f"{root}/proc/fs/lustre/mdc/{fsname}-MDT{mdt:04x}-mdc-{inst}"
            put(f"{base}/stats", header + stats_lines(sim.mdc, (index,), simmod.MDC_STATS, simmod.MDC_UNITS))

    # ------------------------------------------------------------------------------- logs
    def flush_logs(self) -> None:
        """Append the kernel and application log lines produced since the last flush, and new truth."""
        sim = self.sim
        by_node: dict[int, list[str]] = defaultdict(list)
        fabric: dict[int, list[str]] = defaultdict(list)
        for line in sorted(sim.kernel_lines, key=lambda item: item.t):
            unix = sim.unix(line.t)
            if line.log == "fabricmanager":  # Fabric Manager's own line (twin/injection.py fmlog)
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
        self._write_sel()
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
        self.flush_truth()

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

    def flush_truth(self) -> None:
        """Rewrite the truth file (outside OUT) when a line or a measured slowdown changed, and
        meta.json when a job's node list did."""
        sim = self.sim
        sim.refresh_truth()
        text = json.dumps(sim.truth_lines, sort_keys=True)
        if text != self.truth_text:
            truthmod.write_lines(self.truth_path, sim.truth_lines)
            self.truth_text = text
        self.write_meta()

    def write_meta(self) -> None:
        """meta.json, rewritten (by rename) only when a job's state or node list changed."""
        jobs = [(job.state, len(job.allocations)) for job in self.sim.jobs]
        if jobs == self.meta_jobs:
            return
        self.meta_jobs = jobs
        text = json.dumps(self.meta(), indent=2) + "\n"
        if text != self.meta_text:
            path = layout.meta_file(self.out)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, path)
            self.meta_text = text


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


def scenario_info(sim: Simulation) -> dict[str, Any]:
    """The scenario's identity, for the scorer only (beside the truth file, never in OUT)."""
    scenario = sim.scenario
    return {
        "scenario": scenario.name,
        "description": scenario.description,
        "source": str(scenario.source) if scenario.source else None,
        "seed": scenario.seed,
        "start": sim.iso(0.0),
        "duration_seconds": scenario.duration,
        "realism": scenario.realism.__dict__,
        "jobs": [
            {"id": j.id, "profile": j.profile, "nodes": j.size, "pipeline_stages": j.pipeline_stages}
            for j in scenario.jobs
        ],
    }


def stats_header(now: float, start: float) -> str:
    return (
        f"{'snapshot_time':<25} {now:.9f} secs.nsecs\n"
        f"{'start_time':<25} {start:.9f} secs.nsecs\n"
        f"{'elapsed_time':<25} {max(0.0, now - start):.9f} secs.nsecs\n"
    )


def stats_lines(
    stats: simmod.Stats, index: tuple[int, ...], names: tuple[str, ...], units: tuple[str, ...]
) -> str:
    """`name  N samples [unit] min max sum sumsq`; Lustre leaves out counters that never counted."""
    count, low, high = stats.count[index], stats.min[index], stats.max[index]
    total, squares = stats.sum[index], stats.sumsq[index]
    lines = []
    for k, name in enumerate(names):
        if count[k] <= 0:
            continue
        lines.append(
            f"{name:<25} {int(count[k])} samples [{units[k]}] {int(low[k])} {int(high[k])} "
            f"{int(total[k])} {int(squares[k])}\n"
        )
    return "".join(lines)


def rpc_stats(now: float, start: float, rpcs: np.ndarray) -> str:
    """The osc rpc_stats "pages per rpc" histogram, read and write side by side."""
    lines = [
        f"snapshot_time:         {now:.9f} secs.nsecs",
        f"start_time:            {start:.9f} secs.nsecs",
        f"elapsed_time:          {max(0.0, now - start):.9f} secs.nsecs",
        "read RPCs in flight:  0",
        "write RPCs in flight: 0",
        "pending write pages:  0",
        "pending read pages:   0",
        "",
        "\t\t\tread\t\t\twrite",
        "pages per rpc         rpcs   % cum % |       rpcs   % cum %",
    ]
    counts = rpcs.tolist()
    totals = [max(1, int(sum(counts[side]))) for side in (0, 1)]
    cumulative = [0, 0]
    for b, pages in enumerate(simmod.RPC_PAGE_BUCKETS):
        cells = []
        for side in (0, 1):
            value = int(counts[side][b])
            cumulative[side] += value
            cells.append(
                f"{value:10d} {value * 100 // totals[side]:3d} {cumulative[side] * 100 // totals[side]:3d}"
            )
        lines.append(f"{pages}:\t\t{cells[0]}   | {cells[1]}")
    return "\n".join(lines) + "\n"


def import_file(target: str, instance: str, state: str, ost: int) -> str:
    return (
        "import:\n"
        f"    name: {target}-osc-{instance}\n"
        f"    target: {target}_UUID\n"
        f"    state: {state}\n"
        "    connect_flags: [ write_grant, server_lock, version, request_portal, max_byte_per_rpc, "
        "early_lock_cancel, adaptive_timeouts, lru_resize, alt_checksum_algorithm, fid_is_enabled, "
        "version_recovery, grant_shrink, full20, layout_lock, 64bithash, object_max_bytes, jobstats, "
        "einprogress, lvb_type, short_io, lfsck, bulk_mbits, second_flags, lockaheadv2, increasing_xid, "
        "client_encryption, lseek, reply_mbits ]\n"
        "    connect_data:\n"
        "       flags: 0xa0425af2e3440078\n"
        "       max_brw_size: 4194304\n"
        f"    import_flags: [ replayable, pingable, connect_tried ]\n"
        "    connection:\n"
        f"       failover_nids: [ 10.10.{ost // 4}.{10 + ost}@o2ib ]\n"
        f"       current_connection: 10.10.{ost // 4}.{10 + ost}@o2ib\n"
        "       connection_attempts: 1\n"
        "       generation: 1\n"
        "       in-progress_invalidations: 0\n"
        "       idle: 0 sec\n"
    )
