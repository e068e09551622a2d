"""The health pair on the local stack, as the game day runs it: the real components (health/component.py)
under the real supervisor's spawn and readiness code: `health-lease` (etcd and kube-apiserver on
loopback), `health` made health-a by ``paired_health`` and `health-b`. One leads, one follows; an
Alertmanager webhook sent to the follower is forwarded and decided by the leader, whose identity the
event carries; SIGKILL of the leader's process group (no hand-over) and the follower takes the Lease and
names itself in what it decides next. No Alertmanager, Prometheus or twin runs: the replicas start and
serve without them (their sources fail and say so), and the webhook is posted as Alertmanager posts it."""

from __future__ import annotations

import datetime as dt
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetsight.components import Component
from fleetsight.settings import Settings
from fleetsight.supervisor import Supervisor
from health.component import COMPONENTS, election_args, events_token_file, paired_health
from support import free_port_base, wait_until

EVENTS_TOKEN = "local-pair-events-token-5be0"
TAKEOVER_S = 60  # the Lease runs 10 s; the rest is room for a loaded 2-core machine


def component(name: str) -> Component:
    return next(c for c in COMPONENTS if c.name == name)


def start(supervisor: Supervisor, item: Component) -> None:
    """The supervisor's own start of one component, failing with its log when it is not ready."""
    why = item.missing(supervisor.settings)
    if why:
        pytest.fail(f"{item.name}: {why}")
    supervisor.spawn(item)
    if not supervisor.wait_ready(item):
        log = supervisor.settings.log_file(item.name).read_text()[-3000:]
        pytest.fail(f"{item.name}: {supervisor.states[item.name].detail}\n{log}")


@pytest.fixture
def pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Supervisor, Settings]]:
    monkeypatch.setenv("FLEETSIGHT_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("FLEETSIGHT_PORT_BASE", str(free_port_base()))
    settings = Settings()
    settings.run_dir.mkdir(parents=True)
    token = events_token_file(settings)  # what alerting/component.py writes for the stack
    token.parent.mkdir(parents=True, exist_ok=True)
    token.write_text(EVENTS_TOKEN + "\n")
    components = [component("health-lease"), paired_health(component("health")), component("health-b")]
    supervisor = Supervisor(settings, components)
    try:
        for item in components:
            start(supervisor, item)
        yield supervisor, settings
    finally:
        supervisor.stop_all()


def status(url: str) -> dict[str, Any]:
    try:
        return httpx.get(f"{url}/v1/status", timeout=5).json()
    except httpx.HTTPError:
        return {}


def webhook(url: str, node: str) -> httpx.Response:
    """A firing alert for node as Alertmanager's webhook (version 4) posts it."""
    alert = {
        "status": "firing",
        "labels": {"alertname": "GPUThermalThrottling", "node": node, "gpu": "2", "severity": "warning"},
        "annotations": {"summary": f"GPU 2 of {node} throttles"},
        "startsAt": dt.datetime.now(dt.UTC).isoformat(),
    }
    body = {"version": "4", "status": "firing", "receiver": "health", "alerts": [alert]}
    headers = {"Authorization": f"Bearer {EVENTS_TOKEN}"}
    return httpx.post(f"{url}/v1/events/alertmanager", json=body, headers=headers, timeout=15)


def decision(url: str, node: str) -> dict[str, Any] | None:
    events = httpx.get(f"{url}/v1/events", params={"node": node}, timeout=5).json()["events"]
    return next((e for e in events if e["to"] == "degraded"), None)


def test_one_leader_forwards_and_the_follower_takes_over(pair: tuple[Supervisor, Settings]) -> None:
    supervisor, settings = pair
    url_a, url_b = settings.url("health"), settings.url("health_b")
    a, b = status(url_a), status(url_b)
    assert (a["role"], a["identity"], b["role"], b["identity"]) == (
        "leader",
        "health-a",
        "follower",
        "health-b",
    )
    assert b["leader"]["holder"] == "health-a" and b["leader"]["leader_url"] == url_a

    answer = webhook(url_b, "p01")  # to the follower: forwarded to the leader
    assert answer.status_code == 202 and answer.headers["X-FleetSight-Role"] == "follower", answer.text
    event = wait_until(lambda: decision(url_a, "p01"), timeout=20, what="health-a deciding p01")
    assert event["replica"] == "health-a", event
    copied = wait_until(lambda: decision(url_b, "p01"), timeout=20, what="health-b's copy of p01")
    assert copied == event  # the follower shows the leader's decision; it made none of its own

    killed = time.monotonic()
    os.killpg(supervisor.processes["health"].pid, signal.SIGKILL)  # a crash: the Lease is not handed over
    wait_until(lambda: status(url_b).get("role") == "leader", timeout=TAKEOVER_S, what="health-b leading")
    print(f"\ntakeover: {time.monotonic() - killed:.1f} s after SIGKILL of health-a")
    assert status(url_b)["leader"]["holder"] == "health-b"

    assert webhook(url_b, "p02").headers["X-FleetSight-Role"] == "leader"
    later = wait_until(lambda: decision(url_b, "p02"), timeout=20, what="health-b deciding p02")
    assert later["replica"] == "health-b", later
    assert decision(url_b, "p01") == event  # the takeover started from the copy: p01 not decided again
    logged = [line for line in logs(settings, "health-b") if "event=state_change node=p02" in line]
    assert logged and logged[0].endswith("replica=health-b"), logged
    assert any(line.endswith("replica=health-a") for line in logs(settings, "health") if "node=p01" in line)


def logs(settings: Settings, name: str) -> list[str]:
    return settings.log_file(name).read_text().splitlines()


def test_the_stack_health_joins_no_election_unless_paired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fleetsight up` (no health-b) runs the one health service as before; paired_health adds the
    election as health-a, once, and starts after health-lease."""
    monkeypatch.setenv("FLEETSIGHT_RUN_DIR", str(tmp_path))
    settings = Settings()
    alone = component("health")
    assert not any(arg.startswith("--leader-election") for arg in alone.command(settings))
    paired = paired_health(paired_health(alone))
    assert paired.command(settings) == [*alone.command(settings), *election_args(settings, "health-a")]
    assert paired.depends_on == (*alone.depends_on, "health-lease")
    assert ("--leader-election-url", settings.url("health_b")) == election_args(settings, "health-b")[6:8]
