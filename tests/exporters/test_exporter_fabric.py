"""The fabric exporter against a real HTTP server speaking UFM's REST resources and UFM Telemetry's CSV."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from exporter_helpers import FIXTURES, JsonServer, value

from exporters.fabric import FabricExporter
from support import free_port, wait_until

ROUTES = {
    "/ufmRest/resources/ports": json.loads((FIXTURES / "ufm" / "ports.json").read_text()),
    "/ufmRest/resources/systems": json.loads((FIXTURES / "ufm" / "systems.json").read_text()),
    "/ufmRest/app/events": json.loads((FIXTURES / "ufm" / "events.json").read_text()),
    "/csv/metrics": (FIXTURES / "ufm" / "telemetry.csv").read_text(),
}


@pytest.fixture
def ufm():
    server = JsonServer(ROUTES, credentials=("admin", "123456"), prefix="/ufm")
    yield server
    server.close()


def exporter_for(ufm: JsonServer, **extra) -> FabricExporter:
    return FabricExporter(
        ufm_url=f"{ufm.url}/ufm",
        telemetry_url=f"{ufm.url}/ufm/csv/metrics",
        credentials=("admin", "123456"),
        **extra,
    )


def test_ports_with_both_ends_of_each_link(ufm):
    exporter = exporter_for(ufm)
    exporter.refresh()
    text = exporter.snapshot.text.decode()
    host = {
        "side": "host",
        "node": "n0001",
        "hca_port": "mlx5_0/1",
        "switch": "leaf-r01-01",
        "switch_port": "1",
    }
    assert value(text, "fleetsight_fabric_port_up", **host) == 1
    assert value(text, "fleetsight_fabric_port_rate_bytes_per_second", **host) == 400e9 / 8
    # PortXmitData counts 4-byte words.
    assert value(text, "fleetsight_fabric_port_transmit_bytes_total", **host) == 4 * 250000000000
    leaf = {
        "side": "switch",
        "switch": "leaf-r01-01",
        "switch_port": "1",
        "node": "n0001",
        "hca_port": "mlx5_0/1",
    }
    assert value(text, "fleetsight_fabric_port_up", **leaf) == 1
    assert value(text, "fleetsight_fabric_port_transmit_wait_total", **leaf) == 800
    uplink = {
        "side": "switch",
        "switch": "leaf-r01-01",
        "switch_port": "33",
        "peer_switch": "spine-01",
        "peer_switch_port": "7",
    }
    assert value(text, "fleetsight_fabric_port_width", **uplink) == 2
    assert value(text, "fleetsight_fabric_port_rate_bytes_per_second", **uplink) == 200e9 / 8
    assert value(text, "fleetsight_fabric_port_symbol_errors_total", **uplink) == 519
    assert value(text, "fleetsight_fabric_port_healthy", **uplink) == 0  # severity Minor
    down = {"side": "host", "node": "n0002", "hca_port": "mlx5_0/1"}
    assert value(text, "fleetsight_fabric_port_up", **down) == 0
    assert value(text, "fleetsight_fabric_port_physical_state", **down) == 2
    assert value(text, "fleetsight_fabric_port_link_downed_total", **down) == 2
    assert value(text, "fleetsight_fabric_switch_healthy", switch="leaf-r01-01") == 0
    assert value(text, "fleetsight_fabric_switch_healthy", switch="spine-01") == 1
    assert value(text, "fleetsight_fabric_switch_info", switch="spine-01", model="MQM9790") == 1
    assert (
        value(text, "fleetsight_fabric_events_total", severity="Warning", category="Communication Error") == 2
    )
    assert value(text, "fleetsight_fabric_ports") == 6
    for part in ("ports", "systems", "events", "telemetry"):
        assert value(text, "fleetsight_collector_success", collector=f"fabric_{part}") == 1
        # Present at 0 before any error, so that increase() sees the first one.
        assert value(text, "fleetsight_collector_errors_total", collector=f"fabric_{part}", source="ufm") == 0
    exporter.close()


def test_events_are_counted_once(ufm):
    exporter = exporter_for(ufm)
    exporter.refresh()
    exporter.refresh()
    text = exporter.snapshot.text.decode()
    assert value(text, "fleetsight_fabric_events_total", severity="Critical", category="Fabric Topology") == 1


def test_ufm_down_slow_or_garbage_is_reported_and_recovered(ufm):
    exporter = exporter_for(ufm, timeout_s=0.5)
    ufm.behaviour.garbage = True
    exporter.refresh()
    text = exporter.snapshot.text.decode()
    assert value(text, "fleetsight_collector_success", collector="fabric_ports") == 0
    assert value(text, "fleetsight_collector_errors_total", collector="fabric_ports", source="ufm") == 1
    assert value(text, "fleetsight_collector_errors_total", collector="fabric_telemetry", source="ufm") == 1
    ufm.behaviour.garbage, ufm.behaviour.delay_s = False, 1.0
    exporter.refresh()
    text = exporter.snapshot.text.decode()
    assert value(text, "fleetsight_collector_errors_total", collector="fabric_ports", source="ufm") == 2
    ufm.behaviour.delay_s = 0.0
    exporter.refresh()
    text = exporter.snapshot.text.decode()
    assert value(text, "fleetsight_collector_success", collector="fabric_ports") == 1
    assert value(text, "fleetsight_fabric_ports") == 6
    exporter.close()
    nobody = FabricExporter(ufm_url=f"http://127.0.0.1:{free_port()}/ufm", timeout_s=0.5)
    nobody.refresh()
    assert value(nobody.snapshot.text.decode(), "fleetsight_collector_success", collector="fabric_ports") == 0
    nobody.close()


def test_served_scrape_is_the_cached_snapshot_gzip_included(ufm):
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fleetsight.cli",
            "exporter",
            "fabric",
            "--ufm-url",
            f"{ufm.url}/ufm",
            "--ufm-telemetry-url",
            f"{ufm.url}/ufm/csv/metrics",
            "--listen",
            f"127.0.0.1:{port}",
            "--interval",
            "1",
        ],
        env={
            "FLEETSIGHT_UFM_USERNAME": "admin",
            "FLEETSIGHT_UFM_PASSWORD": "123456",
            "PATH": "/usr/bin:/bin",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def scraped():
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"Accept-Encoding": "gzip"})
            except httpx.HTTPError:
                return None
            return response if "fleetsight_fabric_port_up" in response.text else None

        response = wait_until(scraped, timeout=30, what="the fabric exporter to serve its first snapshot")
        assert response.headers["content-encoding"] == "gzip"
        assert value(response.text, "fleetsight_fabric_ports") == 6
        requests_before = len(ufm.behaviour.requests)
        httpx.get(f"http://127.0.0.1:{port}/metrics")
        assert len(ufm.behaviour.requests) - requests_before <= 4  # a scrape does not call UFM itself
    finally:
        process.terminate()
        process.wait(timeout=10)
    assert process.returncode == 0, process.stdout.read() if process.stdout else ""


def link_down(port: dict) -> dict:
    """A port as UFM lists it while its link is down: no peer, Polling/Down."""
    fields = ("peer", "peer_guid", "peer_node_name", "peer_port_dname", "peer_node_description")
    cleared = dict.fromkeys(fields, "")
    return {**port, **cleared, "physical_state": "Polling", "logical_state": "Down", "severity": "Critical"}


def test_a_switch_port_names_the_host_behind_it_even_while_its_link_is_down(ufm):
    exporter = exporter_for(ufm)
    exporter.refresh()
    text = exporter.snapshot.text.decode()
    peer = {"switch": "leaf-r01-01", "switch_port": "1", "node": "n0001", "hca_port": "mlx5_0/1"}
    assert value(text, "fleetsight_fabric_switch_port_peer_info", **peer) == 1
    # The uplink to the spine and the never-cabled port 2 name no host.
    assert value(text, "fleetsight_fabric_switch_port_peer_info", switch_port="33") is None
    assert value(text, "fleetsight_fabric_switch_port_peer_info", switch_port="2") is None
    ports = ROUTES["/ufmRest/resources/ports"]
    ufm.routes["/ufmRest/resources/ports"] = [
        link_down(p) if p["name"] in ("fc6a1c0300e0f000_1", "b8cef60300a1b2c0_1") else p for p in ports
    ]
    exporter.refresh()
    text = exporter.snapshot.text.decode()
    assert value(text, "fleetsight_fabric_switch_port_peer_info", **peer) == 1
    # The down port keeps its label set (one series across the flap), value 0.
    assert value(text, "fleetsight_fabric_port_up", side="switch", **peer) == 0
    exporter.close()


def test_the_peer_host_comes_from_ufms_peer_fields_when_its_port_is_not_listed(ufm):
    """UFM filtered to switch ports (``?sys_type=Switch``) lists no host ports: the switch port's own
    peer fields (peer_node_description "<host> <device>", peer_port_dname) name the host."""
    switch_ports = [p for p in ROUTES["/ufmRest/resources/ports"] if p["description"] == "Switch IB Port"]
    host_peer = {"peer_node_description": "n0001 mlx5_0", "peer_port_dname": "HCA-1/1"}
    ufm.routes["/ufmRest/resources/ports"] = [
        {**p, **host_peer} if p["name"] == "fc6a1c0300e0f000_1" else p for p in switch_ports
    ]
    exporter = exporter_for(ufm)
    exporter.refresh()
    text = exporter.snapshot.text.decode()
    peer = {"switch": "leaf-r01-01", "switch_port": "1", "node": "n0001", "hca_port": "mlx5_0/1"}
    assert value(text, "fleetsight_fabric_switch_port_peer_info", **peer) == 1
    uplink = {"side": "switch", "switch_port": "33", "peer_switch": "spine-01"}
    assert value(text, "fleetsight_fabric_port_up", **uplink) == 1
    exporter.close()
