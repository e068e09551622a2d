"""On a machine with real NVIDIA GPUs: the node agent's GPU map and PCIe host-to-device probe, measured.

Prints, per GPU: the index and UUID from NVML, the index the agent would give from sysfs PCI order
without NVML, the driver's own /proc/driver/nvidia/gpus/<bdf>/information, the PCIe link speed and width
the agent reads (current and max), and the host-to-device bandwidth the CUDA probe measures. Then one
scrape of the node agent on the real /sys and /proc. Last, the checks' GPU probe (checks/gpu_probe.py,
`fleetsight-gpu-probe`): its gemm (bf16) and hbm lines as printed, and the verdict of the catalogue's
gemm_throughput / hbm_bandwidth on them, for docs/checks.md's measured figures.

Run: python bench/device_probe.py [--rounds N] [--probe-seconds S] [--gpu-probe-only]
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

from checks import parsers
from checks.catalog import load_catalog
from exporters import gpus, probes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="Probe measurements per GPU.")
    parser.add_argument("--probe-seconds", type=float, default=10.0, help="Seconds per GPU probe test.")
    parser.add_argument("--gpu-probe-only", action="store_true", help="Only the checks' GPU probe.")
    args = parser.parse_args()
    if args.gpu_probe_only:
        gpu_probe(args.probe_seconds)
        return

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
    gpu_probe(args.probe_seconds)


def gpu_probe(seconds: float) -> None:
    """The checks' GPU probe as the catalogue runs it (shorter), its lines and the catalogue's verdict."""
    catalog = load_catalog()
    for check, test in (("gemm_throughput", ["gemm", "--dtype", "bf16"]), ("hbm_bandwidth", ["hbm"])):
        command = [sys.executable, "-m", "checks.gpu_probe", *test, "--seconds", str(seconds)]
        print(f"--- {' '.join(command[1:])}")
        started = time.perf_counter()
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=3 * seconds + 120, cwd=REPO
            )
        except subprocess.TimeoutExpired as exc:
            print(f"  timed out after {exc.timeout:.0f} s")
            continue
        for line in done.stdout.splitlines():
            print("  " + line)
        if done.stderr.strip():
            print("  stderr: " + done.stderr.strip()[-2000:])
        verdict = parsers.probe_lines(done.stdout or done.stderr, catalog[check].params)
        took = time.perf_counter() - started
        print(f"  exit {done.returncode} in {took:.1f} s; {check}: passed={verdict.passed} {verdict.summary}")


if __name__ == "__main__":
    main()
