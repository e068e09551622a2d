"""Run lines through the node-side parser as it is deployed: a real rsyslogd with the generated rulebase
and ruleset (pipelines/rsyslog_conf.edge_file_config), reading a file with imfile. Returns, per line, the
ECS document the node ships and the raw node record the ingest pipelines take."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pipelines.rsyslog_conf import edge_file_config
from support import wait_until


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def run_edge(
    lines: list[str],
    work_dir: Path,
    log_class: str = "kernel",
    node: str = "n0003",
    file_name: str = "kern.log",
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """file_name: where the lines are, below work_dir (the application class reads job and rank from it)."""
    source, out, raw = work_dir / file_name, work_dir / "edge.jsonl", work_dir / "raw.jsonl"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text("".join(line + "\n" for line in lines))
    config = work_dir / "rsyslog.conf"
    config.write_text(edge_file_config(work_dir, source, out, raw, log_class, node, "test"))
    check = subprocess.run(["rsyslogd", "-N1", "-f", str(config)], capture_output=True, text=True, timeout=60)
    if check.returncode != 0 or "error" in check.stderr.lower():
        pytest.fail(f"rsyslogd refuses the edge configuration:\n{check.stderr}")
    process = subprocess.Popen(
        ["rsyslogd", "-n", "-f", str(config), "-i", str(work_dir / "rsyslogd.pid")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(
            lambda: len(lines_of(out)) >= len(lines) or process.poll() is not None,
            timeout=60,
            what=f"rsyslogd to parse {len(lines)} lines",
        )
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=30)
    edge = [json.loads(line) for line in lines_of(out)]
    records = [json.loads(line) for line in lines_of(raw)]
    assert len(edge) == len(records) == len(lines), f"rsyslogd wrote {len(edge)} of {len(lines)}:\n{output}"
    return edge, records
