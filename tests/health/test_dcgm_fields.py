"""The health service reports which needed DCGM fields the fleet's dcgm-exporters do not publish, and
what that blinds: against a real Prometheus scraping two exporters that speak dcgm-exporter's format
with its full label set, one with the stock counters file's fields (scraped under the GPU operator's
job name, relabelled as metrics/prometheus.yml relabels FleetSight's `dcgm` job) and one with
FleetSight's file."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from health_helpers import Process, fast_policy, health_server

from fleetsight.dcgm import NEEDED_FIELDS, names_of
from health.policy import Policy
from health.sources import Sources
from support import free_port, wait_until

REPO = Path(__file__).resolve().parents[2]
STOCK = ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
         "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")  # fmt: skip
SHIPPED = (*STOCK, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_ROW_REMAP_PENDING")


def exposition(node: str, fields: tuple[str, ...]) -> str:
    """dcgm-exporter 4.x's /metrics for 2 GPUs of one node: HELP/TYPE, its labels, 4.x Xid series."""
    lines = []
    for name in (*fields, "DCGM_FI_DEV_XID_ERRORS"):
        lines += [f"# HELP {name} dcgm-exporter field.", f"# TYPE {name} gauge"]
        for gpu in range(2):
            labels = (
                f'gpu="{gpu}",UUID="GPU-{node}-{gpu}",pci_bus_id="00000000:{0x18 + gpu:02X}:00.0",'
                f'device="nvidia{gpu}",modelName="NVIDIA H100 80GB HBM3",Hostname="{node}",'
                f'DCGM_FI_DRIVER_VERSION="550.127.05"'
            )
            if name == "DCGM_FI_DEV_XID_ERRORS":
                labels += ',err_code="0",err_msg="No Error"'
            lines.append(f"{name}{{{labels}}} 0")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def exporters() -> Iterator[dict[str, int]]:
    """One HTTP server per node, each answering /metrics with its counters file's fields."""
    servers: dict[str, ThreadingHTTPServer] = {}
    for node, fields in (("gpu-s01", STOCK), ("gpu-f01", SHIPPED)):
        body = exposition(node, fields).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self, body: bytes = body) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # the test's output stays readable
                return

        servers[node] = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        threading.Thread(target=servers[node].serve_forever, daemon=True).start()
    yield {node: server.server_address[1] for node, server in servers.items()}
    for server in servers.values():
        server.shutdown()
        server.server_close()


def production_relabelling() -> list[dict[str, Any]]:
    """metric_relabel_configs of the production `dcgm` job (Hostname -> node)."""
    config = yaml.safe_load((REPO / "metrics" / "prometheus.yml").read_text())
    [job] = [j for j in config["scrape_configs"] if j["job_name"] == "dcgm"]
    return job["metric_relabel_configs"]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory, exporters: dict[str, int]) -> Iterator[str]:
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus is not installed: run `fleetsight setup`")
    folder = tmp_path_factory.mktemp("prometheus")
    port = free_port()
    jobs = [
        ("nvidia-dcgm-exporter", "gpu-s01", "stock"),  # the GPU operator's job name
        ("dcgm", "gpu-f01", "shipped"),
    ]
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": job,
                "static_configs": [
                    {"targets": [f"127.0.0.1:{exporters[node]}"], "labels": {"cluster": cluster}}
                ],
                "metric_relabel_configs": production_relabelling(),
            }
            for job, node, cluster in jobs
        ],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    process = Process(
        "prometheus",
        ["prometheus", f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        folder / "prometheus.log",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        process.wait_ready(f"{url}/-/ready")
        wait_until(
            lambda: series_count(url, "DCGM_FI_DEV_GPU_TEMP") == 4, timeout=30, what="both exporters scraped"
        )
        yield url
    finally:
        process.stop()


def series_count(url: str, query: str) -> int:
    return len(httpx.get(f"{url}/api/v1/query", params={"query": query}).json()["data"]["result"])


def expected_missing() -> list[dict[str, Any]]:
    """The stock cluster's node lacks the clock-event reasons and ROW_REMAP_PENDING; nothing else is."""
    wanted = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_ROW_REMAP_PENDING")
    return [
        {
            "field": need.field,
            "names": list(names_of(need.field)),
            "nodes_without_it": {"stock": 1},
            "blinds_alerts": list(need.alerts),
            "blinds_signals": list(need.signals),
            "note": need.note,
        }
        for need in NEEDED_FIELDS
        if need.field in wanted
    ]


def test_the_prometheus_source_names_the_missing_fields_and_what_they_blind(prometheus: str) -> None:
    sources = Sources(Policy(dcgm_fields_interval_s=0.0), prometheus_url=prometheus)
    try:
        [_, result] = sources.collect(time.time())
        assert result.ok, result.error
        assert result.dcgm_fields == expected_missing()
        clock = result.dcgm_fields[0]
        assert clock["names"] == ["DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"]
        assert clock["blinds_alerts"] == ["GPUPowerBrakeActive", "GPUThermalThrottling"]
    finally:
        sources.close()


def test_the_answer_is_kept_between_checks(prometheus: str) -> None:
    """Asked once per interval: a refresh in between reuses the last answer without a query."""
    sources = Sources(Policy(dcgm_fields_interval_s=60.0), prometheus_url=prometheus)
    try:
        now = time.time()
        first = sources.collect(now)[1].dcgm_fields
        sources.dcgm_fields = [{"field": "marker"}]  # what a query would overwrite
        assert sources.collect(now + 30)[1].dcgm_fields == [{"field": "marker"}]
        assert sources.collect(now + 61)[1].dcgm_fields == first == expected_missing()
    finally:
        sources.close()


def test_status_reports_the_missing_fields(prometheus: str, tmp_path: Path) -> None:
    policy = fast_policy(refresh={"dcgm_fields": "1s"})
    with health_server(tmp_path / "health", policy, ["--prometheus-url", prometheus]) as url:

        def reported() -> list[dict[str, Any]] | None:
            return httpx.get(f"{url}/v1/status", timeout=5).json()["dcgm_fields"]["missing"]

        assert (
            wait_until(reported, timeout=30, what="the missing DCGM fields in /v1/status")
            == expected_missing()
        )
