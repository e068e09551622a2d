"""Benchmark: CPU time and memory of the node agent scraping a full node, side by side with Debian's
node_exporter scraping the same InfiniBand tree.

The node: 8 GPUs (with their PCIe switches), 10 InfiniBand ports, 100 Lustre OSCs, and a kernel log
that grows by 50 lines a second (a few of them Xids). Both exporters run as real processes; CPU is
read from /proc/<pid>/stat (user + system) around a series of scrapes, memory from /proc/<pid>/status.

    .venv/bin/python bench/exporter_node.py [--scrapes 40]

Targets (docs/exporters.md): <= 25 ms CPU per scrape, <= 60 MB RSS, <= 3x node_exporter's CPU per series.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests" / "exporters"), str(REPO / "tests")]
from exporter_helpers import NodeSpec, build_node, samples  # noqa: E402

from support import free_port  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def rss_mb(pid: int) -> tuple[float, float]:
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return int(status["VmRSS"].split()[0]) / 1024, int(status["VmHWM"].split()[0]) / 1024


def wait_ready(url: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            response = httpx.get(url, timeout=10)
            if response.status_code == 200:
                return response.text
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} never answered")


def measure(name: str, command: list[str], url: str, scrapes: int) -> dict:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        first = wait_ready(url)
        for _ in range(3):  # warm-up: discovery, caches, imports
            httpx.get(url, timeout=30)
        before = cpu_seconds(process.pid)
        wall = time.perf_counter()
        series = 0
        for _ in range(scrapes):
            text = httpx.get(url, timeout=30).text
            series = len(samples(text))
            time.sleep(0.05)
        cpu = cpu_seconds(process.pid) - before
        rss, peak = rss_mb(process.pid)
        return {
            "name": name,
            "cpu_ms": cpu / scrapes * 1000,
            "series": series,
            "rss": rss,
            "peak": peak,
            "wall_ms": (time.perf_counter() - wall) / scrapes * 1000,
            "first_series": len(samples(first)),
        }
    finally:
        process.terminate()
        process.wait(timeout=10)


def grow_log(path: Path, stop: threading.Event) -> None:
    """50 lines a second, one in ten an Xid, as a busy node's kernel log."""
    n = 0
    while not stop.is_set():
        with open(path, "a") as log:
            for _ in range(50):
                n += 1
                stamp = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
                if n % 10 == 0:
                    log.write(
                        f"{stamp} n0001 kernel: [{n}.0] NVRM: Xid (PCI:0000:18:00): 13, pid={n}, "
                        "name=python3, "
                        "Graphics Exception: ESR 0x404490=0x80000001\n"
                    )
                else:
                    log.write(
                        f"{stamp} n0001 kernel: [{n}.0] eth0: renamed from veth{n % 97}; audit: type=1400\n"
                    )
        stop.wait(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scrapes", type=int, default=40)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="fleetsight-bench-"))
    stop = threading.Event()
    try:
        paths = build_node(root / "n0001", NodeSpec(gpus=8, ib_devices=10, oscs=100))
        writer = threading.Thread(target=grow_log, args=(paths["kern_log"], stop), daemon=True)
        writer.start()
        agent = [
            sys.executable,
            "-m",
            "fleetsight.cli",
            "exporter",
            "node",
            "--node",
            "n0001",
            "--no-nvml",
            "--sysfs-root",
            str(paths["sys"]),
            "--procfs-root",
            str(paths["proc"]),
            "--kmsg-file",
            str(paths["kern_log"]),
            "--state-dir",  # the agent saves its Xid position and counts (cost included); not in /var/lib
            str(root / "state"),
            "--log-level",
            "WARNING",
        ]
        results = []
        port = free_port()
        results.append(
            measure(
                "fleetsight node agent, full node",
                [*agent, "--listen", f"127.0.0.1:{port}"],
                f"http://127.0.0.1:{port}/metrics",
                args.scrapes,
            )
        )
        port = free_port()
        results.append(
            measure(
                "fleetsight node agent, IB only",
                [*agent, "--collector", "infiniband", "--listen", f"127.0.0.1:{port}"],
                f"http://127.0.0.1:{port}/metrics",
                args.scrapes,
            )
        )
        if shutil.which(NODE_EXPORTER):
            port = free_port()
            results.append(
                measure(
                    "node_exporter 1.x, IB only",
                    [
                        NODE_EXPORTER,
                        f"--path.sysfs={paths['sys']}",
                        f"--path.procfs={paths['proc']}",
                        "--collector.disable-defaults",
                        "--collector.infiniband",
                        f"--web.listen-address=127.0.0.1:{port}",
                    ],
                    f"http://127.0.0.1:{port}/metrics",
                    args.scrapes,
                )
            )
        else:
            print(
                f"note: {NODE_EXPORTER} not installed "
                "(apt-get install prometheus-node-exporter): no comparison"
            )
    finally:
        stop.set()
        shutil.rmtree(root, ignore_errors=True)

    print(
        f"\nnode: 8 GPUs, 10 IB ports, 100 Lustre OSCs, kernel log +50 lines/s; {args.scrapes} scrapes each\n"
    )
    print(
        f"{'exporter':<36} {'CPU ms/scrape':>13} {'series':>7} {'CPU us/series':>13} "
        f"{'RSS MB':>7} {'peak MB':>8}"
    )
    for r in results:
        per_series = r["cpu_ms"] * 1000 / max(1, r["series"])
        print(
            f"{r['name']:<36} {r['cpu_ms']:13.2f} {r['series']:7d} {per_series:13.2f} "
            f"{r['rss']:7.1f} {r['peak']:8.1f}"
        )
    if len(results) == 3:
        ours, theirs = results[1], results[2]
        ratio = (ours["cpu_ms"] / ours["series"]) / (theirs["cpu_ms"] / theirs["series"])
        print(f"\nCPU per series, fleetsight IB-only / node_exporter IB-only: {ratio:.2f}x (target <= 3x)")
    full = results[0]
    print(
        f"full node: {full['cpu_ms']:.1f} ms CPU per scrape (target <= 25), "
        f"RSS {full['rss']:.1f} MB (target <= 60)"
    )


if __name__ == "__main__":
    main()
