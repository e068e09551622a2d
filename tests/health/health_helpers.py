"""Helpers of the health tests: a fast policy, a supervised server process, alerts POSTed through
Alertmanager's API v2, and the health service itself as `fleetsight health serve`. (A module of its own,
not conftest.py: several test folders have a conftest, and `from conftest import` picks whichever was
imported first.)"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from health.component import serve_command
from health.slurm_local import LocalSlurm, missing
from support import free_port, wait_until

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
NODES = [f"n{i:04d}" for i in range(1, 17)]
DRAIN_TOKEN = "test-drain-token-4f1c"
READ_TOKEN = "test-read-token-9a2e"


def fast_policy(**overrides: Any) -> dict[str, Any]:
    """The shipped policy with test-sized times: refresh 0.3 s, clean for 2 s."""
    policy = yaml.safe_load((REPO / "health" / "policy.yml").read_text())
    policy["refresh"] = {"interval": "0.3s", "source_timeout": "2s"}
    policy["hysteresis"] = {"clean_for": "2s", "confirm_for": "0s"}
    policy["circuit_breaker"].update(nodes_per_unit=8, max_cluster_fraction=0.25, max_unit_fraction=0.25)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(policy.get(key), dict):
            policy[key].update(value)
        else:
            policy[key] = value
    return policy


class Process:
    """A server started for the tests; its log is shown when it dies or fails to become ready."""

    def __init__(self, name: str, command: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.name, self.log = name, log
        self.handle = log.open("wb")
        self.popen = subprocess.Popen(
            command, stdout=self.handle, stderr=subprocess.STDOUT, cwd=REPO, env=env or dict(os.environ)
        )

    def wait_ready(self, url: str, timeout: float = 30) -> None:
        def ready() -> bool:
            try:
                return httpx.get(url, timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        self.wait_for(ready, what=f"{self.name} at {url}", timeout=timeout)

    def wait_for(self, predicate: Callable[[], T], what: str, timeout: float = 60) -> T:
        """Poll predicate until it holds, failing at once (with the log) if the process has died."""

        def alive_and_ready() -> T:
            if self.popen.poll() is not None:
                pytest.fail(f"{self.name} exited {self.popen.returncode}:\n{self.log.read_text()[-3000:]}")
            return predicate()

        return wait_until(alive_and_ready, timeout=timeout, what=what)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self.handle.close()


def post_alert(
    am_url: str, name: str, node: str | list[str], ends_in: float | None = 600, **labels: str
) -> None:
    """Fire (or, with ends_in=0, resolve) an alert for one node or several at once (one POST), through
    Alertmanager's real API v2."""
    now = dt.datetime.now(dt.UTC)
    alerts = []
    for each in [node] if isinstance(node, str) else node:
        alert = {
            "labels": {"alertname": name, "node": each, "cluster": "test", "severity": "critical", **labels},
            "annotations": {"summary": f"{name} on {each}", "runbook_url": f"docs/runbooks/{name}.md"},
            "startsAt": (now - dt.timedelta(seconds=1)).isoformat(),
        }
        if ends_in is not None:
            alert["endsAt"] = (now + dt.timedelta(seconds=ends_in)).isoformat()
        alerts.append(alert)
    response = httpx.post(f"{am_url}/api/v2/alerts", json=alerts, timeout=5)
    assert response.status_code == 200, response.text


def start_health(
    folder: Path, policy: dict[str, Any], args: list[str], tokens: str | None = None
) -> tuple[Process, str]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "policy.yml").write_text(yaml.safe_dump(policy))
    port = free_port()
    env = {**os.environ, "FLEETSIGHT_HEALTH_TOKENS": tokens or ""}
    command = serve_command(
        f"127.0.0.1:{port}", folder / "state", policy=folder / "policy.yml", cluster="test", extra=tuple(args)
    )
    process = Process("health", command, folder / "health.log", env)
    url = f"http://127.0.0.1:{port}"
    process.wait_ready(f"{url}/-/ready")
    return process, url


def node_state(url: str, node: str) -> dict[str, Any]:
    response = httpx.get(f"{url}/v1/nodes/{node}", timeout=5)
    assert response.status_code == 200, response.text
    return response.json()


def wait_state(url: str, node: str, state: str, timeout: float = 20) -> dict[str, Any]:
    return wait_until(
        lambda: (item := node_state(url, node))["state"] == state and item,
        timeout=timeout,
        what=f"{node} to become {state}",
    )


@contextlib.contextmanager
def slurm_cluster(
    kind: type[LocalSlurm], nodes: list[str], prefix: str, prepare: Callable[[Path], dict] | None = None
) -> Iterator[LocalSlurm]:
    """A real Slurm (slurmctld, slurmd, slurmrestd) of `kind` for the test; fails loudly when it is not
    installed. Its folder is a world-readable temporary one (slurmrestd runs as nobody, pytest's tmp_path
    is private); prepare(folder) writes what the cluster needs there first and returns its options."""
    why = missing()
    if why:
        pytest.fail(why)
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    cluster = kind(folder, nodes, free_port(), **(prepare(folder) if prepare else {}))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)
