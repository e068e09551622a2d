"""The BMC collector against a real HTTP server speaking Redfish (DMTF mockup-style resources), and
against a stand-in ``ipmitool`` that prints the real tool's output formats."""

from __future__ import annotations

import ssl
import subprocess
import time
from pathlib import Path

import pytest
from exporter_helpers import FIXTURES, JsonServer, bmc_agent, load_routes, value


@pytest.fixture
def redfish():
    server = JsonServer(load_routes("bmc_both_schemas.json"), credentials=("fleet", "s3cret"))
    yield server
    server.close()


def test_redfish_power_and_power_supplies(redfish, tmp_path, monkeypatch):
    # Credentials come from the environment (the agent's own configuration, not the code under test).
    monkeypatch.setenv("FLEETSIGHT_BMC_USERNAME", "fleet")
    monkeypatch.setenv("FLEETSIGHT_BMC_PASSWORD", "s3cret")
    agent = bmc_agent(tmp_path, redfish_url=redfish.url)
    text = agent.scrape().decode()
    assert value(text, "fleetsight_bmc_up", protocol="redfish") == 1
    assert value(text, "fleetsight_bmc_power_consumed_watts", chassis="1U") == 8344
    # PowerSubsystem is preferred over the legacy Power.PowerSupplies when a BMC has both.
    assert value(text, "fleetsight_bmc_psu_healthy", psu="Bay1") == 1
    assert value(text, "fleetsight_bmc_psu_input_power_watts", psu="Bay1") == 1452.0
    assert value(text, "fleetsight_bmc_psu_output_power_watts", psu="Bay1") == 1398.4
    assert value(text, "fleetsight_bmc_psu_input_voltage_volts", psu="Bay1") == 230.2
    assert value(text, "fleetsight_bmc_psu_healthy", psu="Bay2") == 0  # present, offline, critical
    assert value(text, "fleetsight_bmc_psu_present", psu="Bay2") == 1
    assert (
        value(text, "fleetsight_bmc_psu_info", psu="Bay2", state="UnavailableOffline", health="Critical") == 1
    )
    assert value(text, "fleetsight_bmc_psu_present", psu="Bay3") == 0
    assert value(text, "fleetsight_bmc_psu_healthy", psu="Bay3") == 0
    assert value(text, "fleetsight_bmc_psu_healthy", psu="0") is None  # no double counting
    # The redundancy group (PowerSubsystem's, preferred over Power.Redundancy): degraded, one bay failed.
    assert value(text, "fleetsight_bmc_psu_redundancy_ok", chassis="1U", sensor="NPlusM") == 0
    assert value(text, "fleetsight_bmc_psu_redundancy_ok", sensor="PowerSupply Redundancy Group 1") is None
    assert value(text, "fleetsight_collector_success", collector="bmc") == 1
    assert (
        "/redfish/v1/Chassis/1U/PowerSubsystem/PowerSupplies/Bay3/Metrics" not in redfish.behaviour.requests
    )
    agent.close()


def test_legacy_power_resource_only_and_a_credentials_file(tmp_path):
    server = JsonServer(load_routes("bmc_legacy_power_only.json"), credentials=("root", "calvin"))
    secret = tmp_path / "bmc.secret"
    secret.write_text("root:calvin\n")
    agent = bmc_agent(tmp_path, redfish_url=server.url, bmc_credentials_file=str(secret))
    text = agent.scrape().decode()
    assert value(text, "fleetsight_bmc_power_consumed_watts", chassis="System.Embedded.1") == 612
    assert value(text, "fleetsight_bmc_psu_healthy", psu="PSU.Slot.1") == 1
    assert value(text, "fleetsight_bmc_psu_output_power_watts", psu="PSU.Slot.2") == 295
    redundancy = {"chassis": "System.Embedded.1", "sensor": "System Board PS Redundancy"}
    assert value(text, "fleetsight_bmc_psu_redundancy_ok", **redundancy) == 1
    assert value(text, "fleetsight_bmc_psu_redundancy_info", state="Fully Redundant", **redundancy) == 1
    agent.close()
    server.close()


def test_a_bmc_behind_a_path_prefix(tmp_path):
    """The twin serves each node's BMC below /bmc/<node>; the resources still name /redfish/v1/..."""
    server = JsonServer(load_routes("bmc_legacy_power_only.json"), prefix="/bmc/n0001")
    agent = bmc_agent(tmp_path, redfish_url=f"{server.url}/bmc/n0001")
    text = agent.scrape().decode()
    assert value(text, "fleetsight_bmc_power_consumed_watts", chassis="System.Embedded.1") == 612
    agent.close()
    server.close()


def test_wrong_credentials_garbage_and_errors_are_reported_not_fatal(redfish, tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETSIGHT_BMC_USERNAME", "fleet")
    monkeypatch.setenv("FLEETSIGHT_BMC_PASSWORD", "wrong")
    agent = bmc_agent(tmp_path, redfish_url=redfish.url)
    text = agent.scrape().decode()
    assert value(text, "fleetsight_bmc_up", protocol="redfish") == 0
    assert value(text, "fleetsight_collector_success", collector="bmc") == 0
    assert value(text, "fleetsight_collector_errors_total", collector="bmc", source="redfish") == 1
    agent.close()
    monkeypatch.setenv("FLEETSIGHT_BMC_PASSWORD", "s3cret")
    agent = bmc_agent(tmp_path, redfish_url=redfish.url)
    redfish.behaviour.garbage = True
    text = agent.scrape().decode()
    assert value(text, "fleetsight_collector_success", collector="bmc") == 0
    redfish.behaviour.garbage, redfish.behaviour.status = False, 503
    text = agent.scrape().decode()
    assert value(text, "fleetsight_collector_errors_total", collector="bmc", source="redfish") == 2
    redfish.behaviour.status = 200
    text = agent.scrape().decode()  # recovers by itself
    assert value(text, "fleetsight_collector_success", collector="bmc") == 1
    assert value(text, "fleetsight_bmc_power_consumed_watts", chassis="1U") == 8344
    agent.close()


def test_a_slow_bmc_times_out_and_never_holds_the_scrape(redfish, tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETSIGHT_BMC_USERNAME", "fleet")
    monkeypatch.setenv("FLEETSIGHT_BMC_PASSWORD", "s3cret")
    redfish.behaviour.delay_s = 2.0
    agent = bmc_agent(tmp_path, redfish_url=redfish.url, bmc_timeout_s=0.3, deadline_s=1.0)
    started = time.monotonic()
    text = agent.scrape().decode()
    assert time.monotonic() - started < 1.8
    assert value(text, "fleetsight_collector_success", collector="bmc") == 0
    agent.close()


def https_bmc(tmp_path: Path) -> tuple[JsonServer, Path]:
    """The Redfish server behind TLS with a fresh self-signed certificate (made with openssl)."""
    cert, key = tmp_path / "bmc.crt", tmp_path / "bmc.key"
    result = subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    server = JsonServer(load_routes("bmc_legacy_power_only.json"))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.server.socket = context.wrap_socket(server.server.socket, server_side=True)
    server.url = server.url.replace("http://", "https://")
    return server, cert


def test_tls_is_verified_by_default(tmp_path):
    server, cert = https_bmc(tmp_path)
    strict = bmc_agent(tmp_path, redfish_url=server.url)
    text = strict.scrape().decode()
    assert value(text, "fleetsight_bmc_up", protocol="redfish") == 0  # self-signed: refused
    with_ca = bmc_agent(tmp_path, redfish_url=server.url, bmc_ca_file=str(cert))
    assert (
        value(with_ca.scrape().decode(), "fleetsight_bmc_power_consumed_watts", chassis="System.Embedded.1")
        == 612
    )
    insecure = bmc_agent(tmp_path, redfish_url=server.url, bmc_verify_tls=False)
    assert value(insecure.scrape().decode(), "fleetsight_bmc_up", protocol="redfish") == 1
    for agent in (strict, with_ca, insecure):
        agent.close()
    server.close()


def fake_ipmitool(tmp_path: Path, fail_sel: bool = False) -> Path:
    """ipmitool cannot run here (no BMC): a script that prints the real tool's output formats and
    records its arguments."""
    script = tmp_path / "ipmitool"
    calls = tmp_path / "ipmitool.calls"
    fixtures = FIXTURES / "ipmitool"
    sel = "echo 'Error: SEL not reachable' >&2; exit 1" if fail_sel else f"cat {fixtures / 'sel_list.txt'}"
    script.write_text(f"""#!/bin/sh
echo "$@ password=$IPMI_PASSWORD" >> {calls}
case "$*" in
  *"sdr elist"*) cat {fixtures / "sdr_elist.txt"} ;;
  *"dcmi power reading"*) cat {fixtures / "dcmi_power_reading.txt"} ;;
  *"sel list"*) {sel} ;;
  *) echo "unknown command $*" >&2; exit 1 ;;
esac
""")
    script.chmod(0o755)
    return script


def test_ipmi_fallback(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETSIGHT_BMC_USERNAME", "admin")
    monkeypatch.setenv("FLEETSIGHT_BMC_PASSWORD", "pw")
    script = fake_ipmitool(tmp_path)
    agent = bmc_agent(tmp_path, ipmitool=str(script), ipmi_host="10.0.0.7")
    text = agent.scrape().decode()
    assert value(text, "fleetsight_bmc_up", protocol="ipmi") == 1
    assert value(text, "fleetsight_bmc_power_consumed_watts", chassis="ipmi") == 1498
    assert value(text, "fleetsight_bmc_psu_healthy", psu="1") == 1
    assert value(text, "fleetsight_bmc_psu_healthy", psu="2") == 0
    assert value(text, "fleetsight_bmc_psu_present", psu="3") == 0
    assert value(text, "fleetsight_bmc_psu_input_power_watts", psu="1") == 1520
    assert value(text, "fleetsight_bmc_sel_entries", sensor_type="Power Supply") == 2
    calls = (tmp_path / "ipmitool.calls").read_text()
    # Over LAN, with the password in the environment (-E), never on the command line.
    assert "-I lanplus -H 10.0.0.7 -U admin -E sdr elist password=pw" in calls
    assert " pw " not in calls.replace("password=pw", "")
    agent.close()


def test_ipmi_partial_failure_is_reported(tmp_path):
    agent = bmc_agent(tmp_path, ipmitool=str(fake_ipmitool(tmp_path, fail_sel=True)))
    text = agent.scrape().decode()
    assert value(text, "fleetsight_bmc_power_consumed_watts", chassis="ipmi") == 1498
    assert value(text, "fleetsight_collector_success", collector="bmc") == 0
    assert value(text, "fleetsight_collector_errors_total", collector="bmc", source="ipmitool") == 1
    agent.close()
