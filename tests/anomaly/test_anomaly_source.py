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

from anomaly.queries import IB_ERROR_COUNTERS
from anomaly.source import PrometheusSource, SourceError
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


# dcgm-exporter's own label set (no `node`: the anomaly service falls back on `Hostname`).
DCGM_LABELS = [
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
    "hpc_job",
]
BRAKE, THERMAL_HW, POWER_CAP = 0x80, 0x40, 0x4


def dcgm_labels(node: str, gpu: int) -> list[str]:
    return [str(gpu), f"GPU-{node}-{gpu}", f"00000000:{0x18 + gpu:02X}:00.0", f"nvidia{gpu}",
            "NVIDIA H100 80GB HBM3", node, "550.127.05", "42"]  # fmt: skip


@pytest.fixture
def clock_events_exporter() -> Iterator[int]:
    """Two nodes of 2 GPUs: n0001 publishes the clock-event reasons under the current name, n0002 under
    the legacy one, and n0002 GPU 1 under both (one GPU, one value: it must not count twice)."""
    registry = CollectorRegistry()
    gauges = {
        name: Gauge(name, "dcgm-exporter field", DCGM_LABELS, registry=registry)
        for name in (
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "DCGM_FI_DEV_POWER_USAGE",
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        )
    }
    for node in NODES:
        for gpu in range(2):
            gauges["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].labels(*dcgm_labels(node, gpu)).set(0.5)
            gauges["DCGM_FI_DEV_POWER_USAGE"].labels(*dcgm_labels(node, gpu)).set(600.0)
    current, legacy = gauges["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"], gauges["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"]
    current.labels(*dcgm_labels("n0001", 0)).set(BRAKE | POWER_CAP)
    current.labels(*dcgm_labels("n0001", 1)).set(POWER_CAP)
    legacy.labels(*dcgm_labels("n0002", 0)).set(THERMAL_HW)
    for gauge in (current, legacy):
        gauge.labels(*dcgm_labels("n0002", 1)).set(BRAKE | THERMAL_HW)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    yield port
    server.shutdown()
    thread.join(timeout=5)


def test_power_brake_and_thermal_read_the_clock_events_under_either_name(
    tmp_path: Path, clock_events_exporter: int
) -> None:
    prometheus_port = free_port()
    job = {
        "job_name": "nvidia-dcgm-exporter",
        "static_configs": [{"targets": [f"127.0.0.1:{clock_events_exporter}"]}],
    }
    prometheus: subprocess.Popen[bytes] = start_prometheus(tmp_path / "prom", prometheus_port, [job])
    try:
        source = PrometheusSource(f"http://127.0.0.1:{prometheus_port}")

        def window_with_shares():
            try:
                window = source.read()
            except SourceError as exc:
                if "Connection refused" in str(exc) or "HTTP 503" in str(exc):
                    return None
                raise  # e.g. two names of one GPU as one label set: the query must not fail
            # the 30-second subquery must be full of samples: every share then is 0 or 1
            full = len(window.nodes) == len(NODES) and window.brake[0, 0] == 1 and window.thermal[1, 0] == 1
            return window if full else None

        window = wait_until(window_with_shares, timeout=60, what="a window with the throttle shares")
        assert window.nodes == list(NODES)
        assert window.brake.tolist() == [[1, 0], [0, 1]]
        assert window.thermal.tolist() == [[0, 0], [1, 1]]  # n0002 GPU 1: once, not 2 (clamped) or an error
    finally:
        stop(prometheus)
