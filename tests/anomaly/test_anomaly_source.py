"""The service's PromQL against a real Prometheus holding the series the node agent and dcgm-exporter
really export together: every query must run (one failing query stops the whole cycle), and the
InfiniBand error counters of a node's ports add up into its `ib_errors`.

The exporter here is a small prometheus_client server with the real metric names and labels: a
port's three error counters share one label set, which is what once made the query fail on
Prometheus 2.x ("vector cannot contain metrics with the same labelset")."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from anomaly_helpers import start_prometheus, stop
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from anomaly.source import IB_ERROR_COUNTERS, PrometheusSource, SourceError
from support import free_port, wait_until

NODES = ("n0001", "n0002")
PORTS = ("mlx5_0", "mlx5_1")


@pytest.fixture
def exporter() -> Iterator[tuple[int, dict[str, Counter]]]:
    registry = CollectorRegistry()
    for name in ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_DEV_POWER_USAGE"):
        gauge = Gauge(name, "dcgm-exporter field", ["node", "gpu", "hpc_job"], registry=registry)
        for node in NODES:
            for gpu in range(2):
                gauge.labels(node, str(gpu), "42").set(0.5 if "TENSOR" in name else 600.0)
    counters = {
        counter: Counter(
            f"fleetsight_infiniband_port_{counter}",
            "IB port counter (node agent)",
            ["node", "device", "port"],
            registry=registry,
        )
        for counter in IB_ERROR_COUNTERS
    }
    for counter in counters.values():
        for node in NODES:
            for device in PORTS:
                counter.labels(node, device, "1").inc(0)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    yield port, counters
    server.shutdown()
    thread.join(timeout=5)


def test_every_query_runs_and_ib_errors_add_up_per_node(tmp_path: Path, exporter: tuple) -> None:
    exporter_port, counters = exporter
    prometheus_port = free_port()
    job = {"job_name": "mixed", "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]}
    prometheus: subprocess.Popen[bytes] = start_prometheus(tmp_path / "prom", prometheus_port, [job])
    try:
        source = PrometheusSource(f"http://127.0.0.1:{prometheus_port}")

        def window_with_nodes():
            try:
                window = source.read()
            except SourceError as exc:
                if "Connection refused" in str(exc) or "HTTP 503" in str(exc):
                    return None  # Prometheus still starting (not listening yet, or loading its TSDB)
                raise  # a query Prometheus refuses fails the test with its message
            return window if len(window.nodes) == len(NODES) else None

        wait_until(window_with_nodes, timeout=60, what="a window with both nodes")
        # n0002: symbol errors on one port, a link-down on the other; n0001 stays clean.
        counters["symbol_error"].labels("n0002", "mlx5_0", "1").inc(40)
        counters["link_downed"].labels("n0002", "mlx5_1", "1").inc(1)

        def errors_seen():
            window = source.read()
            values = dict(zip(window.nodes, window.ib_errors, strict=True))
            return values if values["n0002"] > 0 else None

        values = wait_until(errors_seen, timeout=60, what="the IB errors of n0002 in a window")
        assert values["n0001"] == 0
        assert values["n0002"] > 0
    finally:
        stop(prometheus)
