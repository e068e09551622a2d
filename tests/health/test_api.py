"""The health service against a real Alertmanager: alerts POSTed through its API v2 move nodes through
their states with provenance; the REST API's errors, scopes, events, advice and metrics."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from health_helpers import (
    DRAIN_TOKEN,
    READ_TOKEN,
    fast_policy,
    node_state,
    post_alert,
    start_health,
    wait_state,
)

from health.model import STATES
from support import wait_until

NODES = [f"api{i:02d}" for i in range(1, 17)]
DRAIN = {"Authorization": f"Bearer {DRAIN_TOKEN}"}
READ = {"Authorization": f"Bearer {READ_TOKEN}"}


@pytest.fixture(scope="module")
def health(alertmanager: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("health-api")
    nodes_file = folder / "nodes.txt"
    nodes_file.write_text("\n".join(NODES) + "\n")
    process, url = start_health(
        folder,
        fast_policy(),
        ["--alertmanager-url", alertmanager, "--nodes-file", str(nodes_file)],
        tokens=f"{DRAIN_TOKEN}=read,drain;{READ_TOKEN}=read",
    )
    try:
        yield url
    finally:
        process.stop()


def test_every_node_starts_healthy_and_the_state_filter_is_checked(health: str) -> None:
    body = httpx.get(f"{health}/v1/nodes", params={"state": "healthy"}).json()
    assert {n["node"] for n in body["nodes"]} >= set(NODES)
    bad = httpx.get(f"{health}/v1/nodes", params={"state": "sick"})
    assert bad.status_code == 422
    (error,) = bad.json()["detail"]  # the schema's enum of states: the answer lists them
    assert error["input"] == "sick" and "'healthy'" in error["msg"] and "'repair'" in error["msg"]


def test_an_unknown_node_is_a_404_with_its_name(health: str) -> None:
    response = httpx.get(f"{health}/v1/nodes/nosuchnode")
    assert response.status_code == 404
    assert response.json()["detail"] == "unknown node 'nosuchnode'"


def test_a_warning_alert_degrades_with_provenance_and_clears_after_hysteresis(
    alertmanager: str, health: str
) -> None:
    post_alert(alertmanager, "GPUThermalThrottling", "api03", gpu="5", severity="warning")
    item = wait_state(health, "api03", "degraded")
    reason = item["reasons"][0]
    assert reason["signal"] == "GPUThermalThrottling" and reason["source"] == "alertmanager"
    assert reason["evidence"]["labels"]["gpu"] == "5"
    assert reason["runbook"] == "docs/runbooks/GPUThermalThrottling.md"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", reason["since"])
    assert item["fit"] is True

    post_alert(alertmanager, "GPUThermalThrottling", "api03", ends_in=0, gpu="5", severity="warning")
    held = wait_until(
        lambda: (r := node_state(health, "api03")["reasons"]) and "last_seen" in r[0] and r,
        timeout=20,
        what="the reason to be marked cleared",
    )
    assert held[0]["signal"] == "GPUThermalThrottling"
    assert node_state(health, "api03")["state"] == "degraded"  # clean, but not for clean_for yet
    wait_state(health, "api03", "healthy")
    events = httpx.get(f"{health}/v1/events", params={"node": "api03"}).json()["events"]
    assert [(e["from"], e["to"]) for e in events] == [("healthy", "degraded"), ("degraded", "healthy")]


def test_an_unhealthy_alert_drains_and_preflight_refuses_the_node(alertmanager: str, health: str) -> None:
    post_alert(alertmanager, "GPUXidUncorrectable", "api05", gpu="2", xid="79")
    item = wait_state(health, "api05", "draining")
    assert item["drain"] == {"origin": "auto", "reason": "GPUXidUncorrectable (alertmanager)"}
    [drain] = [d for d in httpx.get(f"{health}/v1/drain-list").json()["nodes"] if d["node"] == "api05"]
    assert (drain["state"], drain["origin"], drain["reason"]) == (
        "draining",
        "auto",
        "fleetsight: GPUXidUncorrectable (alertmanager)",
    )
    [evidence] = drain["evidence"]  # the drain names what allowed it
    assert evidence["signal"] == "GPUXidUncorrectable" and evidence["labels"]["xid"] == "79"

    answer = httpx.post(f"{health}/v1/preflight", json={"nodes": ["api04", "api05", "ghost"]}).json()
    assert answer["ok"] is False
    assert answer["fit"] == ["api04", "ghost"] and answer["unknown"] == ["ghost"]
    assert answer["unfit"][0]["node"] == "api05" and answer["unfit"][0]["state"] == "draining"
    assert "GPUXidUncorrectable on api05" in answer["unfit"][0]["reasons"][0]

    post_alert(alertmanager, "GPUXidUncorrectable", "api05", ends_in=0, gpu="2", xid="79")
    wait_state(health, "api05", "healthy")
    assert all(d["node"] != "api05" for d in httpx.get(f"{health}/v1/drain-list").json()["nodes"])


def test_blind_spots_never_drain_and_are_shown_beside_the_state(alertmanager: str, health: str) -> None:
    """Issue 41 through a real Alertmanager: a check that could not look and a silent dcgm-exporter keep
    their nodes fit (the latter `unobserved`), listed under blind_spots; a real fault posted at the same
    time on another node still drains (api06: the unit of api05, so that api09's unit keeps its breaker
    allowance for the override test)."""
    post_alert(alertmanager, "FleetSightBlind", "api10", severity="warning", check="row_remap", reason="tls")
    post_alert(alertmanager, "ExporterDown", "api11", severity="warning", job="dcgm")
    post_alert(alertmanager, "PSUFailed", "api06", psu="2")
    wait_state(health, "api06", "draining")
    item = wait_state(health, "api11", "unobserved")
    assert item["fit"] is True and item["reasons"] == []
    assert [(b["signal"], b["effect"]) for b in item["blind_spots"]] == [("ExporterDown", "blind")]
    blind = wait_until(
        lambda: (i := node_state(health, "api10"))["blind_spots"] and i, timeout=20, what="api10's blind spot"
    )
    assert blind["state"] == "healthy" and blind["blind_spots"][0]["evidence"]["labels"]["reason"] == "tls"
    drained = {d["node"] for d in httpx.get(f"{health}/v1/drain-list").json()["nodes"]}
    assert "api06" in drained and not {"api10", "api11"} & drained
    answer = httpx.post(f"{health}/v1/preflight", json={"nodes": ["api10", "api11"]}).json()
    assert answer["ok"] is True
    for name, node, labels in (
        ("FleetSightBlind", "api10", {"check": "row_remap", "reason": "tls"}),
        ("ExporterDown", "api11", {"job": "dcgm"}),
        ("PSUFailed", "api06", {"psu": "2"}),
    ):
        post_alert(alertmanager, name, node, ends_in=0, **labels)


def test_a_second_service_on_the_same_state_is_refused(tmp_path: Path) -> None:
    """Two bare-metal instances on one state directory would both drain and overwrite each other's file:
    the second one stops at start, naming the holder."""
    import subprocess

    from health.component import serve_command

    process, _ = start_health(tmp_path, fast_policy(), [])
    try:
        second = serve_command(
            "127.0.0.1:1", tmp_path / "state", policy=tmp_path / "policy.yml", cluster="test"
        )
        done = subprocess.run(second, capture_output=True, text=True, timeout=60)
        assert done.returncode != 0
        assert f"state directory {tmp_path / 'state'} is held by pid {process.popen.pid}" in done.stderr
    finally:
        process.stop()


def test_bad_preflight_bodies_get_a_422_that_names_the_field(health: str) -> None:
    for body in ({}, {"nodes": []}, {"nodes": "api01"}):
        response = httpx.post(f"{health}/v1/preflight", json=body)
        assert response.status_code == 422, body
        assert response.json()["detail"][0]["loc"][-1] == "nodes"
    garbage = httpx.post(
        f"{health}/v1/preflight", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert garbage.status_code == 422


def test_drain_needs_a_token_with_the_drain_scope(health: str) -> None:
    body = {"reason": "swap the HCA"}
    none = httpx.post(f"{health}/v1/nodes/api07/drain", json=body)
    assert none.status_code == 401 and "scope 'drain'" in none.json()["detail"]
    wrong = httpx.post(f"{health}/v1/nodes/api07/drain", json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["detail"] == "unknown token"
    reader = httpx.post(f"{health}/v1/nodes/api07/drain", json=body, headers=READ)
    assert reader.status_code == 403 and "lacks scope 'drain'" in reader.json()["detail"]
    assert node_state(health, "api07")["state"] == "healthy"


def test_an_operator_drain_and_resume_with_reason(health: str) -> None:
    missing = httpx.post(f"{health}/v1/nodes/api08/drain", json={}, headers=DRAIN)
    assert missing.status_code == 422
    bad_ttl = httpx.post(
        f"{health}/v1/nodes/api08/drain", json={"reason": "x" * 5, "expires_in": "soon"}, headers=DRAIN
    )
    assert bad_ttl.status_code == 422 and "not a duration" in bad_ttl.json()["detail"]
    unknown = httpx.post(f"{health}/v1/nodes/ghost/drain", json={"reason": "swap the HCA"}, headers=DRAIN)
    assert unknown.status_code == 404

    drained = httpx.post(f"{health}/v1/nodes/api08/drain", json={"reason": "swap the HCA"}, headers=DRAIN)
    assert drained.status_code == 200
    item = drained.json()
    assert item["state"] == "draining" and item["drain"]["origin"] == "operator"
    assert item["reasons"][0]["signal"] == "override" and item["reasons"][0]["summary"] == "swap the HCA"
    assert any(
        d["node"] == "api08" and d["reason"] == "fleetsight: swap the HCA"
        for d in httpx.get(f"{health}/v1/drain-list").json()["nodes"]
    )

    resumed = httpx.post(f"{health}/v1/nodes/api08/resume", json={"reason": "HCA swapped"}, headers=DRAIN)
    assert resumed.status_code == 200 and resumed.json()["state"] == "healthy"


def test_an_operator_override_expires(alertmanager: str, health: str) -> None:
    post_alert(alertmanager, "PSUFailed", "api09", psu="1")
    wait_state(health, "api09", "draining")
    # A known false alarm: the operator keeps the node fit for 2 s whatever the signals say.
    response = httpx.post(
        f"{health}/v1/nodes/api09/resume",
        json={"reason": "PSU sensor glitch", "keep_fit_for": "2s"},
        headers=DRAIN,
    )
    assert response.json()["state"] == "healthy"
    assert response.json()["reasons"][0]["summary"] == "PSU sensor glitch"
    wait_state(health, "api09", "draining")  # the override expired; the alert still fires
    post_alert(alertmanager, "PSUFailed", "api09", ends_in=0, psu="1")
    wait_state(health, "api09", "healthy")


def test_checkpoint_advice_is_youngs_formula(health: str) -> None:
    answer = httpx.get(
        f"{health}/v1/checkpoint-advice", params={"nodes": 512, "checkpoint_seconds": 90}
    ).json()
    assert answer["mtbf_seconds"] == pytest.approx(answer["node_mtbf_seconds"] / 512, rel=1e-9)
    assert answer["interval_seconds"] == pytest.approx(math.sqrt(2 * 90 * answer["mtbf_seconds"]), rel=1e-9)
    assert answer["basis"] in ("prior", "measured")
    for params in (
        {"nodes": 0, "checkpoint_seconds": 90},
        {"nodes": 8},
        {"nodes": 8, "checkpoint_seconds": -1},
    ):
        response = httpx.get(f"{health}/v1/checkpoint-advice", params=params)
        assert response.status_code == 422, params


def test_state_is_exported_as_metrics(health: str) -> None:
    text = httpx.get(f"{health}/metrics").text
    lines = [line for line in text.splitlines() if line.startswith("fleetsight_node_health_state{")]
    current = {}
    for line in lines:
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
        if line.endswith(" 1.0"):
            current[labels["node"]] = labels["state"]
    api = {n["node"]: n["state"] for n in httpx.get(f"{health}/v1/nodes").json()["nodes"]}
    assert current == api
    assert len(lines) == len(STATES) * len(api)  # one series per state, exactly one of them 1
    assert 'fleetsight_health_source_up{source="alertmanager"} 1.0' in text


def test_reads_can_require_a_token(alertmanager: str, tmp_path: Path) -> None:
    process, url = start_health(
        tmp_path,
        fast_policy(api={"open_reads": False}),
        ["--alertmanager-url", alertmanager],
        tokens=f"{READ_TOKEN}=read",
    )
    try:
        assert httpx.get(f"{url}/v1/nodes").status_code == 401
        assert httpx.get(f"{url}/v1/nodes", headers=READ).status_code == 200
    finally:
        process.stop()
