"""Which GPU sits at which PCI address: index and UUID by BDF.

Kernel messages (Xid) name a GPU by PCI address only, dashboards by index and UUID. The map comes,
in order of preference, from NVML (on a real GPU node with the optional ``gpu`` extra), from a JSON
file (``--gpu-map``: a list of ``{"gpu", "pci_bdf", "uuid"}``, the layout of the health probe file,
which the twin writes), and finally from the host alone: NVIDIA display/3D controllers in sysfs and
the GPUs the driver lists in ``/proc/driver/nvidia/gpus/<bdf>/information`` (which also gives their
UUIDs), in PCI bus order, which is the order nvidia-smi and ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` number
them.

PCI order alone shifts every index after a GPU that is already gone when the agent starts, and alerts
would then name the wrong GPU. So the map found at a start where no remembered GPU was missing is
saved in the state folder (``gpus-<node>.json``); a later start that misses some of those GPUs keeps
their remembered indices instead of renumbering.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass

from .core import kv, list_dir, read_text
from .state import save_json

log = logging.getLogger("fleetsight.exporters.gpus")

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


def sysfs_bdfs(sysfs_root: str) -> list[str]:
    """PCI addresses of the NVIDIA display/3D controllers in sysfs."""
    devices_dir = os.path.join(sysfs_root, "bus", "pci", "devices")
    found = []
    for name in list_dir(devices_dir):
        vendor = (read_text(os.path.join(devices_dir, name, "vendor")) or "").strip()
        pci_class = (read_text(os.path.join(devices_dir, name, "class")) or "").strip()
        bdf = normalize_bdf(name)
        if bdf and vendor == NVIDIA_VENDOR and pci_class.startswith(GPU_CLASS_PREFIXES):
            found.append(bdf)
    return found


def driver_uuids(procfs_root: str) -> dict[str, str]:
    """``{bdf: uuid}`` of the GPUs the NVIDIA driver lists in ``driver/nvidia/gpus/<bdf>/information``
    (``GPU UUID:  GPU-...``; the UUID is empty where the driver could not read it)."""
    gpus_dir = os.path.join(procfs_root, "driver", "nvidia", "gpus")
    found = {}
    for name in list_dir(gpus_dir):
        bdf = normalize_bdf(name)
        text = read_text(os.path.join(gpus_dir, name, "information"))
        if bdf is None or text is None:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        uuid = fields.get("GPU UUID", "").strip()
        found[bdf] = uuid if uuid.startswith("GPU-") else ""
    return found


def from_sysfs(sysfs_root: str, procfs_root: str | None = None) -> list[Gpu]:
    """The host's GPUs in PCI bus order (with UUIDs where the driver's information files give them)."""
    uuids = driver_uuids(procfs_root) if procfs_root else {}
    bdfs = sorted(set(sysfs_bdfs(sysfs_root)) | set(uuids))
    return [Gpu(i, bdf, uuids.get(bdf, "")) for i, bdf in enumerate(bdfs)]


def remembered(found: list[Gpu], state_file: str | None, save: bool = True) -> list[Gpu]:
    """The GPU map to use given what this start found and what a healthy start saved.

    - nothing saved, or every remembered GPU is here (a healthy start, maybe with more GPUs), or none
      of them is (another machine, a new board): this start's numbering, saved for next time;
    - some remembered GPUs are missing: their remembered indices stand, and so do the others' (a GPU
      not remembered gets the next free index); nothing is saved, so the healthy map survives.
    """
    saved = _load_map(state_file)
    here = {g.pci_bdf for g in found}
    before = {g.pci_bdf for g in saved}
    if not saved or before <= here or not before & here:
        if found and state_file and save and saved != found:
            try:
                save_json(state_file, [{"gpu": g.index, "pci_bdf": g.pci_bdf, "uuid": g.uuid} for g in found])
            except OSError as exc:
                log.warning(kv(event="gpu_map_unsaved", file=state_file, error=repr(exc)))
        return found
    missing = sorted(before - here)
    log.warning(kv(event="gpu_missing_at_start", missing=",".join(missing), map_from=state_file))
    uuids = {g.pci_bdf: g.uuid for g in found}
    merged = [Gpu(g.index, g.pci_bdf, uuids.get(g.pci_bdf) or g.uuid) for g in saved]
    next_index = max(g.index for g in saved) + 1
    for gpu in found:
        if gpu.pci_bdf not in before:
            merged.append(Gpu(next_index, gpu.pci_bdf, gpu.uuid))
            next_index += 1
    return merged


def _load_map(state_file: str | None) -> list[Gpu]:
    if not state_file:
        return []
    return from_json_file(state_file)


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


def discover(
    sysfs_root: str,
    map_files: list[str],
    use_nvml: bool,
    procfs_root: str | None = None,
    state_file: str | None = None,
    save_state: bool = True,
) -> GpuMap:
    if use_nvml:
        gpus = from_nvml()
        if gpus:
            return GpuMap(gpus)
    for path in map_files:
        gpus = from_json_file(path)
        if gpus:
            return GpuMap(gpus)
    return GpuMap(remembered(from_sysfs(sysfs_root, procfs_root), state_file, save_state))
