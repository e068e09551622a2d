"""OpenSearch's CPU per edge document, for the settings of the central leg: bulk size and the log
indices' mapping and codec. The central leg's largest cost is OpenSearch's (~90 of ~120 CPU-us a line in
the drain), and a drain run on a shared machine moves by more than the differences looked for; so this
bench takes one variable at a time, with nothing but OpenSearch and this script running: the same edge
documents (made by a real rsyslogd with the generated ruleset, see logs_edge.edge_documents) are
bulk-indexed into a fresh index per variant, two bulks in flight (as the shipper's two workers), and
OpenSearch's CPU seconds (its whole process session, from /proc) are divided by the documents. Variants
run in interleaved rounds so that a change of load falls on all of them alike; the median of the
rounds is printed.

Example (about 5 minutes on 2 cores):
    python bench/logs_index_cost.py --docs 40000 --rounds 3 --warmup 100000
    python bench/logs_index_cost.py --only codec   # the codec alone against "bulk 5000"
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from logs_common import Stack, free_base
from logs_edge import edge_documents, load

from fleetsight.settings import Settings
from pipelines.apply import TEMPLATES_DIR


def index_body(raw_subfield: bool, codec: str) -> dict[str, Any]:
    """The log indices' template (pipelines/templates/fleetsight-logs.json) as one index's body."""
    template = json.loads((TEMPLATES_DIR / "fleetsight-logs.json").read_text())["template"]
    body = copy.deepcopy(template)
    body["settings"]["index"].update({"number_of_replicas": 0, "codec": codec})
    if raw_subfield:  # what the template had before this change: the whole line again as a keyword
        body["mappings"]["properties"]["message"]["fields"] = {
            "raw": {"type": "keyword", "ignore_above": 2048}
        }
    return body


def bulk_bodies(index: str, documents: list[dict], size: int, origin_ids: bool = True) -> list[str]:
    """_bulk bodies; with origin_ids each document carries its origin id as _id (what the shipper
    sends, so a replay overwrites instead of duplicating: OpenSearch then looks each id up first),
    without them OpenSearch makes its own ids (append only, no look-up)."""
    bodies = []
    for start in range(0, len(documents), size):
        lines = []
        for document in documents[start : start + size]:
            action = {"_index": index, "_id": document["event"]["id"]} if origin_ids else {"_index": index}
            lines.append(json.dumps({"index": action}))
            lines.append(json.dumps(document))
        bodies.append("\n".join(lines) + "\n")
    return bodies


def merged_size(url: str, index: str) -> int:
    """Bytes of the index's one segment once the force merge has left only it (the store statistics
    sometimes still counted files on their way out)."""
    deadline = time.monotonic() + 120
    while True:
        answer = httpx.get(f"{url}/_cat/segments/{index}?bytes=b&format=json", timeout=60)
        segments = answer.raise_for_status().json()
        if len(segments) == 1:
            return int(segments[0]["size"])
        if time.monotonic() > deadline:
            raise SystemExit(f"{index}: {len(segments)} segments 120 s after the force merge")
        time.sleep(0.5)


def run_variant(
    stack: Stack, url: str, name: str, body: dict, bodies_for: Any, documents: list[dict]
) -> tuple[float, float]:
    """OpenSearch CPU-us per document for one fresh index, and its bytes on disk per document once
    force-merged to one segment (what a warm index keeps; measured after the CPU figure)."""
    index = f"bench-{name}-{time.monotonic_ns()}"
    assert httpx.put(f"{url}/{index}", json=body, timeout=60).status_code == 200
    bodies = bodies_for(index)
    before = stack.cpu_seconds()["opensearch"]
    with httpx.Client(timeout=300) as client, ThreadPoolExecutor(2) as pool:

        def send(text: str) -> None:
            answer = client.post(
                f"{url}/_bulk", content=text, headers={"content-type": "application/x-ndjson"}
            )
            assert answer.status_code == 200 and not answer.json()["errors"], answer.text[:500]

        list(pool.map(send, bodies))
        # Until searchable with the index's own refresh interval: the refresh's segment writes count.
        deadline = time.monotonic() + 120
        while client.get(f"{url}/{index}/_count").json()["count"] < len(documents):
            if time.monotonic() > deadline:
                raise SystemExit(f"{index}: not all searchable after 120 s")
            time.sleep(0.2)
    used = stack.cpu_seconds()["opensearch"] - before
    httpx.post(f"{url}/{index}/_forcemerge?max_num_segments=1", timeout=600).raise_for_status()
    stored = merged_size(url, index)
    httpx.delete(f"{url}/{index}", timeout=60)
    return 1e6 * used / len(documents), stored / len(documents)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", type=int, default=40_000, help="documents per variant and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--warmup",
        type=int,
        default=100_000,
        help="documents indexed first, not counted (40,000 was too few)",
    )
    parser.add_argument(
        "--only", default="", help="run only the variants whose name contains this (e.g. codec)"
    )
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="fleetsight-index-cost-"))
    base.chmod(0o755)
    stack = Stack(Settings(run_dir=base / "run", port_base=free_base()))
    try:
        stack.start("opensearch")
        url = stack.settings.url("opensearch")
        documents = edge_documents(base / "docs", args.docs)
        now = lambda: index_body(False, "best_compression")  # noqa: E731
        variants = {
            "bulk 5000, message.raw (before)": (index_body(True, "best_compression"), 5000),
            "bulk 2000": (now(), 2000),
            "bulk 5000": (now(), 5000),
            "bulk 10000": (now(), 10000),
            "bulk 5000, codec default (LZ4)": (index_body(False, "default"), 5000),
            "bulk 5000, ids made by OpenSearch (a replay would duplicate)": (now(), 5000, False),
        }
        if args.only:
            variants = {name: v for name, v in variants.items() if args.only in name or name == "bulk 5000"}
        print(f"before: {load()}", flush=True)
        warm = [
            copy.deepcopy(d) for d in documents[: args.warmup]
        ]  # a fresh JVM compiles its hot paths first
        run_variant(stack, url, "warmup", now(), lambda i: bulk_bodies(i, warm, 5000), warm)
        results: dict[str, list[float]] = {name: [] for name in variants}
        sizes: dict[str, list[float]] = {name: [] for name in variants}
        for round_ in range(args.rounds):
            for name, (body, size, *ids) in variants.items():
                origin_ids = ids[0] if ids else True
                cost, stored = run_variant(
                    stack, url, "v", body,
                    lambda i, s=size, o=origin_ids: bulk_bodies(i, documents, s, o), documents,
                )  # fmt: skip
                results[name].append(cost)
                sizes[name].append(stored)
                line = f"round {round_ + 1}: {name}: {cost:.1f} us/doc, {stored:.0f} B/doc; {load()}"
                print(line, flush=True)
        print(
            f"OpenSearch CPU per edge document ({args.docs:,} documents a variant, median of {args.rounds}),"
            " and bytes on disk per document force-merged to one segment:"
        )
        for name, costs in results.items():
            rounds = ", ".join(f"{cost:.1f}" for cost in costs)
            stored = statistics.median(sizes[name])
            print(f"  {name}: {statistics.median(costs):.1f} us/doc, {stored:.0f} B/doc (rounds: {rounds})")
        print(f"after: {load()}")
    finally:
        stack.stop_all()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
