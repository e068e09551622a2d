"""Helpers of the log-path tests: the log stack (started from the components' own declarations:
prepare, command, env, ready; but held by the tests, so that a test can stop one server and start it
again, where the stack's supervisor would restart it at once), and the documents the shipper sends to
an ingest pipeline. (A module of its own, not conftest.py: several test folders have a conftest, and
`from conftest import` picks whichever was imported first.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetsight.components import Component
from fleetsight.registry import port_offsets
from fleetsight.settings import Settings
from pipelines.component import kafka_client
from pipelines.kafka_security import ADMIN_USER
from support import free_port_base, port_is_free, wait_until

# Start order: dependencies first (as the supervisor would).
LOG_STACK = (
    "kafka",
    "opensearch",
    "logs-shipper",
    "slack-sink",
    "alertmanager",
    "twin",
    "logs-node",
    "elastalert",
)
STOP_DEADLINE_S = 15.0  # SIGKILL after this, or after the component's own stop_timeout_s if longer
HERE = Path(__file__).resolve().parent
TEST_SCENARIO = HERE / "logs_scenario.yaml"
LOSS_SCENARIO = HERE / "loss_scenario.yaml"
SHIPPER_TIME = "2026-11-22T08:00:00.123Z"
"""When the shipper read the line, in the documents the tests simulate (a day after the lines' own)."""


@dataclass
class LogStack:
    settings: Settings
    components: dict[str, Component]
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def search_url(self) -> str:
        return self.settings.url("opensearch")

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.settings.port('kafka')}"

    def kafka(self, user: str = ADMIN_USER) -> dict[str, str]:
        """confluent-kafka settings to reach the stack's broker as user (SASL_SSL, SCRAM-SHA-512)."""
        return kafka_client(self.settings, user)

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "FLEETSIGHT_RUN_DIR": str(self.settings.run_dir),
            "FLEETSIGHT_PORT_BASE": str(self.settings.port_base),
            "FLEETSIGHT_CLUSTER": self.settings.cluster,
        }

    def start(self, name: str) -> None:
        component = self.components[name]
        reason = component.missing(self.settings)
        if reason:
            pytest.fail(f"{name} cannot run here: {reason}")
        component.prepare(self.settings)
        log = self.settings.log_file(name)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            self.processes[name] = subprocess.Popen(
                component.command(self.settings),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**self.env(), **component.env(self.settings)},
                cwd=self.settings.repo_root,
                start_new_session=True,
            )
        process = self.processes[name]

        def ready() -> bool:
            if process.poll() is not None:
                text = log.read_text(errors="replace")
                errors = [line for line in text.splitlines() if "ERROR" in line or "Exception" in line]
                tail = "\n".join(errors[:10]) + "\n...\n" + text[-1500:]
                pytest.fail(f"{name} exited with {process.returncode} before it was ready:\n{tail}")
            return component.ready(self.settings)

        wait_until(ready, timeout=component.ready_timeout_s + 60, interval=0.5, what=f"{name} to be ready")

    def stop(self, name: str, deadline_s: float | None = None) -> float:
        """SIGTERM (to OpenSearch's JVM itself, not runuser), then SIGKILL after the deadline (by default
        the component's own stop timeout, at least STOP_DEADLINE_S); the seconds it took."""
        if deadline_s is None:
            deadline_s = max(STOP_DEADLINE_S, self.components[name].stop_timeout_s)
        process = self.processes.pop(name)
        began = time.monotonic()
        targets = children(process.pid) if name == "opensearch" else []
        for pid in targets or [process.pid]:
            with _quiet():
                os.kill(pid, signal.SIGTERM)
        try:
            process.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            with _quiet():
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        with _quiet():
            os.killpg(process.pid, signal.SIGKILL)  # anything left in its group
        return time.monotonic() - began

    def stop_all(self) -> None:
        for name in reversed(LOG_STACK):
            if name in self.processes:
                self.stop(name)

    def count(self, index: str, query: dict | None = None) -> int:
        httpx.post(f"{self.search_url}/{index}/_refresh", timeout=30)
        body = {"query": query} if query else None
        response = httpx.post(
            f"{self.search_url}/{index}/_count?ignore_unavailable=true&allow_no_indices=true",
            json=body,
            timeout=30,
        )
        response.raise_for_status()
        return response.json()["count"]


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, value: object, traceback: object) -> bool:
        return kind is not None and issubclass(kind, ProcessLookupError | PermissionError)


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def twin_command(settings: Settings, scenario: Path, speed: str = "10") -> list[str]:
    return [
        sys.executable, "-m", "fleetsight.cli", "twin", "run", "--scenario", str(scenario),
        "--out", str(settings.data_dir("twin")), "--speed", speed, "--serve",
        "--listen", f"127.0.0.1:{settings.port('twin')}",
    ]  # fmt: skip


def port_base() -> int:
    """FLEETSIGHT_PORT_BASE when all its ports are free (people sharing a machine keep to their own
    range), else any free range."""
    wanted = os.environ.get("FLEETSIGHT_PORT_BASE")
    if wanted and all(port_is_free(int(wanted) + offset) for offset in port_offsets().values()):
        return int(wanted)
    return free_port_base()


def shipper_docs(log_class: str, lines: list[tuple[str, str]], node: str = "n0003") -> list[dict[str, Any]]:
    """`_simulate` documents for lines (text, file path; "" = the class's usual file), as the shipper
    sends them: the raw line in `message`, the node, the line's origin as id, the time it was read."""
    docs = []
    for offset, (line, path) in enumerate(lines):
        origin = f"{node}:{path}:{offset}"
        source = {
            "@timestamp": SHIPPER_TIME,
            "message": line,
            "host": {"name": node},
            "log": {"file": {"path": path or f"/var/log/{log_class}.log"}, "offset": offset},
            "event": {"id": origin},
            "fleetsight": {"cluster": "test"},
        }
        docs.append({"_id": origin, "_source": source})
    return docs


def impstats_reports(stats_file: Path, name: str) -> list[dict[str, Any]]:
    """rsyslog's impstats reports of one counter set (an action's name, a dyn_stats bucket), oldest first;
    each line of the file is the time, then the report's JSON."""
    reports = []
    for line in stats_file.read_text().splitlines() if stats_file.exists() else []:
        try:
            report = json.loads(line[line.index("{") :])
        except ValueError:
            continue
        if report.get("name") == name:
            reports.append(report)
    return reports
