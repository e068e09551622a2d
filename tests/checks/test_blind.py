"""Blind is not broken (issue 41): a check that could not look is an `unknown` with its reason, never a
failure. The CLI runs real checks against what a misconfigured node really has (no `dcgmi`, nothing on
the exporter's port, a server asking for credentials, plain HTTP where TLS was expected), the results go
to a real checks service, and its /metrics publish `fleetsight_check_unknown` and no
`fleetsight_check_passed` sample for them."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from support import Process, free_port, stopping

FLEETSIGHT = [sys.executable, "-m", "fleetsight.cli"]
TOKEN = "blind-test-results-token-41aa"


class _Handler(http.server.BaseHTTPRequestHandler):
    """A page behind basic auth: every request without credentials gets 401, as dcgm-exporter's
    web-config does."""

    def do_GET(self) -> None:
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="metrics"')
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture(scope="module")
def auth_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def checks_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("checks")
    port = free_port()
    command = [*FLEETSIGHT, "checks", "serve", "--listen", f"127.0.0.1:{port}", "--state-dir", str(folder)]
    env = {**os.environ, "FLEETSIGHT_CHECKS_TOKENS": f"{TOKEN}=results"}
    env.pop("FLEETSIGHT_CHECKS_TOKENS_FILE", None)
    process = Process("checks", [*command, "--cluster", "test"], folder / "checks.log", env)
    process.wait_ready(f"http://127.0.0.1:{port}/-/ready")
    with stopping(process):
        yield f"http://127.0.0.1:{port}"


def run_checks(tmp_path: Path, tools: dict[str, object], checks: list[str], report: str | None = None):
    tools_file = tmp_path / "tools.yml"
    tools_file.write_text(yaml.safe_dump({"tools": tools}))
    command = [*FLEETSIGHT, "checks", "run", "--node", "n0001", "--tools", str(tools_file)]
    for name in checks:
        command += ["--check", name]
    if report:
        command += ["--report", report]
    env = {**os.environ, "FLEETSIGHT_CHECKS_TOKEN": TOKEN}
    env.pop("FLEETSIGHT_CHECKS_TOKEN_FILE", None)
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    results = {r["check"]: r for r in map(json.loads, done.stdout.splitlines())}
    return done, results


def test_the_issue_s_command_gives_two_unknowns_and_no_failure(tmp_path: Path, checks_service: str) -> None:
    """`checks run --check dcgm_diag_r1 --check row_remap` without dcgmi and without a dcgm-exporter:
    two unknowns (tool_missing, unreachable), exit 4, and the service publishes them as blind spots."""
    closed = free_port()  # nothing listens there
    tools = {"dcgmi": ["dcgmi-not-installed-here"], "dcgm_metrics": f"http://127.0.0.1:{closed}/metrics"}
    done, results = run_checks(tmp_path, tools, ["dcgm_diag_r1", "row_remap"], report=checks_service)
    assert done.returncode == 4, done.stderr
    diag, remap = results["dcgm_diag_r1"], results["row_remap"]
    assert (diag["outcome"], diag["reason"], diag["passed"], diag["status"]) == (
        "unknown",
        "tool_missing",
        None,
        "UNKNOWN",
    )
    assert "tool not found: dcgmi-not-installed-here" in diag["summary"]
    assert (remap["outcome"], remap["reason"]) == ("unknown", "unreachable")
    page = httpx.get(f"{checks_service}/metrics").text
    assert (
        'fleetsight_check_unknown{check="dcgm_diag_r1",cluster="test",node="n0001",reason="tool_missing"} 1.0'
        in page
    )
    assert (
        'fleetsight_check_unknown{check="row_remap",cluster="test",node="n0001",reason="unreachable"} 1.0'
        in page
    )
    assert "fleetsight_check_passed{" not in page  # no sample at all: ActiveCheckFailed cannot fire
    stored = httpx.get(f"{checks_service}/v1/results?node=n0001").json()["results"]
    assert {r["check"]: r["outcome"] for r in stored} == {"dcgm_diag_r1": "unknown", "row_remap": "unknown"}


def test_credentials_and_tls_mistakes_are_named(tmp_path: Path, auth_server: str) -> None:
    """401 from the exporter: unauthorised; https towards a plain-HTTP port: tls. Neither is a failure."""
    tools = {
        "dcgm_metrics": f"http://{auth_server}/metrics",
        "node_agent_metrics": f"https://{auth_server}/metrics",
    }
    done, results = run_checks(tmp_path, tools, ["power_brake", "h2d_bandwidth"])
    assert done.returncode == 4, done.stdout + done.stderr
    assert (results["power_brake"]["outcome"], results["power_brake"]["reason"]) == (
        "unknown",
        "unauthorised",
    )
    assert (results["h2d_bandwidth"]["outcome"], results["h2d_bandwidth"]["reason"]) == ("unknown", "tls")


def test_a_real_failure_still_fails_beside_an_unknown(tmp_path: Path, checks_service: str) -> None:
    """A page that shows a pending row remap fails row_remap (exit 1, fleetsight_check_passed 0) while the
    missing dcgmi stays an unknown: blindness never hides a fault that was seen."""
    page = tmp_path / "metrics"
    page.write_text(
        "# TYPE DCGM_FI_DEV_ROW_REMAP_PENDING gauge\n"
        'DCGM_FI_DEV_ROW_REMAP_PENDING{gpu="0",UUID="GPU-0"} 0\n'
        'DCGM_FI_DEV_ROW_REMAP_PENDING{gpu="1",UUID="GPU-1"} 1\n'
        "# TYPE DCGM_FI_DEV_ROW_REMAP_FAILURE gauge\n"
        'DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu="0",UUID="GPU-0"} 0\n'
        'DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu="1",UUID="GPU-1"} 0\n'
    )
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0),
        lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path)),
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        tools = {
            "dcgmi": ["dcgmi-not-installed-here"],
            "dcgm_metrics": f"http://127.0.0.1:{server.server_address[1]}/metrics",
        }
        done, results = run_checks(tmp_path, tools, ["row_remap", "dcgm_diag_r1"], report=checks_service)
    finally:
        server.shutdown()
    assert done.returncode == 1, done.stderr
    assert results["row_remap"]["outcome"] == "failed" and results["row_remap"]["passed"] is False
    assert "reason" not in results["row_remap"]
    assert results["dcgm_diag_r1"]["outcome"] == "unknown"
    metrics = httpx.get(f"{checks_service}/metrics").text
    assert 'fleetsight_check_passed{check="row_remap",cluster="test",node="n0001"} 0.0' in metrics
    assert 'fleetsight_check_unknown{check="row_remap"' not in metrics  # the newer result replaced it


def test_a_tool_missing_behind_a_wrapper_shell_is_tool_missing() -> None:
    """A site's tools file often starts the tool through a shell (`sh -c 'nv-hostengine ...; dcgmi ...'`):
    the shell, not the tool, is what runs, and it exits 127 with "not found" when the tool is absent."""
    from checks import runner
    from checks.catalog import load_catalog

    tools = runner.Tools({"dcgmi": ["sh", "-c", "dcgmi-not-installed-here diag -r 1 -j"]})
    result = runner.run_check(load_catalog()["dcgm_diag_r1"], "n0001", tools)
    assert (result["outcome"], result["reason"]) == ("unknown", "tool_missing")
    assert "not found" in result["summary"]
