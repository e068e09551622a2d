"""Health probes: the host-to-device PCIe bandwidth of each GPU, measured now and then.

IBM's Autopilot found degraded PCIe links by measuring copy bandwidth (a Gen5 x16 link moves ~50 GB/s;
a downgraded one a few GB/s). Two ways to get the figure:

* ``file``: read ``{"measured_at": <unix s>, "gpus": [{"gpu", "pci_bdf", "uuid",
  "host_to_device_bytes_per_second"}]}`` (written by a probe job, or by the digital twin);
* ``cuda``: measure here, through the CUDA driver API (``libcuda.so.1``, present wherever the NVIDIA
  driver is; no toolkit needed), in a background thread every ``interval_s``. A measurement copies
  256 MiB from pinned host memory a few times per GPU: cheap, but it does compete with a running job,
  so keep the interval long (default one hour) or run it between jobs.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from typing import Any

from prometheus_client.core import Metric

from fleetsight.cuda import CudaDriver

from .core import Problems, Source, kv, read_text, register_collector
from .exposition import Families
from .gpus import GpuMap, normalize_bdf

log = logging.getLogger("fleetsight.exporters.probes")

COPY_BYTES = 256 << 20
COPIES = 5


def parse_bandwidth_file(text: str) -> tuple[float, list[dict]]:
    """``(measured_at, gpus)``; raises ValueError on a malformed document."""
    data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
        raise ValueError("expected an object with a 'gpus' list")
    measured_at = data.get("measured_at")
    if isinstance(measured_at, bool) or not isinstance(measured_at, int | float):
        raise ValueError("'measured_at' must be a number")
    gpus = []
    for entry in data["gpus"]:
        if not isinstance(entry, dict):
            raise ValueError("each GPU entry must be an object")
        value = entry.get("host_to_device_bytes_per_second")
        index = entry.get("gpu")
        if isinstance(value, bool) or not isinstance(value, int | float) or not isinstance(index, int):
            raise ValueError(f"GPU entry {entry!r} lacks a numeric gpu/host_to_device_bytes_per_second")
        gpus.append(entry)
    return float(measured_at), gpus


class CudaBandwidthProbe:
    """Host-to-device copy bandwidth per GPU through the CUDA driver API (``fleetsight.cuda``)."""

    def __init__(self) -> None:
        self.driver = CudaDriver()

    def measure(self) -> list[dict]:
        return [self._measure_one(ordinal) for ordinal in range(self.driver.device_count())]

    def _measure_one(self, ordinal: int) -> dict:
        driver = self.driver
        bus_id = driver.pci_bus_id(ordinal)
        with (
            driver.primary_context(ordinal),
            driver.pinned_memory(COPY_BYTES) as host,
            driver.device_memory(COPY_BYTES) as dev,
        ):
            driver.copy_to_device(dev, host, COPY_BYTES)  # warm-up: page tables, link wake-up
            driver.synchronize()
            started = time.perf_counter()
            for _ in range(COPIES):
                driver.copy_to_device(dev, host, COPY_BYTES)
            driver.synchronize()
            elapsed = time.perf_counter() - started
        return {
            "pci_bdf": normalize_bdf(bus_id) or bus_id,
            "host_to_device_bytes_per_second": COPY_BYTES * COPIES / elapsed,
        }


class PcieBandwidthSource(Source):
    name = "pcie_bandwidth"

    def __init__(
        self, gpu_map: GpuMap, path: str | None, mode: str = "file", interval_s: float = 3600.0
    ) -> None:
        self.gpu_map, self.path, self.mode, self.interval_s = gpu_map, path, mode, interval_s
        self.latest: tuple[float, list[dict]] | None = None
        self.probe_error = ""
        if mode == "cuda":
            threading.Thread(target=self._probe_loop, name="pcie-probe", daemon=True).start()

    def _probe_loop(self) -> None:
        while True:
            try:
                results = CudaBandwidthProbe().measure()
                for entry in results:
                    gpu = self.gpu_map.lookup(entry["pci_bdf"])
                    entry["gpu"], entry["uuid"] = (gpu.index, gpu.uuid) if gpu else (-1, "")
                self.latest, self.probe_error = (time.time(), results), ""
                if self.path:
                    self._save()
                log.info(kv(event="pcie_probe_done", gpus=len(results)))
            except (OSError, RuntimeError) as exc:
                self.probe_error = str(exc)
                log.warning(kv(event="pcie_probe_failed", error=str(exc)))
            time.sleep(self.interval_s)

    def _save(self) -> None:
        assert self.latest is not None and self.path
        measured_at, gpus = self.latest
        folder = os.path.dirname(os.path.abspath(self.path))
        with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, suffix=".tmp") as tmp:
            json.dump({"measured_at": measured_at, "gpus": gpus}, tmp)
        os.replace(tmp.name, self.path)

    def gather(self, problems: Problems) -> list[Metric]:
        if self.mode == "file":
            text = read_text(self.path or "", limit=1 << 20)
            if text is None:
                problems.add("probe_file", f"{self.path} is missing")
                return []
            try:
                self.latest = parse_bandwidth_file(text)
            except ValueError as exc:
                problems.add("probe_file", f"{self.path}: {exc}")
                return []
        elif self.probe_error:
            problems.add("cuda", self.probe_error)
        if self.latest is None:
            return []
        measured_at, gpus = self.latest
        f = Families()
        labels = ["gpu", "pci_bdf", "uuid"]
        bandwidth = f.gauge(
            "fleetsight_pcie_host_to_device_bandwidth_bytes_per_second",
            "Host-to-device copy bandwidth measured by the health probe.",
            labels,
        )
        stamp = f.gauge(
            "fleetsight_pcie_host_to_device_bandwidth_timestamp_seconds",
            "Unix time of the health probe's measurement.",
            labels,
        )
        for entry in gpus:
            bdf = normalize_bdf(str(entry.get("pci_bdf", ""))) or ""
            known = self.gpu_map.lookup(bdf)
            uuid = str(entry.get("uuid") or (known.uuid if known else ""))
            values = [str(entry["gpu"]), bdf, uuid]
            bandwidth.add_metric(values, float(entry["host_to_device_bytes_per_second"]))
            stamp.add_metric(values, measured_at)
        return f.all()


@register_collector("probes", position=60)
def probes_collector(opts: Any, gpu_map: GpuMap) -> Source | None:
    """The PCIe bandwidth probe: from a results file, by CUDA, or off (``auto``: the file when given)."""
    probe = opts.pcie_probe
    if probe == "auto":
        probe = "file" if opts.pcie_bandwidth_file else "off"
    if probe == "off":
        return None
    return PcieBandwidthSource(gpu_map, opts.pcie_bandwidth_file, probe, opts.pcie_probe_interval_s)
