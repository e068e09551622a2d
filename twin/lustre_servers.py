"""The Lustre servers' side of the twin: each OST's and MDT's per-job statistics (``job_stats``), as an
OSS and an MDS with ``jobid_var=SLURM_JOB_ID`` show them in procfs:

    OUT/servers/oss<k>/proc/fs/lustre/obdfilter/<fs>-OST<xxxx>/job_stats
    OUT/servers/mds0/proc/fs/lustre/mdt/<fs>-MDT<xxxx>/job_stats

There is no second I/O model: what a job does on a target is what its nodes' clients sent to it (the
osc and mdc statistics the simulation already keeps, twin/fabric.py), summed over the job's nodes.
Each update takes the clients' growth since the last one and books it to the job the node ran then
(or, when it has just finished, to the job it ran before: the I/O of its last moments), so the files
are exact while a node stays in one job and within one write interval at a job's start or end.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import layout
from .counters import MDC_STATS, OSC_STATS
from .sim import Simulation

OSTS_PER_OSS = 4
MDS_NAME = "mds0"
# The obdfilter job_stats lines (Lustre 2.15), and the client osc line each one is summed from.
OST_LINES = (
    ("read_bytes", "bytes", "read_bytes"),
    ("write_bytes", "bytes", "write_bytes"),
    ("read", "usecs", "ost_read"),
    ("write", "usecs", "ost_write"),
    ("getattr", "usecs", None),
    ("setattr", "usecs", None),
    ("punch", "usecs", None),
    ("sync", "usecs", None),
    ("destroy", "usecs", None),
    ("create", "usecs", None),
    ("statfs", "usecs", None),
    ("get_info", "usecs", None),
    ("set_info", "usecs", None),
    ("quotactl", "usecs", None),
)
# The mdt job_stats lines and the client mdc line each is summed from (every close had its open).
MDT_LINES = (
    ("open", "usecs", "mds_close"),
    ("close", "usecs", "mds_close"),
    ("mknod", "usecs", None),
    ("link", "usecs", None),
    ("unlink", "usecs", None),
    ("mkdir", "usecs", None),
    ("rmdir", "usecs", None),
    ("rename", "usecs", None),
    ("getattr", "usecs", "mds_getattr"),
    ("setattr", "usecs", None),
    ("getxattr", "usecs", None),
    ("setxattr", "usecs", None),
    ("statfs", "usecs", None),
    ("sync", "usecs", None),
    ("samedir_rename", "usecs", None),
    ("crossdir_rename", "usecs", None),
)


def oss_name(ost: int) -> str:
    return f"oss{ost // OSTS_PER_OSS}"


def server_names(osts: int) -> list[str]:
    """The storage servers of a file system with ``osts`` OSTs: OSS nodes of four OSTs, one MDS."""
    return [*dict.fromkeys(oss_name(ost) for ost in range(osts)), MDS_NAME]


class JobLedger:
    """Per (job, target) sums of the clients' statistics lines ``columns`` (count, sum, sumsq, min,
    max), grown from the clients' counters of shape [node, target, line]."""

    def __init__(self, jobs: int, targets: int, columns: list[int]) -> None:
        self.columns = columns
        shape = (jobs, targets, len(columns))
        self.count = np.zeros(shape, dtype=np.int64)
        self.sum = np.zeros(shape)
        self.sumsq = np.zeros(shape)
        self.min = np.full(shape, np.inf)
        self.max = np.zeros(shape)
        self.last: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def update(
        self,
        count: np.ndarray,
        total: np.ndarray,
        squares: np.ndarray,
        low: np.ndarray,
        high: np.ndarray,
        job: np.ndarray,
    ) -> None:
        """``job``: the job index each node's growth goes to (-1: none)."""
        now = (count[..., self.columns], total[..., self.columns], squares[..., self.columns])
        last = self.last if self.last is not None else tuple(np.zeros_like(a) for a in now)
        reset = now[0] < last[0]  # a client that rebooted counts from zero again
        grown = [np.where(reset, a, a - b) for a, b in zip(now, last, strict=True)]
        self.last = tuple(a.copy() for a in now)
        rows = job >= 0
        if not rows.any():
            return
        jobs = job[rows]
        np.add.at(self.count, jobs, grown[0][rows])
        np.add.at(self.sum, jobs, grown[1][rows])
        np.add.at(self.sumsq, jobs, grown[2][rows])
        active = grown[0][rows] > 0
        np.minimum.at(self.min, jobs, np.where(active, low[..., self.columns][rows], np.inf))
        np.maximum.at(self.max, jobs, np.where(active, high[..., self.columns][rows], 0.0))


class LustreServers:
    """The OSS and MDS procfs trees of the twin's file system, rewritten on every ``write``."""

    def __init__(self, out: Path, sim: Simulation) -> None:
        self.sim = sim
        cluster = sim.scenario.cluster
        self.fsname, self.osts, self.mdts = cluster.lustre_fsname, cluster.lustre_osts, cluster.lustre_mdts
        jobs = len(sim.jobs)
        self.ost = JobLedger(jobs, self.osts, [OSC_STATS.index(c) for _, _, c in OST_LINES if c])
        # The client keeps one mdc per MDT; the twin's counts are per node: all go to MDT0000.
        self.mdt = JobLedger(jobs, 1, [MDC_STATS.index(c) for _, _, c in MDT_LINES if c])
        self.first_seen = np.full(jobs, np.nan)  # the job's first I/O: its entries' start_time
        self.previous = np.full(len(sim.nodes), -1, dtype=np.int64)
        self.ost_dirs = [
            layout.server_procfs_root(out, oss_name(ost))
            / "fs/lustre/obdfilter"
            / f"{self.fsname}-OST{ost:04x}"
            for ost in range(self.osts)
        ]
        self.mdt_dirs = [
            layout.server_procfs_root(out, MDS_NAME) / "fs/lustre/mdt" / f"{self.fsname}-MDT{mdt:04x}"
            for mdt in range(self.mdts)
        ]

    def create(self) -> None:
        for directory in (*self.ost_dirs, *self.mdt_dirs):
            directory.mkdir(parents=True, exist_ok=True)

    def update(self) -> None:
        """Book the clients' growth since the last update to the jobs that made it."""
        sim = self.sim
        current = sim.node_job.astype(np.int64)
        # A node that just left its job did that job's last I/O; one that just joined does the new one's.
        job = np.where(self.previous >= 0, self.previous, current)
        self.previous = current.copy()
        osc, mdc = sim.osc, sim.mdc
        self.ost.update(osc.count, osc.sum, osc.sumsq, osc.min, osc.max, job)
        self.mdt.update(
            mdc.count[:, None], mdc.sum[:, None], mdc.sumsq[:, None], mdc.min[:, None], mdc.max[:, None], job
        )
        seen = (self.ost.count.sum(axis=(1, 2)) > 0) & np.isnan(self.first_seen)
        self.first_seen[seen] = sim.unix()

    def files(self) -> dict[str, str]:
        """``{path: text}`` of every target's job_stats after an update."""
        now = self.sim.unix()
        found = {}
        for ost, directory in enumerate(self.ost_dirs):
            found[str(directory / "job_stats")] = self._text(self.ost, ost, OST_LINES, now)
        for mdt, directory in enumerate(self.mdt_dirs):
            found[str(directory / "job_stats")] = (
                self._text(self.mdt, 0, MDT_LINES, now) if mdt == 0 else "job_stats:\n"
            )
        return found

    def _text(self, ledger: JobLedger, target: int, lines: tuple, now: float) -> str:
        entries = ["job_stats:\n"]
        for index in np.nonzero(ledger.count[:, target].sum(axis=1) > 0)[0]:
            start = float(self.first_seen[index]) if not np.isnan(self.first_seen[index]) else now
            entries.append(job_entry(self.sim.jobs[index].spec.id, now, start, ledger, index, target, lines))
        return "".join(entries)


def job_entry(
    job_id: str, now: float, start: float, ledger: JobLedger, job: int, target: int, lines: tuple
) -> str:
    """One ``- job_id:`` entry as Lustre 2.15 prints it; lines the clients never fed are zeros."""
    out = [
        f"- job_id:          {job_id}\n",
        f"  snapshot_time:   {now:.9f} secs.nsecs\n",
        f"  start_time:      {start:.9f} secs.nsecs\n",
        f"  elapsed_time:    {max(0.0, now - start):.9f} secs.nsecs\n",
    ]
    column = 0
    for name, unit, source in lines:
        samples = low = high = total = squares = 0
        if source is not None:
            samples = int(ledger.count[job, target, column])
            if samples:
                low, high = int(ledger.min[job, target, column]), int(ledger.max[job, target, column])
                total, squares = int(ledger.sum[job, target, column]), int(ledger.sumsq[job, target, column])
            column += 1
        out.append(
            f"  {name + ':':<16} {{ samples: {samples:11d}, unit: {unit}, min: {low:8d}, max: {high:8d}, "
            f"sum: {total:16d}, sumsq: {squares:18d} }}\n"
        )
    return "".join(out)
