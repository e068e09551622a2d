"""On a machine with real NVIDIA GPUs: the node agent's GPU map and PCIe host-to-device probe, measured.

Prints, per GPU: the index and UUID from NVML, the index the agent would give from sysfs PCI order
without NVML, the driver's own /proc/driver/nvidia/gpus/<bdf>/information, the PCIe link speed and width
the agent reads (current and max), and the host-to-device bandwidth the CUDA probe measures. Then one
scrape of the node agent on the real /sys and /proc.

Run: python bench/device_probe.py [--copies N]
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from exporters import gpus, probes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="Probe measurements per GPU.")
    args = parser.parse_args()

    nvml = gpus.from_nvml()
    sysfs = gpus.from_sysfs("/sys", "/proc")
    print(f"NVML sees {len(nvml)} GPU(s); sysfs order gives {len(sysfs)}")
    for gpu in nvml:
        by_sysfs = next((g for g in sysfs if g.pci_bdf == gpu.pci_bdf), None)
        print(
            f"  nvml gpu={gpu.index} bdf={gpu.pci_bdf} uuid={gpu.uuid}"
            f"  sysfs index={by_sysfs and by_sysfs.index}"
            f" uuid={by_sysfs and by_sysfs.uuid}"
        )
    for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        print(f"--- {info}\n{Path(info).read_text().rstrip()}")

    probe = probes.CudaBandwidthProbe()
    for round_index in range(args.rounds):
        started = time.perf_counter()
        for entry in probe.measure():
            gbps = entry["host_to_device_bytes_per_second"] / 1e9
            print(f"  round {round_index}: {entry['pci_bdf']} host->device {gbps:.1f} GB/s")
        print(f"  round {round_index} took {time.perf_counter() - started:.2f} s")

    command = ["exporter", "node", "--once", "--no-state", "--node", "gpu-host"]
    agent = subprocess.run(
        [sys.executable, "-m", "fleetsight.cli", *command], capture_output=True, text=True, timeout=120
    )
    wanted = ("fleetsight_pcie_link", "fleetsight_collector_success", "fleetsight_infiniband_port_up")
    print(f"node agent exit {agent.returncode}")
    for line in agent.stdout.splitlines():
        if line.startswith(wanted):
            print("  " + line)
    if agent.returncode:
        print(agent.stderr[-2000:])


if __name__ == "__main__":
    main()
