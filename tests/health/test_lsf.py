"""lsf-sync against a recording stand-in for LSF's `badmin` on PATH (LSF cannot run here): closes with
`badmin hclose -C "fleetsight: ..."`, reopens only the hosts it closed, and --dry-run runs nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from health_helpers import REPO, fast_policy, post_alert, start_health, wait_state

NODES = ["lsf01", "lsf02", "lsf03", "lsf04"]
BADMIN = """#!/bin/sh
# Stand-in for LSF's badmin: records its arguments, answers like badmin does.
python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$BADMIN_RECORD"
echo "Close/Open ...... done"
"""


@pytest.fixture(scope="module")
def health(alertmanager: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("health-lsf")
    (folder / "nodes.txt").write_text("\n".join(NODES) + "\n")
    process, url = start_health(
        folder,
        fast_policy(circuit_breaker={"max_cluster_fraction": 1.0, "max_unit_fraction": 1.0}),
        ["--alertmanager-url", alertmanager, "--nodes-file", str(folder / "nodes.txt")],
    )
    try:
        yield url
    finally:
        process.stop()


@pytest.fixture
def badmin(tmp_path: Path) -> tuple[dict[str, str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "badmin").write_text(BADMIN)
    (bin_dir / "badmin").chmod(0o755)
    record = tmp_path / "badmin.jsonl"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "BADMIN_RECORD": str(record)}
    return env, record


def lsf_sync(env: dict[str, str], url: str, ledger: Path, *extra: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "fleetsight.cli", "health", "lsf-sync", "--url", url, "--ledger", str(ledger),
         "--json", *extra],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def calls(record: Path) -> list[list[str]]:
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def test_lsf_sync_closes_with_a_comment_and_reopens_only_its_own(
    alertmanager: str, health: str, badmin: tuple[dict[str, str], Path], tmp_path: Path
) -> None:
    env, record = badmin
    ledger = tmp_path / "lsf-ledger.json"
    post_alert(alertmanager, "GPUXidUncorrectable", "lsf02", gpu="0", xid="95")
    wait_state(health, "lsf02", "draining")

    dry = lsf_sync(env, health, ledger, "--dry-run")
    assert dry["commands"] == ["badmin hclose -C 'fleetsight: GPUXidUncorrectable (alertmanager)' lsf02"]
    assert calls(record) == [] and not ledger.exists()

    lsf_sync(env, health, ledger)
    assert calls(record) == [["hclose", "-C", "fleetsight: GPUXidUncorrectable (alertmanager)", "lsf02"]]
    assert lsf_sync(env, health, ledger)["commands"] == []  # already closed: nothing twice

    post_alert(alertmanager, "GPUXidUncorrectable", "lsf02", ends_in=0, gpu="0", xid="95")
    wait_state(health, "lsf02", "healthy")
    lsf_sync(env, health, ledger)
    assert calls(record)[-1] == ["hopen", "lsf02"]
    # lsf03 was never closed by FleetSight (an operator's `badmin hclose`): never reopened
    assert all("lsf03" not in call for call in calls(record))
    assert json.loads(ledger.read_text()) == {}


def test_lsf_sync_reports_an_unreachable_service(badmin: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    env, record = badmin
    result = subprocess.run(
        [sys.executable, "-m", "fleetsight.cli", "health", "lsf-sync", "--url", "http://127.0.0.1:9",
         "--ledger", str(tmp_path / "l.json")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert "cannot read the drain list from http://127.0.0.1:9" in result.stderr
    assert calls(record) == []


def test_lsf_sync_closes_a_burst_in_one_command_per_reason(
    alertmanager: str, health: str, badmin: tuple[dict[str, str], Path], tmp_path: Path
) -> None:
    """Issue 37: what the service decides in a batch, the sync writes in a batch: one hclose for every
    host with the same reason, one hopen for the hosts released together."""
    env, record = badmin
    ledger = tmp_path / "lsf-ledger.json"
    burst = ["lsf01", "lsf03", "lsf04"]
    post_alert(alertmanager, "NVSwitchFatal", burst)
    for node in burst:
        wait_state(health, node, "draining")
    lsf_sync(env, health, ledger)
    assert calls(record) == [["hclose", "-C", "fleetsight: NVSwitchFatal (alertmanager)", *burst]]
    assert json.loads(ledger.read_text()) == dict.fromkeys(burst, "fleetsight: NVSwitchFatal (alertmanager)")
    post_alert(alertmanager, "NVSwitchFatal", burst, ends_in=0)
    for node in burst:
        wait_state(health, node, "healthy")
    lsf_sync(env, health, ledger)
    assert calls(record)[-1] == ["hopen", *burst]
    assert json.loads(ledger.read_text()) == {}
