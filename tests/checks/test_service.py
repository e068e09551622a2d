"""The checks service as a process: results in over HTTP, the two gauges out on /metrics, bad results
refused with the reason, a malformed policy refused at start, and the results kept over a restart."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from support import Process, free_port, stopping

FLEETSIGHT = [sys.executable, "-m", "fleetsight.cli"]


def serve(folder: Path, *extra: str) -> tuple[Process, str]:
    port = free_port()
    command = [*FLEETSIGHT, "checks", "serve", "--listen", f"127.0.0.1:{port}", "--state-dir", str(folder)]
    process = Process("checks", [*command, "--cluster", "test", *extra], folder / "checks.log")
    url = f"http://127.0.0.1:{port}"
    process.wait_ready(f"{url}/-/ready")
    return process, url


RESULT = {
    "node": "n0007",
    "check": "dcgm_diag_r3",
    "passed": False,
    "summary": "memtest (GPU 2)",
    "finished": 1e9,
}


def test_results_become_gauges_and_survive_a_restart(tmp_path: Path) -> None:
    process, url = serve(tmp_path)
    with stopping(process):
        assert httpx.post(f"{url}/v1/results", json=[RESULT]).json() == {"recorded": 1}
        older = {**RESULT, "passed": True, "finished": 5e8}
        httpx.post(f"{url}/v1/results", json=[older]).raise_for_status()  # an older result never wins
        page = httpx.get(f"{url}/metrics").text
        assert 'fleetsight_check_passed{check="dcgm_diag_r3",cluster="test",node="n0007"} 0.0' in page
        labels = '{check="dcgm_diag_r3",cluster="test",node="n0007"}'
        assert f"fleetsight_check_last_run_timestamp_seconds{labels} 1e+09" in page
        for bad, why in (
            ({"node": "n1"}, "a result needs node, check, passed, summary, finished"),
            ({**RESULT, "check": "vibes"}, "unknown check 'vibes'"),
            ({**RESULT, "passed": "yes"}, "'passed' must be true/false"),
        ):
            response = httpx.post(f"{url}/v1/results", json=[bad])
            assert response.status_code == 422 and why in response.json()["detail"]
        assert httpx.post(f"{url}/v1/results", json={"node": "x"}).status_code == 422
    process, url = serve(tmp_path)
    with stopping(process):
        assert httpx.get(f"{url}/v1/results?node=n0007").json()["results"][0]["summary"] == "memtest (GPU 2)"


def test_a_policy_naming_an_unknown_check_is_refused_at_start(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yml"
    policy.write_text("after: {PSUFailed: [gemm, power_brake]}\ndefault: []\n")
    command = [*FLEETSIGHT, "checks", "serve", "--state-dir", str(tmp_path), "--policy", str(policy)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "policy PSUFailed: unknown checks gemm" in done.stderr
