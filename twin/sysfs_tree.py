"""Each node's sysfs as a real host has it: the PCI functions with their links' speed and width (a GPU
that fell off the bus reads all-ones), the InfiniBand HCAs with their GUIDs, ports, states, rates and
counters.

Its own module: the sysfs layout changes with the kernel's and the HCAs' drivers, apart from the
Lustre client's files (twin/lustre_client_files.py) and the logs (twin/log_files.py). Per tick it
compares the port and link values as arrays with what it last wrote and formats only those that
changed (a node has ~860 files; twin/file_cache.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import hardware as hw
from .file_cache import FileCache, write_static
from .sim import Simulation

IB_STATE = {True: "4: ACTIVE", False: "1: DOWN"}
IB_PHYS = {True: "5: LinkUp", False: "3: Disabled"}
IB_RATE = {4: "400 Gb/sec (4X NDR)", 2: "200 Gb/sec (2X NDR)", 1: "100 Gb/sec (1X NDR)"}
IB_RATE_DOWN = "10 Gb/sec (4X SDR)"
IB_SPEED_NAME = {100: "NDR", 50: "HDR", 25: "EDR"}  # Gb/s per lane -> the name the kernel prints


def ib_rate_text(width: int, lane_gbps: int) -> str:
    """The port's ``rate`` as the kernel writes it (ib_core's rate_show): ``200 Gb/sec (2X NDR)``,
    ``200 Gb/sec (4X HDR)``."""
    return f"{width * lane_gbps} Gb/sec ({width}X {IB_SPEED_NAME.get(lane_gbps, 'NDR')})"


class SysfsTree:
    """The sysfs files of every node under its root (OUT/nodes/<node>/sys)."""

    def __init__(self, cache: FileCache, sim: Simulation, node_roots: list[str]) -> None:
        self.cache = cache
        self.sim = sim
        self.node_roots = node_roots
        self.port_dirs = [
            [f"{root}/sys/class/infiniband/{name}/ports/1" for name in hw.IB_DEVICES]
            for root in self.node_roots
        ]
        # The GPU index of each PCI function (-1: not a GPU), to tell which fell off the bus.
        self.pci_gpu_column = np.array([d.index if d.kind == "gpu" else -1 for d in sim.pci])
        self.written: dict[str, np.ndarray] = {}  # per-tick values last written, by file kind

    def create(self, index: int, root: Path) -> None:
        """The node's PCI functions and IB devices, with the files that never change."""
        sim = self.sim
        node = sim.nodes[index]
        for device in sim.pci:
            base = root / "sys/bus/pci/devices" / device.bdf
            base.mkdir(exist_ok=True)
            write_static(
                self.cache, base, vendor=device.vendor, device=device.device, **{"class": device.pci_class}
            )
            write_static(
                self.cache,
                base,
                max_link_speed=hw.PCIE_GEN_SPEED[device.gen],
                max_link_width=str(device.width),
            )
        for port, name in enumerate(hw.IB_DEVICES):
            base = root / "sys/class/infiniband" / name
            (base / "ports/1/counters").mkdir(parents=True, exist_ok=True)
            (base / "ports/1/hw_counters").mkdir(parents=True, exist_ok=True)
            guid = hw.hca_guid(sim.scenario.seed, node, port)
            write_static(
                self.cache,
                base,
                node_guid=hw.sysfs_guid(guid),
                sys_image_guid=hw.sysfs_guid(guid),
                fw_ver="28.39.1002",
                hca_type="MT4129",
                board_id="MT_0000000838",
                node_desc=f"{node} {name}",
                node_type="1: CA",
            )
            link = base / "device"
            if not link.is_symlink():
                link.symlink_to(f"../../../bus/pci/devices/{hw.HCA_BDFS[port]}")
            write_static(
                self.cache,
                base / "ports/1",
                link_layer="InfiniBand",
                lid=f"0x{index * 16 + port + 1:x}",
                sm_lid="0x1",
                lid_mask_count="0",
                cap_mask="0xa751e84a",
            )

    def write(self, alive: np.ndarray) -> None:
        """The IB ports' states and counters and the PCIe links that changed, on live hosts."""
        self._write_ib_links(alive)
        self._write_ib_counters(alive)
        self._write_pci(alive)

    def _changed(self, key: str, values: np.ndarray, alive: np.ndarray) -> tuple[list, list, list]:
        """(nodes, columns, values) where values differ from the last written ones, on live hosts."""
        last = self.written.get(key)
        if last is None:  # the type's largest value stands for "never written": no value reaches it
            self.written[key] = last = np.full_like(values, np.iinfo(values.dtype).max)
        changed = (values != last) & alive
        nodes, columns = np.nonzero(changed)
        fresh = values[nodes, columns]
        last[nodes, columns] = fresh
        return nodes.tolist(), columns.tolist(), fresh.tolist()

    def _write_ib_links(self, alive: np.ndarray) -> None:
        sim = self.sim
        put = self.cache.put
        # -1: down, whatever the width; else width * 1000 + the lane's Gb/s (a downshift of either shows)
        link = np.where(sim.ib_up, sim.ib_width.astype(np.int64) * 1000 + sim.ib_speed, -1)
        for node, port, code in zip(*self._changed("link", link, alive), strict=True):
            base = self.port_dirs[node][port]
            up = code >= 0
            put(f"{base}/state", IB_STATE[up] + "\n")
            put(f"{base}/phys_state", IB_PHYS[up] + "\n")
            put(f"{base}/rate", (ib_rate_text(code // 1000, code % 1000) if up else IB_RATE_DOWN) + "\n")

    def _write_ib_counters(self, alive: np.ndarray) -> None:
        sim = self.sim
        put = self.cache.put
        for group, counters in (("counters", sim.ib_counters), ("hw_counters", sim.ib_hw_counters)):
            for counter, values in counters.items():
                key = f"{group}/{counter}"
                for node, port, value in zip(*self._changed(key, values, alive), strict=True):
                    put(f"{self.port_dirs[node][port]}/{key}", f"{value}\n")

    def _write_pci(self, alive: np.ndarray) -> None:
        sim = self.sim
        put = self.cache.put
        # A device that fell off the bus reads all-ones config space: speed Unknown, width 63.
        gone = self.pci_gpu_column[None, :] >= 0
        gone = gone & ~sim.gpu_present[:, np.maximum(self.pci_gpu_column, 0)]
        link = np.where(gone, -1, sim.pci_gen.astype(np.int64) * 1000 + sim.pci_width)
        for node, d, code in zip(*self._changed("pci", link, alive), strict=True):
            base = f"{self.node_roots[node]}/sys/bus/pci/devices/{sim.pci[d].bdf}"
            speed = "Unknown" if code < 0 else hw.PCIE_GEN_SPEED[code // 1000]
            width = "63" if code < 0 else str(code % 1000)
            put(f"{base}/current_link_speed", speed + "\n")
            put(f"{base}/current_link_width", width + "\n")
