"""The Prometheus source against a real Prometheus: node list and scalable units from the `up` targets'
labels, exporter reachability, and a signal's start time that stays put across refreshes."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from health_helpers import post_alert

from health.policy import Policy
from health.sources import Sources
from support import free_port, prometheus_server, wait_until


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    dead = free_port()  # nothing listens there: up == 0
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "self",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{port}"], "labels": {"node": "alive1", "su": "su01"}},
                ],
            },
            {
                "job_name": "dcgm",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{dead}"], "labels": {"node": "dead1", "rack": "r007"}},
                ],
            },
        ],
    }
    with prometheus_server(tmp_path_factory.mktemp("prometheus"), config, port) as url:
        yield url


def test_nodes_and_units_come_from_up_and_a_missed_scrape_is_no_signal(prometheus: str) -> None:
    """`up == 0` alone marks nothing: one missed scrape is noise; reachability reaches the service as the
    NodeDown / ExporterDown alerts, debounced by their `for:` (issue 37)."""
    sources = Sources(Policy(), prometheus_url=prometheus)
    try:
        result = wait_until(
            lambda: (r := sources.collect(time.time())[1]).ok and len(r.nodes) == 2 and r,
            timeout=30,
            what="both targets scraped",
        )
        assert result.nodes == {"alive1": "su01", "dead1": "r007"}  # su label, else rack
        down = sources.query('up{node="dead1"} == 0')
        assert len(down) == 1  # the exporter really is unreachable...
        assert result.signals == []  # ...and that alone is no health signal
    finally:
        sources.close()


def test_a_source_that_fails_is_reported_and_the_others_still_count(prometheus: str) -> None:
    sources = Sources(Policy(), prometheus_url=prometheus, alertmanager_url=f"http://127.0.0.1:{free_port()}")
    try:
        results = {r.name: r for r in sources.collect(time.time())}
        assert results["alertmanager"].ok is False and "ConnectError" in results["alertmanager"].error
        assert results["prometheus"].ok is True
    finally:
        sources.close()


def test_an_alertmanager_pair_is_read_once_each_and_one_answering_is_enough(alertmanager: str) -> None:
    post_alert(alertmanager, "PSUFailed", "pair01", psu="2")
    silent = f"http://127.0.0.1:{free_port()}"  # nothing listens: the pair's other half is down

    def psu_signals(urls: str) -> tuple[list, str]:
        sources = Sources(Policy(), alertmanager_url=urls)
        try:
            (result,) = [r for r in sources.collect(time.time()) if r.name == "alertmanager"]
        finally:
            sources.close()
        assert result.ok, result.error
        return [s for s in result.signals if s.node == "pair01" and s.name == "PSUFailed"], result.error

    # Both halves answer with the same alert (gossip or Prometheus sending to each): one signal.
    wait_until(lambda: psu_signals(alertmanager)[0], what="the alert in Alertmanager")
    signals, error = psu_signals(f"{alertmanager},{alertmanager}/")
    assert len(signals) == 1 and not error
    signals, error = psu_signals(f"{silent}, {alertmanager}")
    assert len(signals) == 1 and silent in error

    sources = Sources(Policy(), alertmanager_url=f"{silent},{silent}")
    try:
        (result,) = [r for r in sources.collect(time.time()) if r.name == "alertmanager"]
    finally:
        sources.close()
    assert not result.ok and "ConnectError" in result.error
    post_alert(alertmanager, "PSUFailed", "pair01", ends_in=0, psu="2")
