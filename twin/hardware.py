"""The hardware of one node SKU and the cluster's topology: PCI addresses, device ids, IB devices,
GUIDs, racks, scalable units and the rail-optimised leaf switches each HCA port plugs into.

Addresses and ids follow a DGX H100-like node: 8 H100 SXM5 GPUs behind PCIe Gen5 switches,
8 compute + 2 storage ConnectX-7 NDR ports, NVMe drives, 4 NVSwitches.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass

from .scenario_model import ClusterSpec, node_names

GPU_MODEL = "NVIDIA H100 80GB HBM3"
GPU_TDP_W = 700.0
GPU_IDLE_W = 72.0
GPU_MAX_SM_CLOCK = 1980.0
GPU_MEM_CLOCK = 2619.0
GPU_FB_MIB = 81559
DRIVER_VERSION = "535.161.08"

GPU_BDFS = (
    "0000:18:00.0",
    "0000:2a:00.0",
    "0000:3a:00.0",
    "0000:5d:00.0",
    "0000:9a:00.0",
    "0000:ab:00.0",
    "0000:ba:00.0",
    "0000:db:00.0",
)
# mlx5_0..mlx5_7: compute rails (one per GPU), mlx5_8, mlx5_9: storage fabric.
HCA_BDFS = (
    "0000:1a:00.0",
    "0000:2c:00.0",
    "0000:3c:00.0",
    "0000:5e:00.0",
    "0000:9c:00.0",
    "0000:ad:00.0",
    "0000:bc:00.0",
    "0000:dc:00.0",
    "0000:29:00.0",
    "0000:a9:00.0",
)
IB_DEVICES = tuple(f"mlx5_{i}" for i in range(len(HCA_BDFS)))
COMPUTE_PORTS = 8
NVME_BDFS = tuple(
    f"0000:{bus:02x}:00.0" for bus in (0x1C, 0x1D, 0x2E, 0x2F, 0x9E, 0x9F, 0xAE, 0xAF, 0x4E, 0x4F)
)
PCIE_SWITCH_BDFS = ("0000:15:00.0", "0000:35:00.0", "0000:95:00.0", "0000:b5:00.0")
NVSWITCH_BDFS = ("0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0")

PCIE_GEN_SPEED = {
    1: "2.5 GT/s PCIe",
    2: "5.0 GT/s PCIe",
    3: "8.0 GT/s PCIe",
    4: "16.0 GT/s PCIe",
    5: "32.0 GT/s PCIe",
}
# Usable host-to-device bandwidth per lane in bytes/s (after encoding and protocol overhead).
PCIE_GEN_LANE_BYTES = {1: 0.20e9, 2: 0.40e9, 3: 0.82e9, 4: 1.65e9, 5: 3.30e9}


@dataclass(frozen=True)
class PciDevice:
    bdf: str
    kind: str  # gpu, hca, nvme, pcie_switch, nvswitch
    index: int
    vendor: str
    device: str
    pci_class: str
    gen: int
    width: int


def pci_devices() -> list[PciDevice]:
    """Every PCI function the twin models on one node, GPUs first."""
    devices = [PciDevice(b, "gpu", i, "0x10de", "0x2330", "0x030200", 5, 16) for i, b in enumerate(GPU_BDFS)]
    devices += [PciDevice(b, "hca", i, "0x15b3", "0x1021", "0x020700", 5, 16) for i, b in enumerate(HCA_BDFS)]
    devices += [
        PciDevice(b, "nvme", i, "0x144d", "0xa824", "0x010802", 4, 4) for i, b in enumerate(NVME_BDFS)
    ]
    devices += [
        PciDevice(b, "pcie_switch", i, "0x1000", "0xc030", "0x060400", 5, 16)
        for i, b in enumerate(PCIE_SWITCH_BDFS)
    ]
    devices += [
        PciDevice(b, "nvswitch", i, "0x10de", "0x22a3", "0x068000", 4, 2) for i, b in enumerate(NVSWITCH_BDFS)
    ]
    return devices


def netdev_name(bdf: str) -> str:
    """The IPoIB netdev name systemd gives the HCA at this address (ibp<bus>s0)."""
    return f"ibp{int(bdf.split(':')[1], 16)}s0"


def nvml_bus_id(bdf: str) -> str:
    """NVML's 8-hex-digit-domain form, as dcgm-exporter's pci_bus_id label shows it."""
    return "0000" + bdf.upper().replace("0000:", "0000:", 1)


def xid_bus_id(bdf: str) -> str:
    """The NVRM Xid form: domain:bus:device without the function."""
    return bdf.rsplit(".", 1)[0]


def _digest(*parts: object) -> bytes:
    return hashlib.sha256("/".join(map(str, parts)).encode()).digest()


def gpu_uuid(seed: int, node: str, gpu: int) -> str:
    return "GPU-" + str(uuid.UUID(bytes=_digest("gpu", seed, node, gpu)[:16]))


def hca_guid(seed: int, node: str, device: int) -> str:
    """A ConnectX-7 GUID (NVIDIA OUI a088c2), 16 hex digits."""
    return "a088c203" + _digest("hca", seed, node, device)[:4].hex()


def switch_guid(seed: int, name: str) -> str:
    return "fc6a1c03" + _digest("switch", seed, name)[:4].hex()


def sysfs_guid(guid: str) -> str:
    """sysfs writes GUIDs as four groups of four hex digits."""
    return ":".join(guid[i : i + 4] for i in range(0, 16, 4))


@dataclass(frozen=True)
class Topology:
    """Where every node sits and which leaf switch port each of its HCA ports is cabled to."""

    cluster: ClusterSpec
    seed: int
    nodes: tuple[str, ...]

    @classmethod
    def build(cls, cluster: ClusterSpec, seed: int) -> Topology:
        return cls(cluster, seed, tuple(node_names(cluster.nodes)))

    def rack(self, index: int) -> str:
        return f"r{index // self.cluster.nodes_per_rack + 1:03d}"

    def su(self, index: int) -> str:
        return f"su{index // self.cluster.nodes_per_su + 1:02d}"

    def leaf(self, index: int, device: int) -> tuple[str, int]:
        """Rail-optimised: in each scalable unit, rail r of every node goes to leaf r; storage ports
        go to the storage fabric's leaves. Returns (switch name, port number)."""
        su = index // self.cluster.nodes_per_su + 1
        slot = index % self.cluster.nodes_per_su
        if device < COMPUTE_PORTS:
            return f"leaf-su{su:02d}-rail{device}", slot + 1
        return f"sleaf-su{su:02d}-{device - COMPUTE_PORTS}", slot + 1

    def leaves(self) -> list[str]:
        units = (len(self.nodes) + self.cluster.nodes_per_su - 1) // self.cluster.nodes_per_su
        names = []
        for su in range(1, units + 1):
            names += [f"leaf-su{su:02d}-rail{r}" for r in range(COMPUTE_PORTS)]
            names += [f"sleaf-su{su:02d}-{s}" for s in range(len(IB_DEVICES) - COMPUTE_PORTS)]
        return names
