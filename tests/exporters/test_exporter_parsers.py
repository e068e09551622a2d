"""The parsers on real-format samples, and fuzzed: whatever the input, they return or skip, never raise."""

from __future__ import annotations

import contextlib
import json

from exporter_helpers import FIXTURES
from hypothesis import given, settings
from hypothesis import strategies as st

from exporters import fabric_parse, infiniband, ipmi, kernlog, lustre, pcie, probes, xid
from exporters.gpus import normalize_bdf

FUZZ = settings(max_examples=300, deadline=None)


# -- PCIe ------------------------------------------------------------------------------------------


def test_every_link_speed_string_the_kernel_writes():
    cases = {
        "2.5 GT/s PCIe": 2.5e9,
        "5.0 GT/s PCIe": 5e9,
        "8.0 GT/s PCIe": 8e9,
        "16.0 GT/s PCIe": 16e9,
        "32.0 GT/s PCIe": 32e9,
        "64.0 GT/s PCIe": 64e9,
        "2.5 GT/s": 2.5e9,  # kernels before 5.x
        "5 GT/s": 5e9,
        "8 GT/s\n": 8e9,
        "Unknown": None,
        "Unknown speed": None,
        "": None,
        "0 GT/s": None,
    }
    for text, expected in cases.items():
        assert pcie.parse_speed(text) == expected, text


def test_link_widths():
    assert pcie.parse_width("16\n") == 16
    assert pcie.parse_width("x8") == 8
    assert pcie.parse_width("0") is None
    assert pcie.parse_width("255") is None  # "unknown" on some kernels
    assert pcie.parse_width("63") is None  # all-ones config space: the device is gone
    assert pcie.parse_width("garbage") is None


def test_device_kinds_by_class_code():
    assert pcie.device_kind("0x10de", "0x030200") == "gpu"
    assert pcie.device_kind("0x1a03", "0x030000") is None  # the BMC's VGA: not a GPU we watch
    assert pcie.device_kind("0x15b3", "0x020700") == "nic"
    assert pcie.device_kind("0x144d", "0x010802") == "nvme"
    assert pcie.device_kind("0x1000", "0x060400") == "switch"
    assert pcie.device_kind("0x10de", "0x068000") == "nvswitch"
    assert pcie.device_kind("0x8086", "0x060000") is None


@FUZZ
@given(st.text(max_size=80))
def test_pcie_parsers_never_raise(text):
    speed, width = pcie.parse_speed(text), pcie.parse_width(text)
    assert speed is None or speed > 0
    assert width is None or 0 < width <= 64


# -- InfiniBand ------------------------------------------------------------------------------------


def test_ib_strings():
    assert infiniband.parse_state("4: ACTIVE\n") == (4, "ACTIVE")
    assert infiniband.parse_state("5: LinkUp") == (5, "LinkUp")
    assert infiniband.parse_state("1: DOWN") == (1, "DOWN")
    assert infiniband.parse_rate("400 Gb/sec (4X NDR)\n") == (400e9, 4, "NDR")
    assert infiniband.parse_rate("200 Gb/sec (2X NDR)") == (200e9, 2, "NDR")
    assert infiniband.parse_rate("56 Gb/sec (4X FDR)") == (56e9, 4, "FDR")
    assert infiniband.parse_rate("2.5 Gb/sec (1X SDR)") == (2.5e9, 1, "SDR")
    assert infiniband.parse_rate("10 Gb/sec (4X)") == (10e9, 4, "")
    assert infiniband.parse_counter("123456789012\n") == 123456789012
    assert infiniband.parse_counter("N/A (no PMA)") is None
    assert infiniband.parse_counter("") is None


@FUZZ
@given(st.text(max_size=60))
def test_ib_parsers_never_raise(text):
    infiniband.parse_state(text)
    infiniband.parse_rate(text)
    value = infiniband.parse_counter(text)
    assert value is None or value >= 0


# -- Xid -------------------------------------------------------------------------------------------


def test_xid_lines_of_every_driver_generation_and_prefix():
    expected = json.loads((FIXTURES / "kernlog" / "expected_xids.json").read_text())
    counts: dict[tuple[str, int, str], int] = {}
    for line in (FIXTURES / "kernlog" / "xid_generations.log").read_text().splitlines():
        event = xid.parse_xid(line)
        if event:
            key = (event.kind, event.code, event.pci_bdf)
            counts[key] = counts.get(key, 0) + 1
    wanted = {("Xid", code, bdf): n for code, bdf, n in expected["xid"]}
    wanted |= {("SXid", code, bdf): n for code, bdf, n in expected["sxid"]}
    assert counts == wanted


def test_sxid_severity_and_continuation_lines():
    first = "nvidia-nvswitch1: SXid (PCI:0000:c5:00.0): 24007, Fatal, Link 08 sourcetrack TCEN0 crumbstore"
    assert xid.parse_xid(first) == xid.XidEvent("SXid", 24007, "0000:c5:00.0", "fatal")
    data = "nvidia-nvswitch1: SXid (PCI:0000:c5:00.0): 24007, Data {0x00000000, 0x00000008}"
    assert xid.parse_xid(data) is None


def test_bdf_forms():
    assert normalize_bdf("PCI:0000:18:00") == "0000:18:00.0"
    assert normalize_bdf("00000000:18:00.0") == "0000:18:00.0"
    assert normalize_bdf("0000:DB:00.1") == "0000:db:00.1"
    assert normalize_bdf("0019:01:00") == "0019:01:00.0"
    assert normalize_bdf("18:00.0") is None


def test_other_kernel_events():
    assert xid.other_event("LustreError: 11-0: scratch-OST0002-osc-ffff: operation ost_read failed") == (
        "lustre_error",
        "",
    )
    link = "mlx5_core 0000:1a:00.0: mlx5_port_change_handler:722:(pid 0): Port 1 Link down"
    assert xid.other_event(link) == ("ib_link_down", "0000:1a:00.0")
    assert xid.other_event("random line") is None


def test_syslog_timestamps():
    assert kernlog.syslog_timestamp("2026-11-21T10:00:05.123456+00:00 n0001 kernel: x") == 1795255205.123456
    assert kernlog.syslog_timestamp("2026-11-21T10:00:05Z host kernel: x") == 1795255205.0
    assert kernlog.syslog_timestamp("Nov 21 10:00:05 host kernel: x") is None
    assert kernlog.syslog_timestamp("2026-11-21T10:00:05 no zone") is None


def test_kmsg_records():
    record = b"4,1234,5678901,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
    record += b" SUBSYSTEM=pci\n DEVICE=+pci:0000:18:00.0\n"
    seq, usec, message = kernlog.parse_kmsg_record(record)
    assert (seq, usec) == (1234, 5678901)
    assert xid.parse_xid(message).code == 79
    assert kernlog.parse_kmsg_record(b"no semicolon") is None
    assert kernlog.parse_kmsg_record(b"a,b,c,d;msg") is None


@FUZZ
@given(st.text(max_size=200))
def test_xid_parser_never_raises(text):
    for candidate in (text, "NVRM: Xid (PCI:0000:18:00): " + text, "nvidia-nvswitch0: SXid (" + text):
        event = xid.parse_xid(candidate)
        assert event is None or (event.code >= 0 and event.pci_bdf.count(":") == 2)
        xid.other_event(candidate)
        kernlog.syslog_timestamp(candidate)


@FUZZ
@given(st.binary(max_size=200))
def test_kmsg_parser_never_raises(raw):
    kernlog.parse_kmsg_record(raw)
    kernlog.parse_kmsg_record(b"6,1,2,-;" + raw)


# -- Lustre ----------------------------------------------------------------------------------------


def test_llite_stats():
    text = (FIXTURES / "lustre/proc/fs/lustre/llite/scratch-ffff8f0a1b2c3000/stats").read_text()
    lines = {line.name: line for line in lustre.parse_stats(text)}
    assert lines["read_bytes"] == lustre.StatLine("read_bytes", 1200, "bytes", 1258291200)
    assert lines["write_bytes"].total == 2684354560
    assert lines["ioctl"] == lustre.StatLine("ioctl", 14, "reqs", None)
    assert "snapshot_time" not in lines


def test_rpc_stats():
    text = (FIXTURES / "lustre/proc/fs/lustre/osc/scratch-OST0000-osc-ffff8f0a1b2c3000/rpc_stats").read_text()
    stats = lustre.parse_rpc_stats(text)
    assert stats.in_flight == {"read": 3, "write": 1}
    assert stats.pending_pages == {"write": 256, "read": 0}
    assert stats.rpcs == {"read": 600, "write": 160}


def test_job_stats():
    text = (FIXTURES / "lustre/proc/fs/lustre/obdfilter/scratch-OST0001/job_stats").read_text()
    jobs = lustre.parse_job_stats(text)
    assert jobs["4242"]["read_bytes"] == (91000, 95000000000)
    assert jobs["4242"]["punch"] == (12, 900)
    assert jobs["train.llama.4243"]["write_bytes"] == (0, 0)


def test_instance_names():
    assert lustre.split_instance("llite", "scratch-ffff8f0a1b2c3000") == ("scratch", "")
    assert lustre.split_instance("osc", "scratch-OST002a-osc-ffff8f0a1b2c3000") == ("scratch", "OST002a")
    assert lustre.split_instance("mdc", "home-fs-MDT0000-mdc-ffff8f0a1b2c3000") == ("home-fs", "MDT0000")
    assert lustre.split_instance("obdfilter", "scratch-OST0001") == ("scratch", "OST0001")


def test_lctl_output_splits_into_the_same_files():
    text = (FIXTURES / "lustre" / "lctl_get_param.txt").read_text()
    files = lustre.parse_lctl_output(text)
    osc = ("osc", "scratch-OST0000-osc-ffff8f0a1b2c3000", "rpc_stats")
    assert set(files) == {
        ("llite", "scratch-ffff8f0a1b2c3000", "stats"),
        ("osc", "scratch-OST0000-osc-ffff8f0a1b2c3000", "stats"),
        osc,
    }
    assert lustre.parse_rpc_stats(files[osc]).rpcs == {"read": 600, "write": 160}


@FUZZ
@given(st.text(max_size=400))
def test_lustre_parsers_never_raise(text):
    for line in lustre.parse_stats(text):
        assert line.count >= 0
    lustre.parse_rpc_stats(text)
    lustre.parse_rpc_stats("pages per rpc rpcs % cum % | rpcs % cum %\n" + text)
    lustre.parse_job_stats("job_stats:\n- job_id: 1\n" + text)
    lustre.parse_lctl_output(text)


# -- IPMI ------------------------------------------------------------------------------------------


def test_ipmitool_outputs():
    sdr = ipmi.parse_sdr_elist((FIXTURES / "ipmitool" / "sdr_elist.txt").read_text())
    by_id = {p.psu: p for p in sdr.psus}
    assert sdr.chassis_watts == 1512
    assert [(r.sensor, r.ok) for r in sdr.redundancy] == [("Redundancy", False)]
    assert by_id["1"].healthy and by_id["1"].input_watts == 1520 and by_id["1"].output_watts == 1470
    assert by_id["2"].present and not by_id["2"].healthy
    assert not by_id["3"].present and not by_id["3"].healthy
    assert ipmi.parse_dcmi_power((FIXTURES / "ipmitool" / "dcmi_power_reading.txt").read_text()) == 1498
    sel = ipmi.parse_sel_list((FIXTURES / "ipmitool" / "sel_list.txt").read_text())
    assert sel == {"Event Logging Disabled": 1, "Power Supply": 2, "Power Unit": 1}


@FUZZ
@given(st.text(max_size=300))
def test_ipmi_parsers_never_raise(text):
    ipmi.parse_sdr_elist(text)
    ipmi.parse_sdr_elist("PS1 Status | 64h | ok | 10.1 | " + text)
    ipmi.parse_dcmi_power(text)
    ipmi.parse_sel_list(text)


# -- UFM and the probe file ------------------------------------------------------------------------


def test_ufm_speed_and_width():
    assert fabric_parse.lane_rate("NDR") == 100.0
    assert fabric_parse.lane_rate("HDR") == 50.0
    assert fabric_parse.lane_rate("FDR10") == 10.0
    assert fabric_parse.lane_rate("25.78125 Gbps") == 25.78125
    assert fabric_parse.lane_rate("") is None
    assert fabric_parse.parse_width("4x") == 4
    assert fabric_parse.parse_width("") is None


@FUZZ
@given(st.text(max_size=300))
def test_ufm_parsers_never_raise(text):
    fabric_parse.lane_rate(text)
    fabric_parse.parse_width(text)
    for document in (text, "node_guid,port_guid,port_num,SymbolErrorCounterExtended\n" + text):
        # Malformed CSV is reported as ValueError (the exporter counts it); anything else fails the test.
        with contextlib.suppress(ValueError):
            fabric_parse.parse_telemetry_csv(document)


@FUZZ
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5)
        ),
        max_leaves=20,
    )
)
def test_ufm_port_rows_and_probe_file_never_raise_on_odd_json(document):
    ports = document if isinstance(document, list) else [document]
    fabric_parse.port_rows(ports, {})
    with contextlib.suppress(ValueError):  # a clear error is the contract; anything else fails the test
        probes.parse_bandwidth_file(json.dumps(document))
