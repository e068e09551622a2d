"""Each node's Lustre client as a real host shows it: its sysfs (sys/fs/lustre: version, llite, osc and
mdc settings) and procfs statistics (proc/fs/lustre: llite, osc and mdc ``stats``, each OSC's
``rpc_stats`` histogram and ``import`` state), in Lustre 2.15's formats.

Its own module: these formats change with Lustre's, apart from the node's other sysfs files
(twin/sysfs_tree.py) and the servers' job_stats (twin/lustre_servers.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import sim as simmod
from .file_cache import FileCache, write_static
from .sim import Simulation


class LustreClientFiles:
    """The Lustre client's files of every node under its root."""

    def __init__(self, cache: FileCache, sim: Simulation) -> None:
        self.cache = cache
        self.sim = sim
        fsname = sim.scenario.cluster.lustre_fsname
        self.llite_dirs = [f"{fsname}-{inst}" for inst in sim.lustre_instance]

    def create(self, index: int, root: Path) -> None:
        """The client's folders and the files that never change."""
        write_static(self.cache, root / "sys/fs/lustre", version="2.15.4", health_check="healthy")
        sim = self.sim
        fsname = sim.scenario.cluster.lustre_fsname
        inst = sim.lustre_instance[index]
        llite = root / "proc/fs/lustre/llite" / self.llite_dirs[index]
        llite.mkdir(parents=True, exist_ok=True)
        write_static(
            self.cache,
            root / "sys/fs/lustre/llite" / self.llite_dirs[index],
            max_read_ahead_mb="1024",
            uuid=f"{fsname}-client",
        )
        for ost in range(sim.scenario.cluster.lustre_osts):
            name = f"{fsname}-OST{ost:04x}-osc-{inst}"
            (root / "proc/fs/lustre/osc" / name).mkdir(parents=True, exist_ok=True)
            write_static(
                self.cache,
                root / "sys/fs/lustre/osc" / name,
                active="1",
                max_rpcs_in_flight="8",
                ost_conn_uuid=f"10.10.{ost // 4}.{10 + ost}@o2ib",
            )
        for mdt in range(sim.scenario.cluster.lustre_mdts):
            name = f"{fsname}-MDT{mdt:04x}-mdc-{inst}"
            (root / "proc/fs/lustre/mdc" / name).mkdir(parents=True, exist_ok=True)
            write_static(self.cache, root / "sys/fs/lustre/mdc" / name, active="1", max_rpcs_in_flight="8")

    def write(self, index: int, root: str) -> None:
        """The client's statistics and imports as they are now (every tick: they change)."""
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
