"""The checks service as a process: results in over HTTP (with a token of scope `results`), the two
gauges out on /metrics, bad results refused with the reason, a post without the right token refused, a
malformed policy or a missing write token refused at start, and the results kept over a restart."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from support import Process, free_port, stopping

FLEETSIGHT = [sys.executable, "-m", "fleetsight.cli"]
WRITE_TOKEN = "checks-test-results-token-5e1a"
READ_TOKEN = "checks-test-read-token-93bd"
TOKENS = f"{WRITE_TOKEN}=results;{READ_TOKEN}=read"
WRITER = {"Authorization": f"Bearer {WRITE_TOKEN}"}


def serve(folder: Path, *extra: str, tokens: str = TOKENS) -> tuple[Process, str]:
    port = free_port()
    command = [*FLEETSIGHT, "checks", "serve", "--listen", f"127.0.0.1:{port}", "--state-dir", str(folder)]
    env = {**os.environ, "FLEETSIGHT_CHECKS_TOKENS": tokens}
    env.pop("FLEETSIGHT_CHECKS_TOKENS_FILE", None)
    process = Process("checks", [*command, "--cluster", "test", *extra], folder / "checks.log", env)
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

# what the service keeps of a poster's `passed` alone: the outcome and the status word beside it
STORED = {**RESULT, "outcome": "failed", "status": "ERR"}


def test_results_become_gauges_and_survive_a_restart(tmp_path: Path) -> None:
    process, url = serve(tmp_path)
    with stopping(process):
        assert httpx.post(f"{url}/v1/results", json=[RESULT], headers=WRITER).json() == {"recorded": 1}
        older = {**RESULT, "passed": True, "finished": 5e8}
        httpx.post(
            f"{url}/v1/results", json=[older], headers=WRITER
        ).raise_for_status()  # an older result never wins
        page = httpx.get(f"{url}/metrics").text
        assert 'fleetsight_check_passed{check="dcgm_diag_r3",cluster="test",node="n0007"} 0.0' in page
        labels = '{check="dcgm_diag_r3",cluster="test",node="n0007"}'
        assert f"fleetsight_check_last_run_timestamp_seconds{labels} 1e+09" in page
        for bad, why in (
            ({"node": "n1"}, "a result needs node, check, summary, finished"),
            ({**RESULT, "check": "vibes"}, "unknown check 'vibes'"),
            ({**RESULT, "passed": "yes"}, "'outcome' (passed, failed, unknown) or 'passed' true/false"),
            ({**RESULT, "outcome": "maybe"}, "'outcome' must be one of passed, failed, unknown"),
            ({**RESULT, "outcome": "passed"}, "'passed' False contradicts 'outcome' 'passed'"),
            ({**RESULT, "outcome": "unknown", "passed": None}, "an unknown needs a 'reason'"),
        ):
            response = httpx.post(f"{url}/v1/results", json=[bad], headers=WRITER)
            assert response.status_code == 422 and why in response.json()["detail"]
        assert httpx.post(f"{url}/v1/results", json={"node": "x"}, headers=WRITER).status_code == 422
    process, url = serve(tmp_path)
    with stopping(process):
        assert httpx.get(f"{url}/v1/results?node=n0007").json()["results"][0]["summary"] == "memtest (GPU 2)"


def test_a_policy_naming_an_unknown_check_is_refused_at_start(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yml"
    policy.write_text("after: {PSUFailed: [gemm, power_brake]}\ndefault: []\n")
    command = [*FLEETSIGHT, "checks", "serve", "--state-dir", str(tmp_path), "--policy", str(policy)]
    done = subprocess.run([*command, "--open-writes"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "policy PSUFailed: unknown checks gemm" in done.stderr


def test_a_post_needs_a_token_with_scope_results(tmp_path: Path) -> None:
    """A PASS resumes a drained node (the validation gate): no token 401, a read token 403, the write
    token 200; reads stay open, and --token-reads closes them to a token without `read`."""
    process, url = serve(tmp_path)
    passed = {**RESULT, "passed": True, "summary": "forged"}
    with stopping(process):
        response = httpx.post(f"{url}/v1/results", json=[passed])
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert "scope 'results'" in response.json()["detail"]
        wrong = httpx.post(f"{url}/v1/results", json=[passed], headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        reader = {"Authorization": f"Bearer {READ_TOKEN}"}
        response = httpx.post(f"{url}/v1/results", json=[passed], headers=reader)
        assert response.status_code == 403 and "lacks scope 'results'" in response.json()["detail"]
        assert httpx.get(f"{url}/v1/results").json() == {"results": []}  # nothing got in
        assert httpx.post(f"{url}/v1/results", json=[RESULT], headers=WRITER).json() == {"recorded": 1}
        assert httpx.get(f"{url}/v1/results?node=n0007").json()["results"] == [STORED]  # open read
        assert httpx.get(f"{url}/metrics").status_code == 200
    process, url = serve(tmp_path, "--token-reads")
    with stopping(process):
        assert httpx.get(f"{url}/v1/results").status_code == 401
        assert httpx.get(f"{url}/metrics").status_code == 401
        assert httpx.get(f"{url}/v1/results", headers=WRITER).status_code == 403
        reader = {"Authorization": f"Bearer {READ_TOKEN}"}
        assert httpx.get(f"{url}/v1/results", headers=reader).json()["results"] == [STORED]


def test_no_write_token_is_refused_at_start_unless_writes_are_opened(tmp_path: Path) -> None:
    command = [*FLEETSIGHT, "checks", "serve", "--listen", f"127.0.0.1:{free_port()}"]
    command += ["--state-dir", str(tmp_path)]
    env = {**os.environ, "FLEETSIGHT_CHECKS_TOKENS": f"{READ_TOKEN}=read"}
    env.pop("FLEETSIGHT_CHECKS_TOKENS_FILE", None)
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2 and "no token with scope `results`" in done.stderr
    assert "--open-writes" in done.stderr
    process, url = serve(tmp_path, "--open-writes", tokens="")
    with stopping(process):
        assert httpx.post(f"{url}/v1/results", json=[RESULT]).json() == {"recorded": 1}
    assert "event=open_writes" in (tmp_path / "checks.log").read_text()


def test_the_runner_sends_its_token_from_the_environment_or_a_file(tmp_path: Path) -> None:
    from checks import runner

    assert runner.client_token({}) is None
    assert runner.client_token({"FLEETSIGHT_CHECKS_TOKEN": " tok \n"}) == "tok"
    (tmp_path / "token").write_text(WRITE_TOKEN + "\n")
    env = {"FLEETSIGHT_CHECKS_TOKEN_FILE": str(tmp_path / "token"), "FLEETSIGHT_CHECKS_TOKEN": "other"}
    assert runner.client_token(env) == WRITE_TOKEN  # the file wins
    missing = {"FLEETSIGHT_CHECKS_TOKEN_FILE": str(tmp_path / "absent")}
    try:
        runner.client_token(missing)
    except ValueError as exc:
        assert "FLEETSIGHT_CHECKS_TOKEN_FILE" in str(exc) and "cannot read" in str(exc)
    else:
        raise AssertionError("an unreadable token file must be an error")
    (tmp_path / "service").mkdir()
    process, url = serve(tmp_path / "service")
    with stopping(process):
        run = [*FLEETSIGHT, "checks", "run", "--node", "n0001", "--check", "row_remap", "--report", url]
        bare = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSIGHT_CHECKS_TOKEN")}
        done = subprocess.run(run, capture_output=True, text=True, timeout=60, env=bare)
        assert done.returncode == 3 and "401" in done.stderr
        done = subprocess.run(run, capture_output=True, text=True, timeout=60, env={**bare, **missing})
        assert done.returncode == 3 and "cannot read" in done.stderr
        with_file = {**bare, "FLEETSIGHT_CHECKS_TOKEN_FILE": str(tmp_path / "token")}
        done = subprocess.run(run, capture_output=True, text=True, timeout=60, env=with_file)
        assert done.returncode in (0, 1, 4), done.stderr  # the check's own outcome: posted either way
        assert httpx.get(f"{url}/v1/results?node=n0001").json()["results"][0]["check"] == "row_remap"
