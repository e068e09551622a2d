# ruff: noqa: E501  (real log lines are long)
"""The edge path's three figures (`logs_throughput.py --path edge` runs them):

1. **edge cost**: rsyslogd CPU per line on a node for reading a file, parsing each line with the
   generated rulebase + ruleset and writing the ECS document, against the same rsyslogd that only
   frames the raw record (what the node paid before); paid by each node, not by the centre.
2. **central leg (drain)**: N edge documents wait in Kafka (pre-filled, shipper stopped); the shipper
   starts; lines/s from its start until all N are searchable (counted with no forced refresh), and the
   CPU per line of Kafka, the shipper and OpenSearch over the drain.
3. **end to end**: a node rsyslog (edge parsing) reads kern.log files written at an offered rate;
   twice a second the line just written is searched for (no forced refresh) until found: written ->
   searchable p50/p99. Rates are tried in order; the highest with p99 < 5 s is the figure.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
import statistics
import subprocess
import threading
import time
from pathlib import Path

import httpx
from confluent_kafka import Producer
from logs_common import LINES, Stack, session_cpu_seconds

from pipelines.apply import apply_all
from pipelines.component import kafka_client
from pipelines.kafka_security import NODE_USER
from pipelines.logclasses import BY_NAME
from pipelines.rsyslog_conf import RECORD_END, edge_file_config

EDGE_TOPIC = BY_NAME["kernel"].edge_topic
AFTERMATH_S = 30  # how long OpenSearch's CPU is still counted after a drain (its merges)
INDICES = "fleetsight-logs-kernel-*"
KERNEL_TEMPLATES = [template for topic, template, _ in LINES if topic.endswith("kernel")]


def kernel_lines(count: int, start: int = 0) -> list[str]:
    """The benchmark mix's kernel lines (Xid, SXid, Lustre, IB) with a unique number in each."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")
    return [
        KERNEL_TEMPLATES[n % len(KERNEL_TEMPLATES)].format(iso=now, r=n % 512, n=n, ts=now) + f" seq={n}"
        for n in range(start, start + count)
    ]


def _run_rsyslog(work: Path, lines: list[str], parse: bool) -> tuple[float, list[str]]:
    """rsyslogd over a file of lines: (its CPU seconds, the records it wrote)."""
    work.mkdir(parents=True, exist_ok=True)
    source, out = work / "kern.log", work / "out.jsonl"
    source.write_text("".join(line + "\n" for line in lines))
    config = work / "rsyslog.conf"
    config.write_text(edge_file_config(work, source, out, None, "kernel", "n0001", "bench", parse=parse))
    process = subprocess.Popen(
        ["rsyslogd", "-n", "-f", str(config), "-i", str(work / "pid")], start_new_session=True
    )
    deadline = time.monotonic() + 600
    while True:
        done = sum(1 for _ in out.open()) if out.exists() else 0
        if done >= len(lines) or time.monotonic() > deadline or process.poll() is not None:
            break
        time.sleep(0.2)
    cpu = session_cpu_seconds(process.pid)
    process.terminate()
    process.wait(timeout=30)
    return cpu, out.read_text().splitlines()


def edge_cost(work: Path, count: int) -> str:
    lines = kernel_lines(count)
    raw_cpu, _ = _run_rsyslog(work / "raw", lines, parse=False)
    edge_cpu, records = _run_rsyslog(work / "edge", lines, parse=True)
    parsed = sum(1 for record in records if '"parse_failure"' not in record)
    return (
        f"edge cost ({count:,} kernel lines, one rsyslogd, file -> file): parse + ECS "
        f"{1e6 * edge_cpu / count:.1f} us/line (rsyslogd total {1e6 * edge_cpu / count:.1f}, of which "
        f"framing the raw record alone {1e6 * raw_cpu / count:.1f}: parsing adds "
        f"{1e6 * (edge_cpu - raw_cpu) / count:.1f}); {parsed:,}/{count:,} lines parsed; "
        f"a node writing 100 lines/s spends {100 * edge_cpu / count * 100:.3f} % of one core"
    )


# The fleet the edge documents come from writes this many lines a second in all: the documents' times
# advance by its step, as a backlog of a real fleet's lines does (the document ids begin with the second).
FLEET_LINES_PER_S = 10_000


def edge_documents(work: Path, count: int) -> list[dict]:
    """`count` edge documents as the node makes them: a real rsyslogd parses the mix's distinct lines,
    then each is repeated with its own origin (id, offset), number and time (FLEET_LINES_PER_S)."""
    _, records = _run_rsyslog(work / "docs", kernel_lines(64), parse=True)
    templates = [json.loads(record) for record in records]
    start = dt.datetime.fromisoformat(templates[0]["@timestamp"].replace("Z", "+00:00"))
    documents = []
    for n in range(count):
        document = copy.deepcopy(templates[n % len(templates)])
        moment = start + dt.timedelta(seconds=n / FLEET_LINES_PER_S)
        document["@timestamp"] = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        document["log"]["offset"] = n
        document["event"]["id"] = f"n{n % 512:04d}:/var/log/kern.log:{n}"
        document["host"]["name"] = f"n{n % 512:04d}"
        document["message"] = document["message"].rsplit(" seq=", 1)[0] + f" seq={n}"
        documents.append(document)
    return documents


def node_json(value: object) -> str:
    """JSON as the node's rsyslog writes it (libfastjson's spaced form, `/` escaped): the wire format the
    shipper reads, so that the drain measures what a fleet sends."""
    if isinstance(value, dict):
        members = ", ".join(f"{node_json(key)}: {node_json(item)}" for key, item in value.items())
        return f"{{ {members} }}" if members else "{ }"
    if isinstance(value, list):
        return f"[ {', '.join(node_json(item) for item in value)} ]" if value else "[ ]"
    text = json.dumps(value, ensure_ascii=False)
    return text.replace("/", "\\/") if isinstance(value, str) else text


def produce(client: dict[str, str], documents: list[dict]) -> None:
    producer = Producer({**client, "linger.ms": 20, "compression.type": "zstd",
                         "queue.buffering.max.messages": 1_000_000})  # fmt: skip
    for n, document in enumerate(documents):
        record = node_json(document) + RECORD_END  # as a node sends it
        producer.produce(EDGE_TOPIC, record.encode(), key=document["host"]["name"].encode())
        if n % 10000 == 0:
            producer.poll(0)
    producer.flush(300)


def searchable(url: str) -> int:
    """Documents a search sees now (no refresh forced: what a user would find)."""
    answer = httpx.post(f"{url}/{INDICES}/_count?allow_no_indices=true", json={}, timeout=60).json()
    return answer.get("count", 0)


def drain(stack: Stack, work: Path, count: int, warmup: int, cpu_line: callable) -> list[str]:
    """Pre-fill Kafka with `count` edge documents, then time the shipper's drain to searchable."""
    settings = stack.settings
    url, bootstrap = settings.url("opensearch"), f"127.0.0.1:{settings.port('kafka')}"
    apply_all(bootstrap, url, kafka_client(settings))
    out = []
    documents = edge_documents(work, warmup + count)
    if warmup:
        # A fresh JVM compiles its hot paths on the first tens of thousands of documents.
        produce(kafka_client(settings, NODE_USER), documents[:warmup])
        stack.start("logs-shipper")
        _wait(lambda: searchable(url) >= warmup, 900, "the warm-up drain")
        stack.stop("logs-shipper")
        out.append(f"warm-up: {warmup:,} edge documents indexed first (not counted)")
    base = searchable(url)
    produce(kafka_client(settings, NODE_USER), documents[warmup:])
    out.append(f"Kafka pre-filled with {count:,} edge documents; shipper stopped until now")
    # The shipper's preparation (`logs apply`, its configuration) is not part of the drain.
    stack.components["logs-shipper"].prepare(settings)
    cpu, threads, busy = stack.cpu_seconds(), stack.jvm_thread_seconds(), opensearch_busy_ms(url)
    began = time.monotonic()
    stack.start("logs-shipper", prepare=False)
    samples = []
    while (done := searchable(url) - base) < count:
        samples.append((time.monotonic(), done))
        if time.monotonic() - began > 900:
            raise SystemExit(f"only {done}/{count} searchable after 15 minutes")
        time.sleep(0.5)
    finished = time.monotonic()
    samples.append((finished, done))
    low = next(s for s in samples if s[1] >= count * 0.1)
    high = next(s for s in samples if s[1] >= count * 0.9)
    sustained = (high[1] - low[1]) / (high[0] - low[0]) if high[0] > low[0] else float("nan")
    out.append(
        f"central leg, drain Kafka -> shipper (no pipeline) -> searchable ({count:,} lines): "
        f"{count / (finished - began):,.0f} lines/s from shipper start to all searchable, "
        f"{sustained:,.0f} lines/s between 10 % and 90 %; {load()}"
    )
    after, threads_after = stack.cpu_seconds(), stack.jvm_thread_seconds()
    out.append(cpu_line(cpu, after, 0.0, count))
    used = {  # us per line, by component and JVM thread kind
        (name, kind): 1e6 * (threads_after[name][kind] - threads.get(name, {}).get(kind, 0.0)) / count
        for name in ("opensearch", "kafka")
        for kind in ("jit", "gc")
    }
    jit = used["opensearch", "jit"] + used["kafka", "jit"]
    central = 1e6 * sum(after[n] - cpu.get(n, 0.0) for n in after) / count
    out.append(
        f"  of which JIT compiler threads (us/line): opensearch {used['opensearch', 'jit']:.0f}, "
        f"kafka {used['kafka', 'jit']:.0f}; without them: central {central - jit:.0f} us/line"
    )
    busy_after = opensearch_busy_ms(url)
    out.append(
        "  OpenSearch's own totals (thread-us per line, wall time): "
        + ", ".join(f"{name} {1e3 * (busy_after[name] - busy[name]) / count:.0f}" for name in busy)
    )
    out.append(
        f"  of which GC threads (us/line): opensearch {used['opensearch', 'gc']:.0f}, kafka {used['kafka', 'gc']:.0f}"
    )
    # Merges the drain left behind run after it: counted apart, so a setting that defers them shows.
    time.sleep(AFTERMATH_S)
    later = stack.cpu_seconds()
    segments = httpx.get(f"{url}/_cat/segments/{INDICES}?format=json", timeout=60).json()
    out.append(
        f"  the {AFTERMATH_S} s after the drain: OpenSearch {1e6 * (later['opensearch'] - after['opensearch']) / count:.0f} "
        f"us per drained line more; {len(segments)} segments in the kernel indices"
    )
    return out


def opensearch_busy_ms(url: str) -> dict[str, float]:
    """OpenSearch's own totals (thread milliseconds, wall time, summed over its nodes) of the work the
    drain causes: indexing, refreshes, merges, flushes."""
    nodes = httpx.get(f"{url}/_nodes/stats/indices", timeout=60).raise_for_status().json()["nodes"]
    keys = {
        "indexing": ("indexing", "index_time_in_millis"),
        "refresh": ("refresh", "total_time_in_millis"),
        "merges": ("merges", "total_time_in_millis"),
        "flush": ("flush", "total_time_in_millis"),
    }
    return {
        name: float(sum(node["indices"][group][key] for node in nodes.values()))
        for name, (group, key) in keys.items()
    }


def _wait(predicate: callable, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.5)


def load() -> str:
    return f"load average {os.getloadavg()[0]:.1f} (1 min) on {os.cpu_count()} cpus"


def _probe(url: str, log: list[tuple[int, float]], stop: threading.Event, out: list[float]) -> None:
    while not stop.is_set():
        if not log:
            time.sleep(0.1)
            continue
        seq, written_at = log[-1]
        query = {"query": {"match_phrase": {"message": f"seq={seq}"}}}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if httpx.post(f"{url}/{INDICES}/_count", json=query, timeout=30).json().get("count"):
                out.append(time.time() - written_at)
                break
            time.sleep(0.05)
        stop.wait(0.2)


def end_to_end(stack: Stack, rate: int, seconds: int, start: int) -> tuple[list[float], int]:
    """Write kernel lines at `rate` lines/s to 16 nodes' kern.log for `seconds`: searchable delays."""
    nodes = stack.settings.data_dir("twin") / "nodes"
    files = [nodes / f"n{i:04d}" / "var" / "log" / "kern.log" for i in range(16)]
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
    handles = [path.open("a") for path in files]
    log: list[tuple[int, float]] = []
    delays: list[float] = []
    stop = threading.Event()
    prober = threading.Thread(target=_probe, args=(stack.settings.url("opensearch"), log, stop, delays))
    prober.start()
    written = 0
    began = time.monotonic()
    while (elapsed := time.monotonic() - began) < seconds:
        due = int(elapsed * rate)
        if due > written:
            for n, line in enumerate(kernel_lines(due - written, start + written)):
                handles[(written + n) % len(handles)].write(line + "\n")
            for handle in handles:
                handle.flush()
            log.append((start + due - 1, time.time()))
            written = due
        time.sleep(0.01)
    stop.set()
    prober.join()
    for handle in handles:
        handle.close()
    return delays, written


def percentiles(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {statistics.median(ordered):.2f} s  p99 {p99:.2f} s  max {ordered[-1]:.2f} s  ({len(ordered)} probes)"


def ladder(stack: Stack, rates: list[int], seconds: int, cpu_line: callable) -> list[str]:
    """End to end at each offered rate (stops after the first whose p99 is 5 s or more)."""
    out = []
    for name in ("logs-shipper", "logs-node"):
        if name not in stack.processes:
            stack.start(name)
    best = 0
    start = 10**8
    for rate in rates:
        cpu = stack.cpu_seconds()
        delays, written = end_to_end(stack, rate, seconds, start)
        start += written + 1
        p99 = sorted(delays)[min(len(delays) - 1, int(len(delays) * 0.99))] if delays else float("inf")
        out.append(f"end to end (edge) at {rate:,} lines/s offered for {seconds} s: written -> searchable "
                   f"{percentiles(delays) if delays else 'no probe answered'}; {load()}")  # fmt: skip
        out.append(cpu_line(cpu, stack.cpu_seconds(), 0.0, written or 1))
        print(out[-2], out[-1], sep="\n", flush=True)
        if p99 >= 5:
            break
        best = rate
    out.append(f"end to end (edge): highest offered rate with searchable p99 < 5 s: {best:,} lines/s")
    return out
