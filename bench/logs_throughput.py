# ruff: noqa: E501  (real log lines are long)
"""Log path benchmark: sustained lines per second from Kafka into OpenSearch through the ingest pipelines,
and end-to-end latency (line written on a node -> indexed, and -> searchable) p50/p99, on this machine.

Starts its own Kafka, OpenSearch, shipper and node-side rsyslog from the components' declarations in a
temporary run folder, then:
0. warm-up: --warmup lines go the same way first, not counted (a fresh JVM is several times slower);
1. throughput: produces N node records (a realistic mix: 88 % job logs, mostly training progress, and
   kernel Xid, SXid, Lustre, IB lines; `logs_common.node_records`) into the topics as fast as Kafka
   takes them, and follows OpenSearch's indexing counter every second. "Sustained" is the rate between
   10 % and 90 % of the lines indexed (no start-up, no tail); "overall" is N over first record
   produced -> last indexed.
2. latency: appends lines at a steady rate to rank files (read by rsyslog imfile), each carrying its
   write time; "indexed" compares it with the document's `event.ingested` (set by the ingest pipeline);
   "searchable" probes twice a second: the line just written is searched (no forced refresh) until a
   search returns it.
After each phase: the CPU each component used per line (its whole process session, from /proc), and
the ceiling that implies on this machine (cores / CPU per line): a figure that load barely moves.

`--path edge` measures the edge path instead (lines parsed on the node, indexed with no pipeline;
bench/logs_edge.py): edge cost per line on a node, the central leg's drain of a pre-filled Kafka to
searchable, and end to end the highest offered rate with written -> searchable p99 < 5 s.

    .venv/bin/python bench/logs_throughput.py [--lines 200000] [--rate 5000] [--seconds 30] [--warmup 100000]
    .venv/bin/python bench/logs_throughput.py --path edge --lines 200000 --rates 4000,8000,12000
    .venv/bin/python bench/logs_throughput.py --path both
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from logs_common import Stack, free_base, node_records

from fleetsight.search_pages import sorted_pages
from fleetsight.settings import Settings
from pipelines.component import kafka_client
from pipelines.kafka_security import NODE_USER

STACK = ("kafka", "opensearch", "logs-shipper")
INDICES = "fleetsight-logs-*"


def indexed_total(url: str) -> int:
    """Documents indexed so far (the primaries' indexing counter: no refresh needed, nothing forced)."""
    stats = httpx.get(f"{url}/{INDICES}/_stats/indexing?allow_no_indices=true", timeout=60).json()
    return stats["_all"]["primaries"].get("indexing", {}).get("index_total", 0)


def produce(client: dict[str, str], records: list[tuple[str, dict]]) -> None:
    producer = Producer({**client, "linger.ms": 20, "compression.type": "zstd",
                         "queue.buffering.max.messages": 1_000_000})  # fmt: skip
    for n, (topic, record) in enumerate(records):
        # keyed by node, as the node-side rsyslog's records would be partitioned
        producer.produce(topic, json.dumps(record).encode(), key=record["host"]["name"].encode())
        if n % 10000 == 0:
            producer.poll(0)
    producer.flush(120)


def throughput(stack: Stack, lines: int, start: int = 0) -> tuple[float, float]:
    """(sustained lines/s between 10 % and 90 % indexed, overall lines/s)."""
    url = stack.settings.url("opensearch")
    records = node_records(lines, start=start)  # built before the clock starts
    base = indexed_total(url)
    began = time.monotonic()
    producer = threading.Thread(target=produce, args=(kafka_client(stack.settings, NODE_USER), records))
    producer.start()
    samples: list[tuple[float, int]] = []
    while (done := indexed_total(url) - base) < lines:
        samples.append((time.monotonic(), done))
        if time.monotonic() - began > 900:
            raise SystemExit(f"only {done}/{lines} indexed after 15 minutes")
        time.sleep(1)
    finished = time.monotonic()
    samples.append((finished, done))
    producer.join()
    low = next(s for s in samples if s[1] >= lines * 0.1)
    high = next(s for s in samples if s[1] >= lines * 0.9)
    sustained = (high[1] - low[1]) / (high[0] - low[0]) if high[0] > low[0] else float("nan")
    return sustained, lines / (finished - began)


def write_lines(files: list[Path], rate: int, seconds: int, log: list[tuple[str, float]]) -> int:
    """Append `rate` lines/s round-robin to the files for `seconds`; log (marker, time) of each line."""
    handles = [path.open("a") for path in files]
    written = 0
    began = time.monotonic()
    while (elapsed := time.monotonic() - began) < seconds:
        while written < int(elapsed * rate):
            stamp = dt.datetime.now(dt.UTC)
            handles[written % len(handles)].write(
                f"[{stamp:%Y-%m-%d %H:%M:%S}] bench written_at={stamp.timestamp():.6f} step={written} loss=2.5\n"
            )
            log.append((f"step={written}", stamp.timestamp()))
            written += 1
        for handle in handles:
            handle.flush()
        time.sleep(0.005)
    for handle in handles:
        handle.close()
    return written


def probe_searchable(url: str, log: list[tuple[str, float]], stop: threading.Event, out: list[float]) -> None:
    """Twice a second: take the line written last and search for it until it is found."""
    query = {
        "bool": {"filter": [{"term": {"fleetsight.hpc_job": "9001"}}, {"match_phrase": {"message": ""}}]}
    }
    while not stop.is_set():
        if not log:
            time.sleep(0.1)
            continue
        marker, written_at = log[-1]
        query["bool"]["filter"][1]["match_phrase"]["message"] = marker
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            answer = httpx.post(f"{url}/{INDICES}/_count", json={"query": query}, timeout=30).json()
            if answer.get("count"):
                out.append(time.time() - written_at)
                break
            time.sleep(0.05)
        stop.wait(0.5)


def latency(stack: Stack, rate: int, seconds: int) -> tuple[list[float], list[float]]:
    """Start the node side over a fresh folder, write at `rate` lines/s; (indexed, searchable) delays."""
    settings = stack.settings
    url = settings.url("opensearch")
    nodes = settings.data_dir("twin") / "nodes"
    files = [nodes / f"n{i:04d}" / "var" / "log" / "jobs" / "9001" / f"rank-{i}.log" for i in range(16)]
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
    stack.start("logs-node")
    log: list[tuple[str, float]] = []
    searchable: list[float] = []
    stop = threading.Event()
    prober = threading.Thread(target=probe_searchable, args=(url, log, stop, searchable))
    prober.start()
    written = write_lines(files, rate, seconds, log)
    stop.set()
    prober.join()
    query = {"query": {"term": {"fleetsight.hpc_job": "9001"}}}
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        httpx.post(f"{url}/{INDICES}/_refresh", timeout=60)
        if httpx.post(f"{url}/{INDICES}/_count", json=query, timeout=60).json()["count"] >= written:
            break
        time.sleep(1)
    return ingested_delays(url, query), searchable


def ingested_delays(url: str, query: dict) -> list[float]:
    body = {"query": query["query"], "_source": ["message", "event.ingested"],
            "sort": [{"log.file.path": "asc"}, {"log.offset": "asc"}]}  # fmt: skip

    def search(request: dict) -> list[dict]:
        return httpx.post(f"{url}/{INDICES}/_search", json=request, timeout=60).json()["hits"]["hits"]

    delays = []
    for hits in sorted_pages(search, body, 5000):
        for hit in hits:
            source = hit["_source"]
            written_at = float(source["message"].split("written_at=")[1].split()[0])
            ingested = dt.datetime.fromisoformat(source["event"]["ingested"].replace("Z", "+00:00"))
            delays.append(ingested.timestamp() - written_at)
    return delays


def percentiles(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {statistics.median(ordered):.2f} s  p99 {p99:.2f} s  max {ordered[-1]:.2f} s  ({len(ordered)} lines)"


def cpu_report(before: dict[str, float], after: dict[str, float], own: float, lines: int) -> str:
    """CPU microseconds per line, by component and in all: the whole budget on this machine is
    cpu_count seconds per second, so `cpu_count / total` is the most lines/s it could ever do."""
    used = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}
    used["bench script (producer/writer)"] = own
    parts = ", ".join(f"{name} {1e6 * cpu / lines:.0f}" for name, cpu in used.items())
    total = sum(used.values())
    ceiling = (os.cpu_count() or 1) * lines / total if total else float("nan")
    return (f"  CPU per line (us): {parts}; total {1e6 * total / lines:.0f} us/line"
            f" -> at most {ceiling:,.0f} lines/s on {os.cpu_count()} cpus")  # fmt: skip


def load() -> str:
    return f"load average {os.getloadavg()[0]:.1f} (1 min) on {os.cpu_count()} cpus"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument(
        "--rate", type=int, default=5000, help="lines/s written to node files for the latency run"
    )
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=100_000, help="lines indexed before measuring")
    parser.add_argument(
        "--path", choices=("pipeline", "edge", "both"), default="both",
        help="pipeline: raw lines through the ingest pipelines (#8); edge: parsed on the node, no pipeline",
    )  # fmt: skip
    parser.add_argument(
        "--rates", default="4000,8000,12000,16000",
        help="edge end to end: offered lines/s, tried in order until searchable p99 reaches 5 s",
    )  # fmt: skip
    parser.add_argument(
        "--edge-phases", default="cost,drain,e2e",
        help="edge path: which figures (cost, drain, e2e); the drain also warms OpenSearch's JVM for e2e",
    )  # fmt: skip
    parser.add_argument(
        "--edge-bulk", type=int, default=0,
        help="edge shipper: records per bulk request (default: pipelines/rsyslog_conf.EDGE_BULK_RECORDS)",
    )  # fmt: skip
    parser.add_argument(
        "--edge-workers", type=int, default=0,
        help="edge shipper: worker threads, one bulk request each (default: rsyslog_conf.EDGE_WORKERS)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.path in ("edge", "both"):
        edge(args)
    if args.path in ("pipeline", "both"):
        pipeline(args)


def edge(args: argparse.Namespace) -> None:
    import logs_edge

    from pipelines import rsyslog_conf

    # Settings to compare: the shipper's configuration is written in this process (logs_edge.drain).
    if args.edge_bulk:
        rsyslog_conf.EDGE_BULK_RECORDS = args.edge_bulk
    if args.edge_workers:
        rsyslog_conf.EDGE_WORKERS = args.edge_workers
    print(f"edge shipper: {rsyslog_conf.EDGE_BULK_RECORDS:,} records per bulk, "
          f"{rsyslog_conf.EDGE_WORKERS} workers", flush=True)  # fmt: skip
    base = Path(tempfile.mkdtemp(prefix="fleetsight-logs-bench-edge-"))
    base.chmod(0o755)
    stack = Stack(Settings(run_dir=base / "run", port_base=free_base()))
    try:
        print(f"before: {load()}", flush=True)
        phases = args.edge_phases.split(",")
        if "cost" in phases:
            print(logs_edge.edge_cost(base / "edge-cost", args.lines), flush=True)
        for name in ("kafka", "opensearch"):
            stack.start(name)
        if "drain" in phases:
            for line in logs_edge.drain(stack, base / "drain", args.lines, args.warmup, cpu_report):
                print(line, flush=True)
        if "e2e" in phases:
            rates = [int(rate) for rate in args.rates.split(",")]
            print(logs_edge.ladder(stack, rates, args.seconds, cpu_report)[-1], flush=True)
        print(f"after: {load()}", flush=True)
    finally:
        stack.stop_all()
        shutil.rmtree(base, ignore_errors=True)


def pipeline(args: argparse.Namespace) -> None:
    base = Path(tempfile.mkdtemp(prefix="fleetsight-logs-bench-"))
    base.chmod(0o755)
    stack = Stack(Settings(run_dir=base / "run", port_base=free_base()))
    try:
        for name in STACK:
            stack.start(name)
        print(f"before: {load()}")
        if args.warmup:
            # A fresh JVM compiles its hot paths during the first tens of thousands of documents; a log
            # path runs for weeks, so the figure is taken warm.
            throughput(stack, args.warmup, start=10**9)
            print(f"warm-up: {args.warmup:,} lines indexed first (not counted)")
        cpu, own = stack.cpu_seconds(), time.process_time()
        sustained, overall = throughput(stack, args.lines)
        print(f"throughput Kafka -> ingest pipelines -> OpenSearch ({args.lines:,} lines): "
              f"sustained {sustained:,.0f} lines/s, overall {overall:,.0f} lines/s; {load()}")  # fmt: skip
        print(cpu_report(cpu, stack.cpu_seconds(), time.process_time() - own, args.lines))
        cpu, own = stack.cpu_seconds(), time.process_time()
        indexed, searchable = latency(stack, args.rate, args.seconds)
        print(f"end to end at {args.rate:,} lines/s written on nodes for {args.seconds} s; {load()}")
        print(cpu_report(cpu, stack.cpu_seconds(), time.process_time() - own, len(indexed) or 1))
        if indexed:
            print(f"  written -> indexed:    {percentiles(indexed)}")
        if searchable:
            print(f"  written -> searchable: {percentiles(searchable)}")
    finally:
        stack.stop_all()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
