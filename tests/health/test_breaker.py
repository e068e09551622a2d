"""The circuit breaker in a mass failure: a dead leaf switch takes the IB ports of a whole scalable
unit down at once; FleetSight drains none of them, raises one alert in the real Alertmanager, and still
drains an unrelated failure elsewhere."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from health_helpers import fast_policy, node_state, post_alert, start_health, wait_state

from support import wait_until

NODES = [f"br{i:02d}" for i in range(1, 17)]  # units of 8: br01-br08 unit01, br09-br16 unit02
LEAF = NODES[8:]


@pytest.fixture(scope="module")
def health(alertmanager: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("health-breaker")
    (folder / "nodes.txt").write_text("\n".join(NODES) + "\n")
    process, url = start_health(
        folder, fast_policy(), ["--alertmanager-url", alertmanager, "--nodes-file", str(folder / "nodes.txt")]
    )
    try:
        yield url
    finally:
        process.stop()


def breaker_alerts(am_url: str) -> list[dict]:
    alerts = httpx.get(
        f"{am_url}/api/v2/alerts", params={"filter": 'alertname="HealthCircuitBreakerOpen"'}
    ).json()
    return [a for a in alerts if a["status"]["state"] == "active"]


def test_a_fresh_fleet_advises_from_the_prior_mtbf(health: str) -> None:
    answer = httpx.get(
        f"{health}/v1/checkpoint-advice", params={"nodes": 1000, "checkpoint_seconds": 120}
    ).json()
    assert answer["basis"] == "prior" and answer["node_mtbf_seconds"] == 2000 * 3600
    assert answer["interval_seconds"] == pytest.approx((2 * 120 * 2000 * 3600 / 1000) ** 0.5, rel=1e-6)


def test_a_dead_leaf_switch_drains_nothing_and_raises_one_alert(alertmanager: str, health: str) -> None:
    post_alert(alertmanager, "InfiniBandPortDown", LEAF, port="1", device="mlx5_0")
    wait_until(
        lambda: all(node_state(health, n)["state"] == "unhealthy" for n in LEAF),
        timeout=20,
        what="the whole unit to be unhealthy",
    )
    for node in LEAF:
        item = node_state(health, node)
        assert item["drain"] is None
        assert item["reasons"][0]["signal"] == "circuit_breaker"
        assert item["reasons"][1]["signal"] == "InfiniBandPortDown"
    assert httpx.get(f"{health}/v1/drain-list").json()["nodes"] == []
    status = httpx.get(f"{health}/v1/status").json()
    assert status["breaker"]["open"] is True and status["breaker"]["held"] == LEAF
    assert "unit unit02: 8 > 2" in status["breaker"]["scope"]
    alerts = wait_until(lambda: breaker_alerts(alertmanager), timeout=20, what="the breaker alert")
    assert len(alerts) == 1
    assert "holds 8 node(s)" in alerts[0]["annotations"]["summary"]
    assert "fleetsight_health_circuit_breaker_open 1.0" in httpx.get(f"{health}/metrics").text
    # preflight still keeps jobs off the held nodes
    assert httpx.post(f"{health}/v1/preflight", json={"nodes": LEAF}).json()["fit"] == []


def test_an_unrelated_failure_elsewhere_is_still_drained(alertmanager: str, health: str) -> None:
    post_alert(alertmanager, "GPUXidUncorrectable", "br02", gpu="1", xid="48")
    item = wait_state(health, "br02", "draining")
    assert item["drain"]["origin"] == "auto"
    assert [d["node"] for d in httpx.get(f"{health}/v1/drain-list").json()["nodes"]] == ["br02"]


def test_the_breaker_closes_when_the_leaf_comes_back(alertmanager: str, health: str) -> None:
    post_alert(alertmanager, "InfiniBandPortDown", LEAF, ends_in=0, port="1", device="mlx5_0")
    post_alert(alertmanager, "GPUXidUncorrectable", "br02", ends_in=0, gpu="1", xid="48")
    wait_until(
        lambda: all(node_state(health, n)["state"] == "healthy" for n in [*LEAF, "br02"]),
        timeout=30,
        what="every node healthy again",
    )
    assert httpx.get(f"{health}/v1/status").json()["breaker"]["open"] is False
    wait_until(lambda: not breaker_alerts(alertmanager), timeout=20, what="the breaker alert to resolve")
