# ruff: noqa: E501  (real log lines are long)
"""Log path benchmark: sustained lines per second from Kafka into OpenSearch through the ingest pipelines,
and end-to-end latency (line written on a node -> indexed) p50/p99, on this machine.

Starts its own Kafka, OpenSearch, shipper and node-side rsyslog from the components' declarations in a
temporary run folder, then:
1. throughput: produces N node records (a realistic mix: 80 % training progress, job errors, kernel Xid,
   SXid, Lustre, IB lines) straight into the topics and times until all are indexed;
2. latency: appends lines at a steady rate to node files (read by rsyslog), each carrying its write time,
   and compares it with the document's `event.ingested` (set by the ingest pipeline); searchable is at
   most one refresh interval (1 s) later.

    .venv/bin/python bench/logs_throughput.py [--lines 200000] [--rate 2000] [--seconds 30]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from logs_common import Stack, free_base

from fleetsight.settings import Settings

STACK = ("kafka", "opensearch", "logs-shipper")
LINES = [
    ("fleetsight-logs-application", "[{ts}] iteration {n:>8d}/ 2000000 | consumed samples: {n:>12d} | elapsed time per "
     "iteration (ms): 2512.4 | learning rate: 2.994E-04 | global batch size:   256 | lm loss: 2.345678E+00 | loss scale: "
     "1.0 | grad norm: 0.812 | number of skipped iterations:   0 | number of nan iterations:   0 |", 80),
    ("fleetsight-logs-application", "[{ts}] [rank{r}]:[E ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective "
     "operation timeout: WorkNCCL(SeqNum={n}, OpType=ALLREDUCE, NumelIn=67108864, NumelOut=67108864, Timeout(ms)=600000) "
     "ran for 600061 milliseconds before timing out.", 5),
    ("fleetsight-logs-application", "[{ts}] RuntimeError: CUDA error: an illegal memory access was encountered", 3),
    ("fleetsight-logs-kernel", "{iso} n{r:04d} kernel: [1229615.939836] NVRM: Xid (PCI:0000:3a:00): 79, pid={n}, "
     "name=python3, GPU has fallen off the bus.", 4),
    ("fleetsight-logs-kernel", "{iso} n{r:04d} kernel: [679631.862334] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 24007, "
     "Fatal, Link 28 sourcetrack TCEN0 crumbstore ECC DBE Error", 2),
    ("fleetsight-logs-kernel", "{iso} n{r:04d} kernel: [2922109.612490] LustreError: 11-0: lustre-OST0003-osc-ffff4d6a: "
     "operation ost_write to node 10.10.0.13@o2ib failed: rc = -107", 3),
    ("fleetsight-logs-kernel", "{iso} n{r:04d} kernel: [3134916.473307] mlx5_core 0000:3c:00.0: "
     "mlx5_port_change_event:307:(pid 0): Link down", 3),
]  # fmt: skip


def count(url: str) -> int:
    httpx.post(f"{url}/fleetsight-logs-*/_refresh", timeout=60)
    response = httpx.get(f"{url}/fleetsight-logs-*/_count?allow_no_indices=true", timeout=60)
    return response.json().get("count", 0)


def throughput(stack: Stack, lines: int) -> float:
    url = stack.settings.url("opensearch")
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{stack.settings.port('kafka')}", "linger.ms": 20,
                         "compression.type": "zstd", "queue.buffering.max.messages": 1000000})  # fmt: skip
    population = [entry for entry in LINES for _ in range(entry[2])]
    now = dt.datetime.now(dt.UTC)
    base = count(url)
    for n in range(lines):
        topic, template, _ = random.choice(population)
        line = template.format(ts=now.strftime("%Y-%m-%d %H:%M:%S"), iso=now.isoformat(), n=n, r=n % 512)
        record = {"@timestamp": now.isoformat(), "message": line, "host": {"name": f"n{n % 512:04d}"},
                  "log": {"file": {"path": f"/bench/{topic}/{n % 512}.log"}, "offset": n},
                  "event": {"id": f"bench:{n}"}, "fleetsight": {"cluster": "bench"}}  # fmt: skip
        producer.produce(topic, json.dumps(record).encode())
        if n % 10000 == 0:
            producer.poll(0)
    producer.flush(120)
    began = time.monotonic()  # the shipper has been consuming meanwhile; time from the first record
    produced_at = began
    while (indexed := count(url) - base) < lines:
        if time.monotonic() - produced_at > 600:
            raise SystemExit(f"only {indexed}/{lines} indexed after 10 minutes")
        time.sleep(1)
    return lines / (time.monotonic() - began)


def latency(stack: Stack, rate: int, seconds: int) -> list[float]:
    """Start the node side over a fresh folder, write at `rate` lines/s, return ingested - written (s)."""
    settings = stack.settings
    nodes = settings.data_dir("twin") / "nodes"
    files = [nodes / f"n{i:04d}" / "var" / "log" / "jobs" / "9001" / f"rank-{i}.log" for i in range(16)]
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
    stack.start("logs-node")
    handles = [path.open("a") for path in files]
    written = 0
    began = time.monotonic()
    while (elapsed := time.monotonic() - began) < seconds:
        due = int(elapsed * rate)
        while written < due:
            stamp = dt.datetime.now(dt.UTC)
            handle = handles[written % len(handles)]
            handle.write(
                f"[{stamp:%Y-%m-%d %H:%M:%S}] bench written_at={stamp.timestamp():.6f} step={written} loss=2.5\n"
            )
            written += 1
        for handle in handles:
            handle.flush()
        time.sleep(0.01)
    for handle in handles:
        handle.close()
    url = settings.url("opensearch")
    deadline = time.monotonic() + 300
    query = {"query": {"term": {"fleetsight.hpc_job": "9001"}}}
    while True:
        httpx.post(f"{url}/fleetsight-logs-*/_refresh", timeout=60)
        done = httpx.post(f"{url}/fleetsight-logs-*/_count", json=query, timeout=60).json()["count"]
        if done >= written or time.monotonic() > deadline:
            break
        time.sleep(1)
    delays = []
    search_after = None
    while True:
        body = {"size": 5000, "query": query["query"], "_source": ["message", "event.ingested"],
                "sort": [{"log.file.path": "asc"}, {"log.offset": "asc"}]}  # fmt: skip
        if search_after:
            body["search_after"] = search_after
        hits = httpx.post(f"{url}/fleetsight-logs-*/_search", json=body, timeout=60).json()["hits"]["hits"]
        if not hits:
            break
        for hit in hits:
            source = hit["_source"]
            written_at = float(source["message"].split("written_at=")[1].split()[0])
            ingested = dt.datetime.fromisoformat(
                source["event"]["ingested"].replace("Z", "+00:00")
            ).timestamp()
            delays.append(ingested - written_at)
        search_after = hits[-1]["sort"]
    print(f"latency run: {written} lines written at {rate}/s for {seconds} s, {len(delays)} indexed")
    return delays


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--seconds", type=int, default=30)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="fleetsight-logs-bench-"))
    base.chmod(0o755)
    settings = Settings(run_dir=base / "run", port_base=free_base())
    stack = Stack(settings)
    try:
        for name in STACK:
            stack.start(name)
        print(f"cpus: {os.cpu_count()}  load average: {os.getloadavg()[0]:.1f}")
        rate = throughput(stack, args.lines)
        print(
            f"throughput Kafka -> ingest pipelines -> OpenSearch: {rate:,.0f} lines/s ({args.lines:,} lines)"
        )
        delays = sorted(latency(stack, args.rate, args.seconds))
        if delays:
            p50 = statistics.median(delays)
            p99 = delays[min(len(delays) - 1, int(len(delays) * 0.99))]
            print(f"end-to-end (written on a node -> indexed) p50 {p50:.2f} s  p99 {p99:.2f} s  max {delays[-1]:.2f} s"
                  "  (+ up to 1 s refresh until searchable)")  # fmt: skip
    finally:
        stack.stop_all()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
