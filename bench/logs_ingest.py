"""Ingest ceiling: how fast one OpenSearch node takes the log mix through `_bulk`, with the ingest
pipelines and without (the upper bound for the whole log path on this machine), and what each costs in
OpenSearch's CPU time per document.

Starts its own OpenSearch (or uses --url), applies the pipelines and templates, then bulk-indexes the
same records the throughput benchmark sends through Kafka (`logs_common.node_records`) from a few
concurrent clients, as the shipper does.

    .venv/bin/python bench/logs_ingest.py [--lines 100000] [--bulk 2000] [--clients 2] [--repeat 3]
        [--url URL]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from logs_common import Stack, free_base, node_records

from fleetsight.settings import Settings
from pipelines.apply import apply_search


def bulk_bodies(records: list[tuple[str, dict]], size: int, pipelines: bool) -> list[bytes]:
    """NDJSON bulk bodies: through the topic's pipeline, or straight into the day's index."""
    day = dt.datetime.now(dt.UTC).strftime("%Y.%m.%d")
    bodies = []
    for start in range(0, len(records), size):
        lines = []
        for topic, record in records[start : start + size]:
            action: dict[str, Any] = {"_id": record["event"]["id"]}
            if pipelines:
                action |= {"_index": topic, "pipeline": topic}
            else:
                action |= {"_index": f"{topic}-raw-{day}"}
            lines += [json.dumps({"index": action}), json.dumps(record)]
        bodies.append(("\n".join(lines) + "\n").encode())
    return bodies


def send(url: str, bodies: list[bytes], clients: int) -> float:
    """Post every body with `clients` concurrent connections; docs/s over the wall time."""
    errors = 0

    def post(body: bytes) -> None:
        nonlocal errors
        answer = httpx.post(f"{url}/_bulk", content=body, timeout=300,
                            headers={"content-type": "application/x-ndjson"}).json()  # fmt: skip
        if answer.get("errors"):
            errors += sum(1 for item in answer["items"] if item["index"].get("error"))

    began = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(post, bodies))
    elapsed = time.monotonic() - began
    if errors:
        print(f"  {errors} documents refused")
    return elapsed


def cpu_ms(url: str) -> int:
    """CPU time OpenSearch's process has used (ms): per document, it is steadier than docs/s on a busy
    machine. (The ingest stats' per-processor times are not usable here: they count time spent waiting.)"""
    nodes = httpx.get(f"{url}/_nodes/stats/process", timeout=60).json()["nodes"]
    return next(iter(nodes.values()))["process"]["cpu"]["total_in_millis"]


def run(url: str, bodies: list[bytes], clients: int, lines: int, what: str) -> None:
    before = cpu_ms(url)
    elapsed = send(url, bodies, clients)
    spent = cpu_ms(url) - before
    print(f"{what:<36} {lines / elapsed:>8,.0f} docs/s  {spent * 1000 / lines:>5.0f} CPU-us/doc  "
          f"(load average {os.getloadavg()[0]:.1f})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--bulk", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--url", help="an OpenSearch already running (pipelines are applied to it)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-plain", action="store_true", help="only the run through the pipelines")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="fleetsight-logs-ingest-"))
    base.chmod(0o755)
    stack = Stack(Settings(run_dir=base / "run", port_base=free_base()))
    try:
        url = args.url
        if not url:
            stack.start("opensearch")
            url = stack.settings.url("opensearch")
        apply_search(url)
        print(f"cpus: {os.cpu_count()}  load average: {os.getloadavg()[0]:.1f}  "
              f"{args.lines:,} lines, bulks of {args.bulk}, {args.clients} clients")  # fmt: skip
        for round_ in range(args.repeat):  # the first round also warms the JVM up
            records = node_records(args.lines, start=round_ * args.lines)  # new ids: no overwrites
            if not args.skip_plain:
                plain = bulk_bodies(records, args.bulk, pipelines=False)
                run(url, plain, args.clients, args.lines, "plain _bulk, no pipeline (ceiling):")
            piped = bulk_bodies(records, args.bulk, pipelines=True)
            run(url, piped, args.clients, args.lines, "_bulk through the ingest pipelines:")
    finally:
        stack.stop_all()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
