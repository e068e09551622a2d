"""The IPMI parsers on ``ipmitool`` output published from real BMCs of several vendors (sources in
fixtures/ipmi/README.md), and the agent serving it through a stand-in ``ipmitool``."""

from __future__ import annotations

from pathlib import Path

import pytest
from exporter_helpers import FIXTURES, bmc_agent, value

from exporters import bmc_model, ipmi

IPMI = FIXTURES / "ipmi"


def sdr(name: str) -> ipmi.SdrElist:
    return ipmi.parse_sdr_elist((IPMI / name).read_text())


def by_id(reading: ipmi.SdrElist) -> dict[str, bmc_model.Psu]:
    return {p.psu: p for p in reading.psus}


def redundancy(reading: ipmi.SdrElist) -> dict[str, tuple[str, bool]]:
    return {r.sensor: (r.state, r.ok) for r in reading.redundancy}


def test_hpe_reading_and_states_on_one_line():
    reading = sdr("hpe_proliant_dl360_sdr_elist.txt")
    psus = by_id(reading)
    # "95 Watts, Presence detected": a healthy supply that reads 95 W, not an absent one.
    assert psus["2"].present and psus["2"].healthy and psus["2"].input_watts == 95
    # "0 Watts, Presence detected, Failure detected": present, failed, reading 0 W.
    assert psus["1"].present and not psus["1"].healthy and psus["1"].health == "Critical"
    assert psus["1"].input_watts == 0
    # Entity 10.3 is the redundancy sensor, not a third supply; 10.4 and 10.5 carry temperatures
    # only, which make no supply either.
    assert sorted(psus) == ["1", "2"]
    assert redundancy(reading) == {"Power Supplies": ("Non-Redundant: Sufficient from Redundant", False)}
    assert reading.chassis_watts == 100  # "Power Meter | 100 Watts, Device Enabled"


def test_dell_status_sensors_and_the_redundancy_sensor_on_the_system_board():
    r740 = sdr("dell_poweredge_r740xd_sdr_type_power_supply.txt")
    assert {k: p.healthy for k, p in by_id(r740).items()} == {"1": True, "2": True}
    assert redundancy(r740) == {"PS Redundancy": ("Fully Redundant", True)}

    idrac6 = sdr("dell_idrac6_sdr_type_power_supply.txt")
    health = {k: (p.present, p.healthy) for k, p in by_id(idrac6).items()}
    assert health == {"1": (True, True), "2": (True, False), "3": (True, True), "4": (True, True)}
    assert redundancy(idrac6) == {"PS Redundancy": ("Redundancy Degraded", False)}

    unreadable = sdr("dell_idrac_redundancy_unreadable_sdr_elist.txt")
    assert not unreadable.redundancy  # "ns | No Reading": unknown, not lost and not fine
    assert by_id(unreadable)["2"].present and not by_id(unreadable)["2"].healthy

    current = sdr("dell_poweredge_sdr_type_current.txt")
    assert current.chassis_watts == 98
    # Current sensors alone read: both supplies are there (one draws 0 A: idle, not absent).
    assert all(p.present and p.healthy for p in current.psus)


def test_nvidia_dgx1_supplies_without_ac_and_insufficient_redundancy():
    reading = sdr("nvidia_dgx1_sdr_type_power_supply.txt")
    health = {k: p.healthy for k, p in by_id(reading).items()}
    assert health == {"1": False, "2": False, "3": True, "4": True}
    assert redundancy(reading) == {"PSU Redundancy": ("Non-Redundant: Insufficient Resources", False)}


def test_supermicro_and_intel_boards():
    reading = sdr("supermicro_sdr_type_power_supply.txt")
    assert {k: p.healthy for k, p in by_id(reading).items()} == {"88": True, "87": False}
    intel = sdr("supermicro_intel_ipmi_discrete.txt")
    assert {k: p.healthy for k, p in by_id(intel).items()} == {"1": True, "2": True}
    # "Pwr Unit Stat | 21.1 |" asserts nothing and is no supply; "Power Redundancy" is the redundancy.
    assert redundancy(intel) == {"Power Redundancy": ("Fully Redundant", True)}
    assert ipmi.parse_dcmi_power((IPMI / "supermicro_dcmi_power_reading.txt").read_text()) == 109


def test_ibm_supplies_with_power_readings_only():
    psus = by_id(sdr("ibm_system_x_sdr_elist_power_in.txt"))
    assert psus["1"].healthy and psus["1"].input_watts == 132
    assert psus["2"].healthy and psus["2"].input_watts == 160


def test_an_empty_status_is_an_empty_bay_and_output_power_is_told_from_input():
    reading = sdr("unnamed_vendor_sdr_type_0x08.txt")
    psus = by_id(reading)
    assert psus["1"].healthy and psus["1"].output_watts == 120 and psus["1"].input_watts == 128
    assert not psus["2"].present and psus["2"].state == "Absent"
    assert redundancy(reading) == {"PS_RDNDNT_MODE": ("Non-Redundant: Sufficient from Redundant", False)}
    assert reading.chassis_watts == 128


def test_only_the_power_supplies_redundancy_counts():
    others = "\n".join(
        [
            "Fans             | 0Dh | ok  |  7.5 | 0 percent, Fully Redundant",
            "Fan Redundancy   | 0Eh | ok  | 30.1 | Redundancy Lost",
            "Memory Redund    | 0Fh | ok  | 32.1 | Redundancy Degraded",
            "Mem Mirroring    | 10h | ok  |  7.1 | Fully Redundant",
            "PS Redundancy    | 77h | ok  |  7.1 | Redundancy Lost",
        ]
    )
    assert redundancy(ipmi.parse_sdr_elist(others)) == {"PS Redundancy": ("Redundancy Lost", False)}


def test_sel_lists_of_several_vendors():
    assert ipmi.parse_sel_list((IPMI / "hpe_proliant_sel_list.txt").read_text()) == {"Memory": 2}
    dell = ipmi.parse_sel_list((IPMI / "dell_sel_list.txt").read_text())
    assert dell == {"Event Logging Disabled": 1, "Power Supply": 1}


def fake_ipmitool(tmp_path: Path, sdr_file: str) -> Path:
    """ipmitool cannot run here (no BMC): a script that prints a vendor's published output."""
    script = tmp_path / "ipmitool"
    script.write_text(f"""#!/bin/sh
case "$*" in
  *"sdr elist"*) cat {IPMI / sdr_file} ;;
  *"dcmi power reading"*) echo "DCMI command failed: Invalid command" >&2; exit 1 ;;
  *"sel list"*) cat {IPMI / "hpe_proliant_sel_list.txt"} ;;
  *) exit 1 ;;
esac
""")
    script.chmod(0o755)
    return script


@pytest.mark.parametrize(
    ("sdr_file", "healthy", "redundant"),
    [
        ("hpe_proliant_dl360_sdr_elist.txt", {"1": 0, "2": 1}, {"Power Supplies": 0}),
        ("nvidia_dgx1_sdr_type_power_supply.txt", {"1": 0, "2": 0, "3": 1, "4": 1}, {"PSU Redundancy": 0}),
        ("dell_poweredge_r740xd_sdr_type_power_supply.txt", {"1": 1, "2": 1}, {"PS Redundancy": 1}),
    ],
)
def test_the_agent_exports_supplies_and_redundancy(tmp_path, sdr_file, healthy, redundant):
    agent = bmc_agent(tmp_path, ipmitool=str(fake_ipmitool(tmp_path, sdr_file)))
    try:
        text = agent.scrape().decode()
    finally:
        agent.close()
    for psu, expected in healthy.items():
        assert value(text, "fleetsight_bmc_psu_healthy", psu=psu) == expected, psu
    for sensor, expected in redundant.items():
        assert value(text, "fleetsight_bmc_psu_redundancy_ok", sensor=sensor) == expected
    exported = {labels for name, labels in _psu_series(text)}
    assert len(exported) == len(healthy)  # the redundancy sensor is not one more supply
    assert value(text, "fleetsight_bmc_sel_entries", sensor_type="Memory") == 2


def _psu_series(text: str) -> list[tuple[str, str]]:
    return [
        ("fleetsight_bmc_psu_present", line.split("{", 1)[1].split("}", 1)[0])
        for line in text.splitlines()
        if line.startswith("fleetsight_bmc_psu_present{")
    ]
