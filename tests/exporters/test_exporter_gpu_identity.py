"""GPU indices stay the GPUs' own when one is already gone at agent start: the map of a healthy start
is remembered in the state folder, and the driver's per-GPU information files count too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from exporter_helpers import GPU_BUSES, NodeSpec, build_node, value, write

from exporters.node import NodeAgent, NodeOptions


def xid_line(bus: int) -> str:
    return (
        f"2026-11-21T11:00:00+00:00 n0001 kernel: NVRM: Xid (PCI:0000:{bus:02x}:00): 79, pid=1, "
        "name=python3, GPU has fallen off the bus."
    )


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Path]:
    paths = build_node(tmp_path / "n0001", NodeSpec(gpus=4, ib_devices=0, oscs=0))
    # Xids on the third and the fourth GPU: their indices are what must not shift.
    write(paths["kern_log"], xid_line(GPU_BUSES[2]) + "\n" + xid_line(GPU_BUSES[3]) + "\n")
    return {**paths, "state": tmp_path / "state"}


def scrape(host: dict[str, Path], state: bool = True, once: bool = False) -> str:
    agent = NodeAgent(
        NodeOptions(
            node="n0001",
            sysfs_root=str(host["sys"]),
            procfs_root=str(host["proc"]),
            kmsg_file=str(host["kern_log"]),
            kernel_log_format="syslog",
            nvml=False,
            collectors=("pcie", "xid"),
            state_dir=str(host["state"]) if state else None,
            state_read_only=once,
        )
    )
    try:
        return agent.scrape().decode()
    finally:
        agent.close()


def remove_gpu(host: dict[str, Path], bus: int) -> None:
    """The GPU is gone before the agent starts (not enumerated at boot, or removed from the bus)."""
    link = host["sys"] / "bus" / "pci" / "devices" / f"0000:{bus:02x}:00.0"
    shutil.rmtree(link.resolve())
    link.unlink()


def xid_gpu(text: str, bus: int) -> str | None:
    found = [
        line
        for line in text.splitlines()
        if line.startswith("fleetsight_gpu_xid_errors_total{") and f'pci_bdf="0000:{bus:02x}:00.0"' in line
    ]
    assert len(found) == 1, found
    return found[0].split('gpu="', 1)[1].split('"', 1)[0]


def test_a_gpu_gone_at_start_keeps_every_other_gpus_index(host):
    healthy = scrape(host)
    assert xid_gpu(healthy, GPU_BUSES[3]) == "3"
    saved = json.loads((host["state"] / "gpus-n0001.json").read_text())
    assert [g["pci_bdf"] for g in saved] == [f"0000:{b:02x}:00.0" for b in GPU_BUSES[:4]]

    remove_gpu(host, GPU_BUSES[1])
    text = scrape(host)
    # PCI order alone would now call the fourth GPU "2": the remembered map keeps it "3".
    assert xid_gpu(text, GPU_BUSES[3]) == "3"
    assert xid_gpu(text, GPU_BUSES[2]) == "2"
    assert value(text, "fleetsight_pcie_link_width", pci_bdf=f"0000:{GPU_BUSES[3]:02x}:00.0", gpu="3") == 16
    # The degraded start did not overwrite the healthy map.
    assert json.loads((host["state"] / "gpus-n0001.json").read_text()) == saved


def test_without_a_remembered_map_pci_order_shifts(host):
    remove_gpu(host, GPU_BUSES[1])
    assert xid_gpu(scrape(host, state=False), GPU_BUSES[3]) == "2"  # why the map is remembered


def test_the_drivers_information_files_keep_a_gpu_the_bus_lost_and_give_uuids(host):
    for i, bus in enumerate(GPU_BUSES[:4]):
        write(
            host["proc"] / "driver" / "nvidia" / "gpus" / f"0000:{bus:02x}:00.0" / "information",
            f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 17{i}\n"
            f"GPU UUID: \t GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd\n"
            f"Video BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
            f"Bus Location: \t 0000:{bus:02x}:00.0\nDevice Minor: \t {i}\nGPU Excluded:\t No\n",
        )
    remove_gpu(host, GPU_BUSES[1])  # gone from sysfs, still known to the driver
    text = scrape(host, state=False)
    assert xid_gpu(text, GPU_BUSES[3]) == "3"
    assert (
        value(
            text,
            "fleetsight_gpu_xid_errors_total",
            pci_bdf=f"0000:{GPU_BUSES[3]:02x}:00.0",
            uuid="GPU-00000003-aaaa-bbbb-cccc-dddddddddddd",
        )
        == 1
    )


def test_a_new_board_or_a_once_run_does_not_keep_a_stale_map(host):
    # A map remembered from another board: none of its GPUs is here, so this host's own numbering
    # is used and saved.
    stale = [{"gpu": i, "pci_bdf": f"0000:{0xC1 + i:02x}:00.0", "uuid": ""} for i in range(8)]
    write(host["state"] / "gpus-n0001.json", json.dumps(stale))
    assert xid_gpu(scrape(host), GPU_BUSES[3]) == "3"
    saved = json.loads((host["state"] / "gpus-n0001.json").read_text())
    assert [g["pci_bdf"] for g in saved] == [f"0000:{b:02x}:00.0" for b in GPU_BUSES[:4]]
    # --once reads the state folder but never writes it.
    remove_gpu(host, GPU_BUSES[0])
    assert xid_gpu(scrape(host, once=True), GPU_BUSES[3]) == "3"
    write(host["state"] / "gpus-n0001.json", json.dumps(stale))
    scrape(host, once=True)
    assert json.loads((host["state"] / "gpus-n0001.json").read_text()) == stale
