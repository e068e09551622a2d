#!/usr/bin/env bash
# On a lent GPU machine (the workplace's device tool), from the repository root: every GPU-facing part of
# FleetSight on real hardware, in one go, for docs/checks.md's measured figures.
#   1. what nvidia-smi says of the GPUs (model, PCIe link, clocks, power limit);
#   2. bench/device_probe.py: NVML vs sysfs GPU map, the node agent's CUDA host-to-device probe (3 rounds),
#      one scrape of the node agent on the real /sys, then fleetsight-gpu-probe gemm (bf16) and hbm with
#      the catalogue's verdicts;
#   3. the node agent serving with --pcie-probe cuda, and `fleetsight checks run` of every light check
#      against it (no dcgm-exporter or dcgmi here: those checks must come back unknown, never failed);
#   4. the intrusive gemm_throughput and hbm_bandwidth checks through `fleetsight checks run`, as the
#      Slurm job runs them, through the console script `fleetsight-gpu-probe`.
# The machine's Python has no hatchling, so the console script is written by hand as pip would write it
# (fleetsight.launchers:gpu_probe). cuBLAS comes from the CUDA wheels beside PyTorch.
# Usage: bash bench/device_session.sh [probe seconds, default 10]
set -u
seconds=${1:-10}
out=${OUT:-/tmp/fleetsight-device}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
repo=$(pwd)

echo "=== nvidia-smi"
nvidia-smi --query-gpu=name,pci.bus_id,driver_version,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,clocks.max.sm,clocks.max.mem,power.limit,memory.total --format=csv

cublas=$(python3 -c 'import glob, site
found = [p for d in site.getsitepackages() for p in glob.glob(d + "/nvidia/**/libcublas.so*", recursive=True)]
print(sorted(found)[0] if found else "")')
echo "=== cuBLAS: ${cublas:-none found}"
[ -n "$cublas" ] && export LD_LIBRARY_PATH="$(dirname "$cublas")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

mkdir -p /tmp/fsbin
cat >/tmp/fsbin/fleetsight-gpu-probe <<EOF
#!$(command -v python3)
import sys
sys.path.insert(0, "$repo")
from fleetsight.launchers import gpu_probe
sys.exit(gpu_probe())
EOF
chmod +x /tmp/fsbin/fleetsight-gpu-probe
export PATH=/tmp/fsbin:$PATH
fleetsight-gpu-probe --help | head -5

echo "=== bench/device_probe.py --rounds 3 --probe-seconds $seconds"
timeout 300 python3 bench/device_probe.py --rounds 3 --probe-seconds "$seconds" 2>&1 | tee "$out/device_probe.txt"

echo "=== node agent serving with --pcie-probe cuda; light checks"
python3 -m fleetsight.cli exporter node --node gpu-host --listen 127.0.0.1:9101 --no-state \
    --pcie-probe cuda --pcie-bandwidth-file /tmp/h2d.json >"$out/node_agent.log" 2>&1 &
agent=$!
for _ in $(seq 60); do
    curl -s 127.0.0.1:9101/metrics | grep -q '^fleetsight_pcie_host_to_device' && break
    sleep 1
done
curl -s 127.0.0.1:9101/metrics | grep -E '^fleetsight_(pcie_host_to_device|pcie_link|pcie_probe)' | head -20
timeout 200 python3 -m fleetsight.cli checks run --node gpu-host 2>&1 | tee "$out/light_checks.jsonl"
echo "light checks exit ${PIPESTATUS[0]}"
kill "$agent" 2>/dev/null

echo "=== intrusive: gemm_throughput, hbm_bandwidth (the catalogue's 30 s each)"
timeout 240 python3 -m fleetsight.cli checks run --node gpu-host --check gemm_throughput \
    --check hbm_bandwidth 2>&1 | tee "$out/intrusive_checks.jsonl"
echo "intrusive checks exit ${PIPESTATUS[0]}"
