"""Helpers of the health tests: a fast policy, alerts POSTed through Alertmanager's API v2, a real Slurm,
and the health service itself as `fleetsight health serve` (a supervised process: tests/support.py). (A
module of its own, not conftest.py: several test folders have a conftest, and `from conftest import`
picks whichever was imported first.)"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from health.component import serve_command
from health.model import SchedulerView
from health.policy import Policy
from health.slurm_local import LocalSlurm, missing
from health.sources import Sources
from support import Process, free_port, stopping, wait_until

REPO = Path(__file__).resolve().parents[2]
NODES = [f"n{i:04d}" for i in range(1, 17)]
DRAIN_TOKEN = "test-drain-token-4f1c"
READ_TOKEN = "test-read-token-9a2e"
REAL_API = "http://slurmrestd/slurm/v0.0.38"  # 22.05's newest plugin; the host part is ignored on a socket


def fast_policy(**overrides: Any) -> dict[str, Any]:
    """The shipped policy with test-sized times: refresh 0.3 s, clean for 2 s, and a reconcile sweep every
    0.5 s: the tests that post alerts to an Alertmanager with no webhook to the service see them through
    the sweep (test_events.py covers the webhook itself, with the sweep at its minutes). Sources get 10 s
    to answer: a real slurmrestd on a busy 2-core CI machine took more than 2 s, and the service then
    never learnt its nodes."""
    policy = yaml.safe_load((REPO / "health" / "policy.yml").read_text())
    policy["refresh"] = {
        "interval": "0.3s",
        "source_timeout": "10s",
        "reconcile": "0.5s",
        "batch": "0.05s",
        "scheduler": "0.3s",
    }
    policy["hysteresis"] = {"clean_for": "2s", "confirm_for": "0s"}
    policy["circuit_breaker"].update(nodes_per_unit=8, max_cluster_fraction=0.25, max_unit_fraction=0.25)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(policy.get(key), dict):
            policy[key].update(value)
        else:
            policy[key] = value
    return policy


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
    folder: Path,
    policy: dict[str, Any],
    args: list[str],
    tokens: str | None = None,
    env: dict[str, str] | None = None,
    port: int | None = None,
) -> tuple[Process, str]:
    """`fleetsight health serve` with this policy (folder/policy.yml) once ready; env: more variables;
    port: one chosen beforehand (an Alertmanager's webhook already points at it)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "policy.yml").write_text(yaml.safe_dump(policy))
    port = port or free_port()
    env = {**os.environ, **(env or {}), "FLEETSIGHT_HEALTH_TOKENS": tokens or ""}
    command = serve_command(
        f"127.0.0.1:{port}", folder / "state", policy=folder / "policy.yml", cluster="test", extra=tuple(args)
    )
    process = Process("health", command, folder / "health.log", env)
    url = f"http://127.0.0.1:{port}"
    process.wait_ready(f"{url}/-/ready")
    return process, url


def start_slurm_health(
    folder: Path, alertmanager: str, slurm: LocalSlurm, env: dict[str, str] | None = None
) -> tuple[Process, str]:
    """start_health reading Alertmanager and the real slurmrestd (REAL_API over its socket); its breaker
    lets every node go."""
    return start_health(
        folder,
        fast_policy(circuit_breaker={"max_cluster_fraction": 1.0, "max_unit_fraction": 1.0}),
        [
            "--alertmanager-url",
            alertmanager,
            "--scheduler-url",
            REAL_API,
            "--scheduler-socket",
            str(slurm.rest_socket),
        ],
        env=env,
    )


@contextlib.contextmanager
def health_server(*start: Any, **options: Any) -> Iterator[str]:
    """The health service of start_health (the same arguments), stopped on leaving."""
    process, url = start_health(*start, **options)
    with stopping(process):
        yield url


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


def scheduler_views(url: str, socket: Path | str | None = None) -> dict[str, SchedulerView]:
    """What the health service makes of a slurmrestd's /jobs and /nodes: its own parser, over HTTP."""
    sources = Sources(Policy(), scheduler_url=url, scheduler_socket=str(socket) if socket else None)
    try:
        result = next(r for r in sources.collect(time.time()) if r.name == "scheduler")
    finally:
        sources.close()
    assert result.ok, result.error
    return result.scheduler
