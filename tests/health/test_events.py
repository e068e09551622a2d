"""Event-driven health (issue 37): a real Alertmanager with the shipped `fleetsight-health` webhook
receiver notifies the service, which re-decides only the nodes named, with the reconcile sweep far off
(10 min) so that only the events can have done it; the anomaly service's flag and clear events; the
webhook's token; and the sweep repairing (and counting) what no event told it."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from health_helpers import DRAIN_TOKEN, REPO, fast_policy, node_state, post_alert, start_health, wait_state

from fleetsight.components import http_ok
from support import (
    alertmanager_server,
    free_port,
    prometheus_process,
    prometheus_server,
    stopping,
    wait_until,
)

NODES = [f"ev{i:02d}" for i in range(1, 9)]
EVENTS_TOKEN = "test-events-token-77b1"


def metric(url: str, name: str, labels: str = "") -> float:
    """One sample of the service's /metrics (0 when the series is absent)."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    found = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def webhook_alertmanager(folder: Path, health_port: int, token_file: Path) -> Iterator[str]:
    """A real Alertmanager routing every alert to the shipped health receiver, pointed at this port."""
    shipped = yaml.safe_load((REPO / "alerting" / "alertmanager.yml").read_text())
    [receiver] = [r for r in shipped["receivers"] if r["name"] == "fleetsight-health"]
    [route] = [r for r in shipped["route"]["routes"] if r.get("receiver") == "fleetsight-health"]
    [webhook] = receiver["webhook_configs"]
    webhook["url"] = f"http://127.0.0.1:{health_port}/v1/events/alertmanager"
    webhook["http_config"]["authorization"]["credentials_file"] = str(token_file)
    config = {
        "route": {"receiver": "null", "routes": [{**route, "group_by": ["alertname", "node"]}]},
        "receivers": [{"name": "null"}, receiver],
    }
    folder.mkdir(parents=True, exist_ok=True)
    with alertmanager_server(folder, config, "alertmanager-webhook") as url:
        yield url


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(Alertmanager URL, health URL): the service reads the Alertmanager only in its 10-minute sweep."""
    folder = tmp_path_factory.mktemp("health-events")
    token_file = folder / "health_events_token"
    token_file.write_text(EVENTS_TOKEN + "\n")
    (folder / "nodes.txt").write_text("\n".join(NODES) + "\n")
    port = free_port()
    for am_url in webhook_alertmanager(folder / "am", port, token_file):
        policy = fast_policy(refresh={"interval": "0.3s", "source_timeout": "2s", "reconcile": "10m"})
        args = ["--alertmanager-url", am_url, "--nodes-file", str(folder / "nodes.txt")]
        args += ["--events-token-file", str(token_file)]
        process, url = start_health(
            folder / "health", policy, args, tokens=f"{DRAIN_TOKEN}=read,drain", port=port
        )
        with stopping(process):
            yield am_url, url


def test_a_webhook_alert_drains_only_its_node_without_a_sweep(stack: tuple[str, str]) -> None:
    am_url, health = stack
    post_alert(am_url, "GPUXidUncorrectable", "ev02", gpu="3")
    item = wait_state(health, "ev02", "draining", timeout=30)
    assert item["reasons"][0]["signal"] == "GPUXidUncorrectable"
    assert item["reasons"][0]["source"] == "alertmanager"
    assert item["reasons"][0]["evidence"]["labels"]["gpu"] == "3"
    assert all(node_state(health, n)["state"] == "healthy" for n in NODES if n != "ev02")
    assert metric(health, "fleetsight_health_events_total", '{source="alertmanager"}') >= 1
    assert metric(health, "fleetsight_health_reconcile_repairs_total", '{kind="added"}') == 0
    post_alert(am_url, "GPUXidUncorrectable", "ev02", ends_in=0, gpu="3")  # resolved: webhook again
    wait_state(health, "ev02", "healthy", timeout=30)  # after clean_for (2 s)
    assert metric(health, "fleetsight_health_event_lag_seconds") == 0.0


def test_the_webhook_needs_the_events_token(stack: tuple[str, str]) -> None:
    _, health = stack
    body = {"version": "4", "status": "firing", "alerts": []}
    url = f"{health}/v1/events/alertmanager"
    assert httpx.post(url, json=body).status_code == 401
    drain = {"Authorization": f"Bearer {DRAIN_TOKEN}"}
    answer = httpx.post(url, json=body, headers=drain)
    assert answer.status_code == 403 and "events" in answer.text
    events = {"Authorization": f"Bearer {EVENTS_TOKEN}"}
    assert httpx.post(url, json=body, headers=events).status_code == 202
    bad = httpx.post(url, json={**body, "version": "3"}, headers=events)
    assert bad.status_code == 422 and "version" in bad.text


def test_anomaly_flag_and_clear_events(stack: tuple[str, str]) -> None:
    _, health = stack
    url = f"{health}/v1/events/anomaly"
    headers = {"Authorization": f"Bearer {EVENTS_TOKEN}"}
    flag = {"event": "flag", "node": "ev05", "hpc_job": "4242", "cause": "thermal", "score": 3.5}
    assert httpx.post(url, json={"events": [flag]}, headers=headers).status_code == 202
    item = wait_state(health, "ev05", "degraded", timeout=15)
    [reason] = item["reasons"]
    assert (reason["signal"], reason["source"]) == ("straggler", "anomaly")
    assert reason["evidence"]["labels"] == {"hpc_job": "4242", "cause": "thermal"}
    clear = {**flag, "event": "clear"}
    assert httpx.post(url, json={"events": [clear]}, headers=headers).status_code == 202
    wait_state(health, "ev05", "healthy", timeout=15)
    missing_node = httpx.post(url, json={"events": [{"event": "flag"}]}, headers=headers)
    assert missing_node.status_code == 422 and "node" in missing_node.text


def test_the_sweep_repairs_what_no_event_said_and_counts_it(alertmanager: str, tmp_path: Path) -> None:
    """The session's Alertmanager routes nowhere: every alert posted to it is an event the service
    never gets, so only the sweep (every 0.5 s here) can find it, and it says so."""
    folder = tmp_path / "health"
    (tmp_path / "nodes.txt").write_text("rp01\nrp02\n")
    args = ["--alertmanager-url", alertmanager, "--nodes-file", str(tmp_path / "nodes.txt")]
    process, health = start_health(folder, fast_policy(), args)
    with stopping(process):
        post_alert(alertmanager, "GPUXidUncorrectable", "rp01", gpu="1")
        wait_state(health, "rp01", "draining", timeout=30)
        wait_until(
            lambda: metric(health, "fleetsight_health_reconcile_repairs_total", '{kind="added"}') >= 1,
            timeout=10,
            what="the repair to be counted",
        )
        post_alert(alertmanager, "GPUXidUncorrectable", "rp01", ends_in=0, gpu="1")
        wait_state(health, "rp01", "healthy", timeout=30)
        assert metric(health, "fleetsight_health_reconcile_repairs_total", '{kind="removed"}') >= 1
        assert metric(health, "fleetsight_health_reconcile_duration_seconds") > 0
        assert node_state(health, "rp02")["state"] == "healthy"


def test_the_anomaly_services_notifier_flags_and_clears(stack: tuple[str, str], tmp_path: Path) -> None:
    """anomaly/notify.py as the anomaly service runs it (configured from its environment), posting the
    detector's own events to the service."""
    from anomaly.notify import HealthNotifier
    from anomaly.state import Event, Straggler

    _, health = stack
    token_file = tmp_path / "token"
    token_file.write_text(EVENTS_TOKEN)
    env = {"FLEETSIGHT_ANOMALY_HEALTH_URL": health, "FLEETSIGHT_ANOMALY_HEALTH_TOKEN_FILE": str(token_file)}
    notifier = HealthNotifier.from_env(env)
    assert notifier is not None and HealthNotifier.from_env({}) is None
    straggler = Straggler("5150", "ev07", "unknown", 2, 4.2, since=time.time() - 60, evidence={})
    try:
        notifier.send([Event("flag", time.time(), straggler)])
        item = wait_state(health, "ev07", "degraded", timeout=15)
        assert item["reasons"][0]["evidence"]["labels"] == {"hpc_job": "5150", "cause": "unknown"}
        notifier.send([Event("clear", time.time(), straggler)])
        wait_state(health, "ev07", "healthy", timeout=15)
        assert notifier.sent == 2 and notifier.failed == 0
    finally:
        notifier.close()


def test_the_sweep_takes_from_prometheus_an_alert_the_alertmanager_lost(
    alertmanager: str, tmp_path: Path
) -> None:
    """A real Prometheus fires GPUXidUncorrectable for ls01 and ls02 but sends no alert anywhere (an
    Alertmanager that restarted and forgot them): ls01's is unknown to the Alertmanager, so after the
    grace (1 s here, 2 min shipped) the sweep takes it from Prometheus's ALERTS, drains the node and
    counts a repair; ls02's the Alertmanager knows, silenced: it stays silenced."""
    # Firing from a few seconds on: after the service's first sweep, which counts nothing (the start).
    firing = " or ".join(f'label_replace(vector(1), "node", "{n}", "", "")' for n in ("ls01", "ls02"))
    firing = f"({firing}) and on () (vector(time()) > {time.time() + 8:.0f})"
    rules = {"groups": [{"name": "lost", "interval": "1s", "rules": [
        {"alert": "GPUXidUncorrectable", "labels": {"severity": "critical", "gpu": "0"}, "expr": firing},
    ]}]}  # fmt: skip
    (tmp_path / "lost.yml").write_text(yaml.safe_dump(rules))
    config = {"global": {"evaluation_interval": "1s"}, "rule_files": [str(tmp_path / "lost.yml")]}
    post_alert(alertmanager, "GPUXidUncorrectable", "ls02", gpu="0")
    silence = {
        "matchers": [{"name": "node", "value": "ls02", "isRegex": False, "isEqual": True}],
        "startsAt": "2020-01-01T00:00:00Z", "endsAt": "2099-01-01T00:00:00Z",
        "createdBy": "test", "comment": "in repair",
    }  # fmt: skip
    httpx.post(f"{alertmanager}/api/v2/silences", json=silence, timeout=5).raise_for_status()
    (tmp_path / "nodes.txt").write_text("ls01\nls02\n")
    policy = fast_policy()
    policy["refresh"]["unknown_alert_grace"] = "1s"
    (tmp_path / "prom").mkdir()
    with prometheus_server(tmp_path / "prom", config) as prometheus:
        args = ["--alertmanager-url", alertmanager, "--prometheus-url", prometheus]
        args += ["--nodes-file", str(tmp_path / "nodes.txt")]
        process, health = start_health(tmp_path / "health", policy, args)
        with stopping(process):
            assert node_state(health, "ls01")["state"] == "healthy"  # not firing yet
            query = f"{prometheus}/api/v1/query"
            wait_until(
                lambda: len(httpx.get(query, params={"query": "ALERTS"}).json()["data"]["result"]) == 2,
                timeout=30,
                what="both alerts firing in Prometheus",
            )
            wait_state(health, "ls01", "draining", timeout=30)
            reasons = node_state(health, "ls01")["reasons"]
            assert any("unknown to Alertmanager" in str(r) for r in reasons), reasons
            assert metric(health, "fleetsight_health_reconcile_repairs_total", '{kind="added"}') >= 1
            assert node_state(health, "ls02")["state"] == "healthy"  # silenced in the Alertmanager


def test_a_sweep_that_found_no_node_in_prometheus_is_soon_repeated(tmp_path: Path) -> None:
    """Started beside its Prometheus (the evaluation stack, a whole site after a power cut), a sweep
    that reads an `up` with no node yet learns no breaker unit: the sweep repeats at the refresh
    interval until Prometheus knows the nodes, then waits its `reconcile` (10 min here)."""
    policy = fast_policy()
    policy["refresh"]["reconcile"] = "10m"
    port = free_port()
    prometheus = prometheus_process(tmp_path / "prom", port, {"global": {"scrape_interval": "1s"}})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_ok(f"{url}/-/ready"), timeout=60, what="Prometheus")
        process, health = start_health(tmp_path / "health", policy, ["--prometheus-url", url])
        with stopping(process):
            sweeps = "fleetsight_health_reconcile_sweeps_total"
            wait_until(lambda: metric(health, sweeps) >= 3, timeout=15, what="sweeps repeated while no node")
            target = {"targets": ["127.0.0.1:9"], "labels": {"node": "pp01", "su": "su1"}}
            config = {"global": {"scrape_interval": "1s"},
                      "scrape_configs": [{"job_name": "node", "static_configs": [target]}]}  # fmt: skip
            (tmp_path / "prom" / "prometheus.yml").write_text(yaml.safe_dump(config))
            prometheus.send_signal(signal.SIGHUP)  # reload: the node appears in `up`
            known = f"{health}/v1/nodes/pp01"
            wait_until(lambda: httpx.get(known, timeout=5).status_code == 200, timeout=30, what="pp01")
            found = metric(health, sweeps)
            deadline = time.monotonic() + 3  # an invariant over a while: no further sweep for 10 min
            while time.monotonic() < deadline:
                assert metric(health, sweeps) <= found + 1
                time.sleep(0.3)
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)


def test_an_event_that_arrives_as_a_sweep_falls_due_is_decided_while_a_source_fails(tmp_path: Path) -> None:
    """While a source fails, the service sweeps every refresh interval instead of every reconcile; an
    event whose wake (plus the batch wait) runs into the next sweep must still be decided, not left
    queued until the source comes back. A batch wait longer than the interval makes every event do so."""
    token_file = tmp_path / "health_events_token"
    token_file.write_text(EVENTS_TOKEN + "\n")
    (tmp_path / "nodes.txt").write_text("\n".join(NODES) + "\n")
    policy = fast_policy(
        refresh={"interval": "1s", "source_timeout": "2s", "reconcile": "10m", "batch": "1.5s"}
    )
    refused = f"http://127.0.0.1:{free_port()}"  # nothing listens: the Alertmanager source fails
    args = ["--alertmanager-url", refused, "--nodes-file", str(tmp_path / "nodes.txt")]
    args += ["--events-token-file", str(token_file)]
    process, url = start_health(tmp_path / "health", policy, args, tokens=f"{DRAIN_TOKEN}=read,drain")
    with stopping(process):
        alert = {
            "status": "firing",
            "labels": {
                "alertname": "GPUThermalThrottling",
                "node": "ev05",
                "gpu": "2",
                "severity": "warning",
            },
            "annotations": {"summary": "GPU 2 of ev05 throttles"},
            "startsAt": "2026-11-30T05:00:00Z",
        }
        body = {"version": "4", "status": "firing", "receiver": "health", "alerts": [alert]}
        headers = {"Authorization": f"Bearer {EVENTS_TOKEN}"}
        answer = httpx.post(f"{url}/v1/events/alertmanager", json=body, headers=headers, timeout=15)
        assert answer.status_code == 202, answer.text
        item = wait_state(url, "ev05", "degraded", timeout=20)
        assert item["reasons"][0]["signal"] == "GPUThermalThrottling"
