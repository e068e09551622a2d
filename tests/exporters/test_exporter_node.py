"""The node agent's collectors on a node tree in the kernel's real formats (sysfs, procfs, kernel log)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from exporter_helpers import FIXTURES, NodeSpec, build_node, link_attrs, names, pci_device, samples, value

from exporters.node import NodeAgent, NodeOptions

XID_LOG = (FIXTURES / "kernlog" / "xid_generations.log").read_text().splitlines()


def agent_for(paths: dict[str, Path], **extra) -> NodeAgent:
    opts = NodeOptions(
        node="n0001",
        sysfs_root=str(paths["sys"]),
        procfs_root=str(paths["proc"]),
        kmsg_file=str(paths["kern_log"]),
        nvml=False,
        deadline_s=extra.pop("deadline_s", 5.0),
        **extra,
    )
    return NodeAgent(opts)


def scrape(agent: NodeAgent) -> str:
    return agent.scrape().decode()


@pytest.fixture
def node(tmp_path: Path) -> dict[str, Path]:
    spec = NodeSpec(oscs=4, downgraded_gpu=2, down_ib_device=3, no_pma_device=9, kern_lines=XID_LOG)
    return build_node(tmp_path / "n0001", spec)


def test_pcie_links_of_gpus_nics_nvme_and_switches(node):
    agent = agent_for(node, collectors=("pcie",))
    text = scrape(agent)
    gpu2 = {"pci_bdf": "0000:3a:00.0", "kind": "gpu", "gpu": "2", "node": "n0001"}
    assert value(text, "fleetsight_pcie_link_speed_transfers_per_second", **gpu2) == 8e9
    assert value(text, "fleetsight_pcie_link_max_speed_transfers_per_second", **gpu2) == 32e9
    assert value(text, "fleetsight_pcie_link_width", **gpu2) == 8
    assert value(text, "fleetsight_pcie_link_max_width", **gpu2) == 16
    assert value(text, "fleetsight_pcie_link_downgraded", **gpu2) == 1
    assert value(text, "fleetsight_pcie_link_width_downgraded", **gpu2) == 1
    assert value(text, "fleetsight_pcie_link_downgraded", pci_bdf="0000:18:00.0") == 0
    kinds = {dict(ls)["kind"] for (n, ls) in samples(text) if n == "fleetsight_pcie_link_width"}
    assert kinds == {"gpu", "nic", "nvme", "switch"}
    # The host bridge has no PCIe link: not exported, and not an error.
    assert value(text, "fleetsight_pcie_link_width", pci_bdf="0000:00:00.0") is None
    assert value(text, "fleetsight_collector_success", collector="pcie") == 1
    agent.close()


def test_only_the_switches_above_watched_devices_on_a_real_topology(tmp_path):
    paths = build_node(tmp_path / "real", NodeSpec(gpus=2, ib_devices=2, oscs=1, topology=True))
    flat = build_node(tmp_path / "flat", NodeSpec(gpus=2, ib_devices=2, oscs=1, topology=False))
    attrs = link_attrs("0x8086", "0x347a", "0x060400", "16.0 GT/s PCIe", 4, "16.0 GT/s PCIe", 4)
    pci_device(paths["sys"], paths["sys"] / "devices" / "pci0000:00", 0xF0, attrs, topology=True)
    pci_device(flat["sys"], flat["sys"], 0xF0, attrs, topology=False)
    real_text = scrape(agent_for(paths, collectors=("pcie",)))
    flat_text = scrape(agent_for(flat, collectors=("pcie",)))
    assert value(real_text, "fleetsight_pcie_link_width", pci_bdf="0000:16:00.0") == 16  # above GPU 0
    assert value(real_text, "fleetsight_pcie_link_width", pci_bdf="0000:f0:00.0") is None  # above nothing
    assert value(flat_text, "fleetsight_pcie_link_width", pci_bdf="0000:f0:00.0") == 4  # flat: no topology


def test_a_gpu_fallen_off_the_bus_reads_as_a_down_link(node):
    device = node["sys"] / "bus" / "pci" / "devices" / "0000:18:00.0"
    (device / "current_link_speed").write_text("Unknown\n")
    (device / "current_link_width").write_text("63\n")
    text = scrape(agent_for(node, collectors=("pcie",)))
    assert value(text, "fleetsight_pcie_link_up", pci_bdf="0000:18:00.0") == 0
    assert value(text, "fleetsight_pcie_link_downgraded", pci_bdf="0000:18:00.0") == 1
    assert value(text, "fleetsight_pcie_link_width", pci_bdf="0000:18:00.0") is None


def test_infiniband_ports_and_counters(node):
    text = scrape(agent_for(node, collectors=("infiniband",)))
    mlx0 = {"device": "mlx5_0", "port": "1"}
    base = 1_000_000  # the fixture writes counter_base * (index + 1) + position in the counter list
    assert value(text, "fleetsight_infiniband_port_up", **mlx0) == 1
    assert value(text, "fleetsight_infiniband_port_rate_bytes_per_second", **mlx0) == 400e9 / 8
    assert value(text, "fleetsight_infiniband_port_width", **mlx0) == 4
    # port_xmit_data counts 4-byte words: exported as bytes.
    xmit_words = base + 14  # port_xmit_data is the 15th counter
    assert value(text, "fleetsight_infiniband_port_xmit_data_bytes_total", **mlx0) == 4 * xmit_words
    assert value(text, "fleetsight_infiniband_port_rcv_data_bytes_total", **mlx0) == 4 * (base + 8)
    assert value(text, "fleetsight_infiniband_port_symbol_error_total", **mlx0) == base + 18
    assert value(text, "fleetsight_infiniband_port_link_downed_total", **mlx0) == base + 2
    assert value(text, "fleetsight_infiniband_port_link_error_recovery_total", **mlx0) == base + 3
    assert value(text, "fleetsight_infiniband_port_rcv_errors_total", **mlx0) == base + 9
    assert value(text, "fleetsight_infiniband_port_xmit_discards_total", **mlx0) == base + 15
    assert value(text, "fleetsight_infiniband_port_xmit_wait_total", **mlx0) == base + 17
    # Every counter has its own metric (node_exporter's way), hw_counters too; lifespan is a setting.
    assert value(text, "fleetsight_infiniband_port_vl15_dropped_total", **mlx0) == base
    assert value(text, "fleetsight_infiniband_port_unicast_xmit_packets_total", **mlx0) == base + 20
    assert value(text, "fleetsight_infiniband_port_hw_out_of_sequence_total", **mlx0) == 7
    assert "fleetsight_infiniband_port_hw_lifespan_total" not in names(text)
    info = [dict(ls) for (n, ls) in samples(text) if n == "fleetsight_infiniband_port_info"]
    mlx0_info = next(i for i in info if i["device"] == "mlx5_0")
    assert mlx0_info["pci_bdf"] == "0000:19:00.0" and mlx0_info["state"] == "ACTIVE"
    assert mlx0_info["rate"] == "400 Gb/sec (4X NDR)" and mlx0_info["link_layer"] == "InfiniBand"
    # The down port, and the device without a PMA ("N/A (no PMA)": skipped, not an error).
    assert value(text, "fleetsight_infiniband_port_up", device="mlx5_3", port="1") == 0
    assert value(text, "fleetsight_infiniband_port_physical_state", device="mlx5_3", port="1") == 2
    assert value(text, "fleetsight_infiniband_port_xmit_data_bytes_total", device="mlx5_9", port="1") is None
    assert value(text, "fleetsight_infiniband_port_up", device="mlx5_9", port="1") == 1
    assert value(text, "fleetsight_collector_success", collector="infiniband") == 1


def test_garbage_in_sysfs_is_skipped_and_a_missing_tree_is_reported_then_recovered(node, tmp_path):
    counters = node["sys"] / "class" / "infiniband" / "mlx5_1" / "ports" / "1" / "counters"
    (counters / "symbol_error").write_bytes(b"\xff\xfe garbage\n")
    (counters / "link_downed").write_text("")
    text = scrape(agent_for(node, collectors=("infiniband",)))
    assert value(text, "fleetsight_infiniband_port_symbol_error_total", device="mlx5_1", port="1") is None
    assert value(text, "fleetsight_infiniband_port_xmit_data_bytes_total", device="mlx5_1", port="1") > 0

    empty = tmp_path / "empty"
    agent = NodeAgent(
        NodeOptions(
            node="n0002",
            sysfs_root=str(empty / "sys"),
            procfs_root=str(empty / "proc"),
            kmsg_file=str(empty / "kern.log"),
            nvml=False,
            infiniband_required=True,  # (else quiet, as Lustre: below)
        )
    )
    text = scrape(agent)
    for collector in ("pcie", "infiniband", "xid"):  # (Lustre: quiet unless asked for, below)
        assert value(text, "fleetsight_collector_success", collector=collector) == 0, collector
    assert value(text, "fleetsight_collector_errors_total", collector="infiniband", source="sysfs") == 1
    assert value(text, "fleetsight_collector_errors_total", collector="xid", source="file") == 1
    shutil.copytree(node["sys"], empty / "sys", symlinks=True)
    text = scrape(agent)
    assert value(text, "fleetsight_collector_success", collector="infiniband") == 1
    assert value(text, "fleetsight_infiniband_port_up", device="mlx5_0", port="1") == 1
    agent.close()


def xid_count(text: str, code: int, bdf: str) -> float | None:
    return value(text, "fleetsight_gpu_xid_errors_total", xid=str(code), pci_bdf=bdf)


def test_xid_counts_categories_and_gpu_mapping(node, tmp_path):
    gpu_map = tmp_path / "gpus.json"
    gpu_map.write_text(json.dumps([{"gpu": 0, "pci_bdf": "0000:18:00.0", "uuid": "GPU-5d9a6f4e-1c2b"}]))
    text = scrape(agent_for(node, collectors=("xid",), gpu_map_file=str(gpu_map)))
    labels = {
        "xid": "79",
        "pci_bdf": "0000:18:00.0",
        "gpu": "0",
        "uuid": "GPU-5d9a6f4e-1c2b",
        "category": "fallen_off_bus",
        "action": "reboot_node",
    }
    assert value(text, "fleetsight_gpu_xid_errors_total", **labels) == 2
    # The line's own syslog time (2026-11-21T10:00:16Z) is the last time seen.
    assert value(text, "fleetsight_gpu_xid_last_seen_timestamp_seconds", **labels) == 1795255216.0
    assert value(text, "fleetsight_gpu_xid_errors_total", xid="74", category="nvlink") == 1
    assert value(text, "fleetsight_gpu_xid_errors_total", xid="119", category="gsp") == 1
    assert value(text, "fleetsight_gpu_xid_errors_total", xid="48", category="memory_ecc") == 1
    assert value(text, "fleetsight_gpu_xid_errors_total", xid="43", category="application") == 1
    assert value(text, "fleetsight_gpu_xid_errors_total", xid="999", category="unknown") == 1
    assert value(text, "fleetsight_nvswitch_sxid_errors_total", sxid="24007", severity="fatal") == 1
    assert value(text, "fleetsight_nvswitch_sxid_errors_total", sxid="12028", severity="non-fatal") == 1
    assert value(text, "fleetsight_kernel_events_total", kind="lustre_error") == 1
    assert value(text, "fleetsight_kernel_events_total", kind="ib_link_down", pci_bdf="0000:1a:00.0") == 1


def append(path: Path, *lines: str) -> None:
    with open(path, "a") as f:
        f.writelines(line + "\n" for line in lines)


XID_79_GPU3 = (
    "2026-11-21T11:00:00.000000+00:00 n0001 kernel: [ 5000.0] NVRM: Xid (PCI:0000:5d:00): 79, pid=1, name=x, "
    "GPU has fallen off the bus."
)


def test_xid_reader_follows_appends_rotation_and_truncation(node):
    log = node["kern_log"]
    agent = agent_for(node, collectors=("xid",))
    assert xid_count(scrape(agent), 79, "0000:5d:00.0") is None
    append(log, XID_79_GPU3)
    with open(log, "a") as f:
        f.write("2026-11-21T11:00:01+00:00 n0001 kernel: NVRM: Xid (PCI:0000:5d:00): 7")  # no newline yet
    text = scrape(agent)
    assert xid_count(text, 79, "0000:5d:00.0") == 1
    assert xid_count(text, 7, "0000:5d:00.0") is None  # a partial line waits for its end
    # logrotate: the file is renamed (a last line lands in it) and a new one is created.
    os.rename(log, str(log) + ".1")
    append(
        Path(str(log) + ".1"), "9, pid=2, name=y, GPU has fallen off the bus."
    )  # completes the partial line
    append(log, XID_79_GPU3)
    text = scrape(agent)
    assert xid_count(text, 79, "0000:5d:00.0") == 3
    # copytruncate: same file, emptied, then written again up to the same size before the next poll
    # (the reader notices that the bytes before its offset changed).
    log.write_text("")
    append(log, XID_79_GPU3.replace("11:00:00", "11:05:00"))
    assert xid_count(scrape(agent), 79, "0000:5d:00.0") == 4
    agent.close()


def test_a_restarted_agent_does_not_count_old_lines_again(node, tmp_path):
    state_dir = tmp_path / "state"
    first = agent_for(node, collectors=("xid",), state_dir=str(state_dir))
    assert xid_count(scrape(first), 79, "0000:18:00.0") == 2
    first.close()
    second = agent_for(node, collectors=("xid",), state_dir=str(state_dir))
    text = scrape(second)
    assert xid_count(text, 79, "0000:18:00.0") == 2  # restored, not re-counted, not reset
    append(node["kern_log"], XID_79_GPU3)
    assert xid_count(scrape(second), 79, "0000:5d:00.0") == 1
    second.close()
    # A state file that is garbage is reported in the log and the reader starts afresh.
    (state_dir / "xid-n0001.json").write_text("{not json")
    third = agent_for(node, collectors=("xid",), state_dir=str(state_dir))
    assert xid_count(scrape(third), 79, "0000:18:00.0") == 2
    third.close()


def test_lustre_client_and_server_stats(tmp_path):
    proc = tmp_path / "proc"
    shutil.copytree(FIXTURES / "lustre" / "proc", proc)
    paths = {"sys": tmp_path / "sys", "proc": proc, "kern_log": tmp_path / "kern.log"}
    text = scrape(agent_for(paths, collectors=("lustre",)))
    assert value(text, "fleetsight_lustre_client_read_bytes_total", fs="scratch") == 1258291200
    assert value(text, "fleetsight_lustre_client_write_bytes_total", fs="scratch") == 2684354560
    assert value(text, "fleetsight_lustre_client_operations_total", fs="scratch", op="open") == 870
    ost0 = {"fs": "scratch", "target": "OST0000", "component": "osc"}
    assert value(text, "fleetsight_lustre_client_target_read_bytes_total", **ost0) == 629145600
    assert value(text, "fleetsight_lustre_client_rpc_wait_seconds_total", **ost0) == pytest.approx(98.765432)
    assert value(text, "fleetsight_lustre_client_rpcs_in_flight", op="read", **ost0) == 3
    # RPCs sent and pending pages are summed per fs (OST0001 has no rpc_stats in the fixture).
    assert (
        value(text, "fleetsight_lustre_client_rpcs_total", fs="scratch", component="osc", op="write") == 160
    )
    assert (
        value(text, "fleetsight_lustre_client_pending_pages", fs="scratch", component="osc", op="write")
        == 256
    )
    # Op counts are summed over the fs's OSTs: req_waittime 4410 (OST0000) + 12 (OST0001).
    ops = value(
        text,
        "fleetsight_lustre_client_rpc_operations_total",
        fs="scratch",
        component="osc",
        op="req_waittime",
    )
    assert ops == 4422
    assert (
        value(text, "fleetsight_lustre_server_read_bytes_total", fs="scratch", target="OST0001")
        == 95669354496
    )
    assert value(text, "fleetsight_lustre_job_read_bytes_total", hpc_job="4242") is None  # off by default
    text = scrape(agent_for(paths, collectors=("lustre",), lustre_jobstats=True))
    assert (
        value(text, "fleetsight_lustre_job_read_bytes_total", hpc_job="4242", target="OST0001") == 95000000000
    )
    assert value(text, "fleetsight_lustre_job_operations_total", hpc_job="4242", op="punch") == 12


def test_a_host_without_lustre_is_quiet_unless_lustre_was_asked_for(tmp_path):
    paths = {"sys": tmp_path / "sys", "proc": tmp_path / "proc", "kern_log": tmp_path / "kern.log"}
    # On by default everywhere: a GPFS or NFS cluster's nodes must not read as a failing collector.
    text = scrape(agent_for(paths))
    assert value(text, "fleetsight_collector_success", collector="lustre") == 1
    assert not [name for name in names(text) if name.startswith("fleetsight_lustre_")]
    text = scrape(agent_for(paths, collectors=("lustre",), lustre_required=True))
    assert value(text, "fleetsight_collector_success", collector="lustre") == 0


def test_a_host_without_infiniband_is_quiet_unless_infiniband_was_asked_for(node, tmp_path):
    paths = {"sys": tmp_path / "sys", "proc": tmp_path / "proc", "kern_log": tmp_path / "kern.log"}
    # On by default everywhere: a RoCE or Ethernet cluster's nodes without /sys/class/infiniband must
    # not read as a failing collector.
    text = scrape(agent_for(paths))
    assert value(text, "fleetsight_collector_success", collector="infiniband") == 1
    assert value(text, "fleetsight_collector_errors_total", collector="infiniband", source="sysfs") is None
    assert not [name for name in names(text) if name.startswith("fleetsight_infiniband_")]
    agent = agent_for(paths, collectors=("infiniband",), infiniband_required=True)
    text = scrape(agent)
    assert value(text, "fleetsight_collector_success", collector="infiniband") == 0
    assert value(text, "fleetsight_collector_errors_total", collector="infiniband", source="sysfs") == 1
    # The HCA's driver loads later: its ports appear, without a restart.
    shutil.copytree(node["sys"], paths["sys"], symlinks=True)
    text = scrape(agent)
    assert value(text, "fleetsight_collector_success", collector="infiniband") == 1
    assert value(text, "fleetsight_infiniband_port_up", device="mlx5_0", port="1") == 1
    agent.close()


def test_lustre_from_lctl_get_param(tmp_path):
    lctl = tmp_path / "lctl"
    lctl.write_text(
        "#!/bin/sh\n# a stand-in for lctl: prints real get_param output\n"
        f"cat {FIXTURES / 'lustre' / 'lctl_get_param.txt'}\n"
    )
    lctl.chmod(0o755)
    paths = {"sys": tmp_path / "sys", "proc": tmp_path / "proc", "kern_log": tmp_path / "kern.log"}
    text = scrape(agent_for(paths, collectors=("lustre",), lctl=str(lctl)))
    assert value(text, "fleetsight_lustre_client_read_bytes_total", fs="scratch") == 1258291200
    assert value(text, "fleetsight_lustre_client_rpcs_total", fs="scratch", op="read") == 600


def test_pcie_bandwidth_probe_file(node, tmp_path):
    probe = tmp_path / "pcie_bandwidth.json"
    gpus = [
        {
            "gpu": g,
            "pci_bdf": f"0000:{b:02x}:00.0",
            "uuid": f"GPU-{g}",
            "host_to_device_bytes_per_second": 5.3e10,
        }
        for g, b in enumerate([0x18, 0x2A])
    ]
    gpus[1]["host_to_device_bytes_per_second"] = 3.1e9
    probe.write_text(json.dumps({"measured_at": 1795255200.5, "gpus": gpus}))
    agent = agent_for(node, collectors=("probes",), pcie_bandwidth_file=str(probe))
    text = scrape(agent)
    name = "fleetsight_pcie_host_to_device_bandwidth_bytes_per_second"
    assert value(text, name, gpu="1", pci_bdf="0000:2a:00.0", uuid="GPU-1") == 3.1e9
    assert value(text, "fleetsight_pcie_host_to_device_bandwidth_timestamp_seconds", gpu="0") == 1795255200.5
    probe.write_text('{"measured_at": "yesterday", "gpus": []}')
    text = scrape(agent)
    assert value(text, "fleetsight_collector_success", collector="pcie_bandwidth") == 0
    assert (
        value(text, "fleetsight_collector_errors_total", collector="pcie_bandwidth", source="probe_file") == 1
    )
    agent.close()


def test_a_blocked_source_never_blocks_the_scrape_past_its_deadline(node, tmp_path):
    """The kernel log is a FIFO nobody writes to: opening it blocks in the kernel, for real."""
    fifo = tmp_path / "kern.fifo"
    os.mkfifo(fifo)
    agent = NodeAgent(
        NodeOptions(
            node="n0001",
            sysfs_root=str(node["sys"]),
            procfs_root=str(node["proc"]),
            kmsg_file=str(fifo),
            nvml=False,
            deadline_s=0.5,
            collectors=("infiniband", "xid"),
        )
    )
    started = time.monotonic()
    text = scrape(agent)
    assert time.monotonic() - started < 2.0
    assert value(text, "fleetsight_collector_success", collector="xid") == 0
    assert value(text, "fleetsight_collector_errors_total", collector="xid", source="deadline") == 1
    assert value(text, "fleetsight_collector_success", collector="infiniband") == 1
    assert value(text, "fleetsight_infiniband_port_up", device="mlx5_0", port="1") == 1
    # A second scrape while the first gather is still stuck waits on the same gather, not a new one.
    text = scrape(agent)
    assert value(text, "fleetsight_collector_errors_total", collector="xid", source="deadline") == 2
    # Unblock the reader: a writer opens the FIFO; the stuck gather finishes and the agent recovers.
    writer = threading.Thread(target=lambda: fifo.write_text(XID_79_GPU3 + "\n"))
    writer.start()
    writer.join(timeout=5)
    deadline = time.monotonic() + 10
    while value(scrape(agent), "fleetsight_collector_success", collector="xid") != 1:
        assert time.monotonic() < deadline, "the xid collector never recovered after the FIFO opened"
        time.sleep(0.1)
    agent.close()
