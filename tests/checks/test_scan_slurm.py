"""The memory scan plan end to end on a real Slurm 22.05: `fleetsight checks slurm-cycle` as an operator's
timer runs it, the checks service with a `scans:` policy, and the twin's dcgmi stand-in (silent HBM
corruption on one node, dcgmi missing on another). Each pass scans the never-scanned idle nodes, one per
leaf, never under a user's job; a node without dcgmi is no scan and not retried at once; the failed memtest
counts as a scan; coverage and why-it-waits come out of `fleetsight checks scan-plan`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fleetsight.settings import REPO_ROOT
from health.slurm_local import LocalSlurm, missing
from support import Process, free_port, stopping, wait_until

FLEETSIGHT = [sys.executable, "-m", "fleetsight.cli"]
NODES = ["n0001", "n0002", "n0003", "n0004"]
LEAVES = {"n0001": "leaf-a", "n0002": "leaf-a", "n0003": "leaf-b", "n0004": "leaf-b"}
TOKEN = "scan-slurm-test-results-token-4b1c"
CHECK = "dcgm_diag_r4"


@pytest.fixture(scope="module")
def world() -> Iterator[dict[str, Any]]:
    why = missing()
    if why:
        pytest.fail(why)
    folder = Path(tempfile.mkdtemp(prefix="fleetsight-test-scans-"))  # slurmrestd (nobody) must read it
    slurm = LocalSlurm(folder, NODES, free_port())
    slurm.start()
    work = folder / "checks"
    work.mkdir()
    faults = work / "faults.yml"
    faults.write_text(yaml.safe_dump({
        "n0003": [{"kind": "check_tool_missing", "tool": "dcgmi"}],
        "n0004": [{"kind": "hbm_silent_corruption", "gpu": 2}],
    }))  # fmt: skip
    stand_in = [sys.executable, "-m", "twin.checks", "--faults", str(faults), "--node", "{node}", "dcgmi"]
    (work / "tools.yml").write_text(yaml.safe_dump({"tools": {"dcgmi": stand_in}}))
    (work / "leaves.yml").write_text(yaml.safe_dump(LEAVES))
    scans = {"memory": {"check": CHECK, "every_days": 30, "rescan_after_days": 20, "budget": 2}}
    (work / "policy.yml").write_text(yaml.safe_dump({"after": {}, "default": [], "scans": scans}))
    port = free_port()
    serve = [*FLEETSIGHT, "checks", "serve", "--listen", f"127.0.0.1:{port}", "--state-dir", str(work)]
    serve += ["--policy", str(work / "policy.yml"), "--cluster", "test"]
    service = Process(
        "checks", serve, work / "checks.log", {**os.environ, "FLEETSIGHT_CHECKS_TOKENS": f"{TOKEN}=results"}
    )
    env = {
        **slurm.env,
        "PYTHONPATH": str(REPO_ROOT),
        "FLEETSIGHT_CHECKS_TOKEN": TOKEN,
    }  # the jobs: twin.checks
    try:
        with stopping(service):
            url = f"http://127.0.0.1:{port}"
            service.wait_ready(f"{url}/-/ready")
            yield {"url": url, "work": work, "env": env, "slurm": slurm}
    finally:
        slurm.stop()
        shutil.rmtree(folder, ignore_errors=True)


def cycle(world: dict[str, Any]) -> dict[str, Any]:
    work = world["work"]
    command = [*FLEETSIGHT, "checks", "slurm-cycle", "--checks-url", world["url"], "--budget", "3"]
    command += ["--leaf-map", str(work / "leaves.yml"), "--tools", str(work / "tools.yml")]
    command += ["--output-dir", str(work)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=world["env"], check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def scan_results(url: str) -> dict[str, str]:
    items = httpx.get(f"{url}/v1/results", timeout=5).json()["results"]
    return {r["node"]: r["outcome"] for r in items if r["check"] == CHECK}


def no_check_jobs(world: dict[str, Any]) -> bool:
    out = subprocess.run(
        ["squeue", "-h", "-o", "%j"], env=world["env"], capture_output=True, text=True
    ).stdout
    return "fleetsight-check:" not in out


def states(report: dict[str, Any]) -> dict[str, str]:
    return {node: row["state"] for node, row in report["scans"]["memory"].items()}


def test_each_pass_scans_the_idle_never_scanned_nodes_and_reports_coverage(world: dict[str, Any]) -> None:
    user = subprocess.run(
        ["sbatch", "--parsable", "--nodelist=n0001", "--exclusive", "--job-name=training",
         f"--output={world['work']}/%j.out", "--wrap", "sleep 600"],
        env=world["env"], capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    try:
        wait_until(lambda: running(world, "training"), timeout=20, what="the user job to run")
        first = cycle(world)
        assert states(first) == {
            "n0001": "not_idle",
            "n0002": "started",
            "n0003": "started",
            "n0004": "leaf_busy",
        }
        assert first["scans"]["memory"]["n0004"]["why"] == "leaf busy: leaf-b"
        wait_until(
            lambda: set(scan_results(world["url"])) >= {"n0002", "n0003"}, timeout=60, what="two scans"
        )
        wait_until(lambda: no_check_jobs(world), timeout=30, what="the scan jobs to leave the queue")
        assert scan_results(world["url"]) == {"n0002": "passed", "n0003": "unknown"}  # dcgmi missing on n0003
        second = cycle(world)
        assert states(second) == {
            "n0001": "not_idle",
            "n0002": "not_due",
            "n0003": "tool_missing",
            "n0004": "started",
        }
        wait_until(lambda: "n0004" in scan_results(world["url"]), timeout=60, what="n0004's scan")
        assert scan_results(world["url"])["n0004"] == "failed"  # memtest finds the silent corruption
        wait_until(lambda: no_check_jobs(world), timeout=30, what="n0004's scan job to leave the queue")
        assert "n0001" not in scan_results(world["url"])  # never under the user's job
        third = cycle(world)
        assert states(third)["n0004"] == "not_due"  # a failed scan is a scan
    finally:
        subprocess.run(["scancel", user], env=world["env"], check=False)
    [view] = httpx.get(f"{world['url']}/v1/scans", timeout=5).json()["scans"]
    assert (view["nodes"], view["covered"], view["overdue"]) == (4, 2, [])  # n0002 passed, n0004 failed
    shown = subprocess.run(
        [*FLEETSIGHT, "checks", "scan-plan", "--checks-url", world["url"]],
        capture_output=True, text=True, timeout=60, check=False,
    ).stdout  # fmt: skip
    assert "coverage 50.0 % (2 of 4 nodes), 0 overdue" in shown
    assert "last try could not run dcgm_diag_r4 (tool_missing)" in shown


def running(world: dict[str, Any], name: str) -> bool:
    out = subprocess.run(
        ["squeue", "-h", "-o", "%j|%T"], env=world["env"], capture_output=True, text=True
    ).stdout
    return f"{name}|RUNNING" in out
