"""Fuzz the FleetSight HTTP APIs from their OpenAPI schemas, longer than the test suite does, and print
the counts per API: requests sent, 5xx answers, answers that break their schema, and the status codes.

    .venv/bin/python bench/api_fuzz.py [--examples 200] [--seed N]

Starts a health service (three static nodes, a token with every scope), an anomaly service (token
reads; its Prometheus does not exist, so it serves with its source down) and the chatbot (token reads
and asks, no rate limit, a Slack signing secret; answers from the repository's docs) on loopback, fuzzes
each with tests/api_fuzz.py (schemathesis + hypothesis), stops them. Exits 1 if any API had a 5xx or a schema
violation, and prints the first failures with a curl command each.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from api_fuzz import fuzz  # noqa: E402 - after the path is set

from fleetsight.procs import free_loopback_port  # noqa: E402
from health.component import serve_command  # noqa: E402

TOKEN = "bench-fuzz-token-0000"


def start(command: list[str], env: dict[str, str], log: Path, ready_url: str) -> subprocess.Popen:
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{command[3:5]} exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(ready_url, timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    process.kill()
    raise SystemExit(f"not ready: {ready_url}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--examples", type=int, default=200, help="drawn requests per operation")
    parser.add_argument("--seed", type=int, default=None, help="fixed draws (default: random each run)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="api-fuzz-"))
    (folder / "nodes.txt").write_text("n0001\nn0002\nn0003\n")
    health_port, anomaly_port, chatbot_port = free_loopback_port(), free_loopback_port(), free_loopback_port()
    env = {
        **os.environ,
        "FLEETSIGHT_HEALTH_TOKENS": f"{TOKEN}=read,drain,override",
        "FLEETSIGHT_ANOMALY_TOKENS": f"{TOKEN}=read",
        "FLEETSIGHT_CHATBOT_TOKENS": f"{TOKEN}=read,ask",
        "FLEETSIGHT_SLACK_SIGNING_SECRET": "bench-fuzz-slack-secret",
    }
    env.pop("FLEETSIGHT_CHATBOT_LLM_URL", None)
    health_cmd = serve_command(
        f"127.0.0.1:{health_port}", folder / "state", extra=("--nodes-file", str(folder / "nodes.txt"))
    )
    anomaly_cmd = [
        sys.executable, "-m", "fleetsight.cli", "anomaly", "serve", "--token-reads",
        "--prometheus-url", f"http://127.0.0.1:{free_loopback_port()}",
        "--listen", f"127.0.0.1:{anomaly_port}",
    ]  # fmt: skip
    chatbot_cmd = [
        sys.executable, "-m", "fleetsight.cli", "chatbot", "serve", "--listen", f"127.0.0.1:{chatbot_port}",
        "--token-reads", "--token-asks", "--rate-limit", "off",
    ]  # fmt: skip
    servers = {
        "health": (health_cmd, f"http://127.0.0.1:{health_port}", "/-/ready"),
        "anomaly": (anomaly_cmd, f"http://127.0.0.1:{anomaly_port}", "/healthz"),
        "chatbot": (chatbot_cmd, f"http://127.0.0.1:{chatbot_port}", "/healthz"),
    }
    failed = False
    for name, (command, url, ready) in servers.items():
        process = start(command, env, folder / f"{name}.log", url + ready)
        try:
            started = time.monotonic()
            report = fuzz(
                f"{url}/openapi.json", {"Authorization": f"Bearer {TOKEN}"}, args.examples, args.seed
            )
        finally:
            process.terminate()
            process.wait(timeout=20)
        print(f"{report.line(name)}; {time.monotonic() - started:.0f} s")
        for failure in report.failures:
            print("  " + failure.replace("\n", "\n    "))
        failed |= bool(report.server_errors or report.schema_violations)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
