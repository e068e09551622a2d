"""The Lustre servers' side of the twin: every OST's and MDT's job_stats, in Lustre's own format, with
the scheduler's job ids, and what the jobs' clients sent to each target."""

from __future__ import annotations

import re
from pathlib import Path

from twin import layout

ENTRY = re.compile(r"^- job_id:\s+(\S+)$")
HEADER = re.compile(r"^  (snapshot|start|elapsed)_time:\s+\d+\.\d{9} secs\.nsecs$")
STAT = re.compile(
    r"^  (\w+):\s+\{ samples:\s+(\d+), unit: (bytes|usecs), min:\s+(\d+), max:\s+(\d+), "
    r"sum:\s+(\d+), sumsq:\s+(\d+) \}$"
)


def job_sums(text: str, stat: str) -> dict[str, int]:
    """{job: sum of `stat`} of a job_stats file, failing on any line Lustre would not print."""
    lines = text.splitlines()
    assert lines[0] == "job_stats:"
    found: dict[str, int] = {}
    job = None
    for line in lines[1:]:
        entry, header, values = ENTRY.match(line), HEADER.match(line), STAT.match(line)
        assert entry or header or values, f"not a job_stats line: {line!r}"
        if entry:
            job = entry.group(1)
        elif values and values.group(1) == stat:
            assert job is not None
            samples, low, high, total = (int(values.group(i)) for i in (2, 4, 5, 6))
            assert (samples == 0) == (total == 0) and low <= high
            found[job] = total
    return found


def client_sum(node: Path, stat: str) -> int:
    """The node's osc stats `stat` sums, over its OSTs (what its client sent)."""
    total = 0
    for stats in (node / "proc/fs/lustre/osc").glob("*/stats"):
        match = re.search(rf"^{stat}\s+\d+ samples \[bytes\] \d+ \d+ (\d+)", stats.read_text(), re.M)
        total += int(match.group(1)) if match else 0
    return total


def test_servers_write_job_stats_of_the_jobs_io(twin_factory) -> None:
    run = twin_factory("lustre_jobstats", serve=False)
    meta = run.meta()
    assert meta["lustre"]["servers"] == ["oss0", "oss1", "mds0"]
    assert layout.server_names(run.out) == ["oss0", "oss1", "mds0"]
    osts = sorted(run.out.glob("servers/oss*/proc/fs/lustre/obdfilter/lustre-OST*/job_stats"))
    assert [p.parent.name for p in osts] == [f"lustre-OST{i:04x}" for i in range(8)]
    assert osts[0].is_relative_to(layout.server_procfs_root(run.out, "oss0"))
    mdt = layout.server_procfs_root(run.out, "mds0") / "fs/lustre/mdt/lustre-MDT0000/job_stats"
    assert set(job_sums(mdt.read_text(), "getattr")) == {"3101", "3102"}
    nodes = {job["id"]: job["nodes"] for job in meta["jobs"]}
    for stat in ("read_bytes", "write_bytes"):
        server: dict[str, int] = {}
        for path in osts:
            for job, total in job_sums(path.read_text(), stat).items():
                server[job] = server.get(job, 0) + total
        # No job changed nodes and no host rebooted: each job's bytes are exactly its clients' bytes.
        clients = {job: sum(client_sum(run.node(n), stat) for n in names) for job, names in nodes.items()}
        assert {j: t for j, t in server.items() if t} == {j: t for j, t in clients.items() if t}, stat
    # Data loading read everywhere; only 3101 checkpointed within the 12 minutes.
    assert set(job_sums(osts[0].read_text(), "write_bytes")) == {"3101", "3102"}
    assert (
        job_sums(osts[0].read_text(), "write_bytes")["3102"]
        == 0
        < job_sums(osts[0].read_text(), "write_bytes")["3101"]
    )
