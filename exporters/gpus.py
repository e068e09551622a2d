"""Which GPU sits at which PCI address: index and UUID by BDF.

Kernel messages (Xid) name a GPU by PCI address only, dashboards by index and UUID. The map comes,
in order of preference, from NVML (on a real GPU node with the optional ``gpu`` extra), from a JSON
file (``--gpu-map``: a list of ``{"gpu", "pci_bdf", "uuid"}``, the layout of the health probe file,
which the twin writes), and finally from sysfs alone: NVIDIA display/3D controllers in PCI bus order,
which is the order nvidia-smi and ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` number them (no UUID then).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from exporters.core import list_dir, read_text

NVIDIA_VENDOR = "0x10de"
GPU_CLASS_PREFIXES = ("0x0300", "0x0302")  # VGA controller, 3D controller

_BDF = re.compile(r"^(?:PCI:)?([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.([0-7]))?$")


def normalize_bdf(text: str) -> str | None:
    """``0000:18:00.0`` from the forms drivers print: ``PCI:0000:18:00``, ``00000000:18:00.0``."""
    match = _BDF.match(text.strip())
    if not match:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function or '0'}"


@dataclass(frozen=True)
class Gpu:
    index: int
    pci_bdf: str
    uuid: str = ""


class GpuMap:
    def __init__(self, gpus: list[Gpu]) -> None:
        self.by_bdf = {g.pci_bdf: g for g in gpus}

    def lookup(self, bdf: str) -> Gpu | None:
        return self.by_bdf.get(bdf)

    def __len__(self) -> int:
        return len(self.by_bdf)


def from_json_file(path: str) -> list[Gpu]:
    """GPUs from a ``--gpu-map`` file or the health probe file (``{"gpus": [...]}`` or a list)."""
    text = read_text(path, limit=1 << 20)
    if text is None:
        return []
    try:
        data = json.loads(text)
    except ValueError:
        return []
    return from_entries(data.get("gpus", []) if isinstance(data, dict) else data)


def from_entries(entries: object) -> list[Gpu]:
    """GPUs from ``[{"gpu": 0, "pci_bdf": "0000:18:00.0", "uuid": "GPU-..."}, ...]``; odd entries skipped."""
    gpus = []
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        bdf = normalize_bdf(str(entry.get("pci_bdf", "")))
        index = entry.get("gpu")
        if bdf is None or not isinstance(index, int):
            continue
        gpus.append(Gpu(index, bdf, str(entry.get("uuid", ""))))
    return gpus


def from_sysfs(sysfs_root: str) -> list[Gpu]:
    devices_dir = os.path.join(sysfs_root, "bus", "pci", "devices")
    found = []
    for name in list_dir(devices_dir):
        vendor = (read_text(os.path.join(devices_dir, name, "vendor")) or "").strip()
        pci_class = (read_text(os.path.join(devices_dir, name, "class")) or "").strip()
        bdf = normalize_bdf(name)
        if bdf and vendor == NVIDIA_VENDOR and pci_class.startswith(GPU_CLASS_PREFIXES):
            found.append(bdf)
    return [Gpu(i, bdf) for i, bdf in enumerate(sorted(found))]


def from_nvml() -> list[Gpu]:
    """GPUs as NVML numbers them; empty where NVML (the ``gpu`` extra, a driver) is missing."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded...
        return []
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            bus_id = pynvml.nvmlDeviceGetPciInfo(handle).busId
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            bus_id = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            bdf = normalize_bdf(bus_id)
            if bdf:
                gpus.append(Gpu(index, bdf, uuid))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def discover(sysfs_root: str, map_files: list[str], use_nvml: bool) -> GpuMap:
    if use_nvml:
        gpus = from_nvml()
        if gpus:
            return GpuMap(gpus)
    for path in map_files:
        gpus = from_json_file(path)
        if gpus:
            return GpuMap(gpus)
    return GpuMap(from_sysfs(sysfs_root))
