"""The node agent of a Lustre server, run as a user runs it (`--once --lustre-jobstats`), over the
job_stats the twin's OSS writes: each job's bytes on each OST under the scheduler's job id."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from exporter_helpers import promtool_check_metrics, value

from twin import layout

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "tests" / "twin" / "scenarios" / "lustre_jobstats.yaml"
CLI = [sys.executable, "-m", "fleetsight.cli"]


def file_sum(text: str, job: str, stat: str) -> int:
    entry = text.split(f"- job_id:          {job}\n", 1)[1].split("- job_id:", 1)[0]
    match = re.search(rf"^  {stat}:\s+\{{ samples:\s+\d+, unit: \w+, .*sum:\s+(\d+),", entry, re.M)
    assert match, entry
    return int(match.group(1))


def test_agent_reads_the_twins_job_stats(tmp_path: Path) -> None:
    out = tmp_path / "out"
    subprocess.run(
        [
            *CLI,
            "twin",
            "run",
            "--scenario",
            str(SCENARIO),
            "--out",
            str(out),
            "--truth",
            str(tmp_path / "t.jsonl"),
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
    server = "oss1"
    scrape = subprocess.run(
        [
            *CLI, "exporter", "node", "--once", "--no-state", "--node", server, "--collector", "lustre",
            "--lustre-jobstats", "--procfs-root", str(layout.server_procfs_root(out, server)),
            "--sysfs-root", str(layout.server_root(out, server) / "sys"),
        ],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    promtool_check_metrics(scrape)
    job_stats = (
        layout.server_procfs_root(out, server) / "fs/lustre/obdfilter/lustre-OST0005/job_stats"
    ).read_text()
    for job in ("3101", "3102"):
        labels = {"fs": "lustre", "target": "OST0005", "hpc_job": job}
        assert value(scrape, "fleetsight_lustre_job_read_bytes_total", **labels) == file_sum(
            job_stats, job, "read_bytes"
        )
        assert value(scrape, "fleetsight_lustre_job_write_bytes_total", **labels) == file_sum(
            job_stats, job, "write_bytes"
        )
    assert (
        value(scrape, "fleetsight_lustre_job_read_bytes_total", fs="lustre", target="OST0005", hpc_job="3101")
        > 0
    )
    assert (
        value(
            scrape, "fleetsight_lustre_job_write_bytes_total", fs="lustre", target="OST0005", hpc_job="3101"
        )
        > 0
    )
    # oss1 holds OST0004..OST0007 only.
    assert (
        value(scrape, "fleetsight_lustre_job_read_bytes_total", fs="lustre", target="OST0000", hpc_job="3101")
        is None
    )
