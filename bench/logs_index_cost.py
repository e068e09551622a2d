"""OpenSearch's CPU per edge document, for the settings of the central leg: bulk size, document ids and the
log indices' mapping and codec. The central leg's largest cost is OpenSearch's (~90 of ~120 CPU-us a
line in the drain), and a drain run on a shared machine moves by more than the differences looked for;
so this bench takes one variable at a time, with nothing but OpenSearch and this script running: the
same edge documents (made by a real rsyslogd with the generated ruleset, see logs_edge.edge_documents)
are bulk-indexed into a fresh index per variant, two bulks in flight (as the shipper's two workers), and
OpenSearch's CPU seconds (its whole process session, from /proc) are divided by the documents. Variants
run in interleaved rounds so that a change of load falls on all of them alike; the median of the rounds
is printed.

Example (about 5 minutes on 2 cores):
    python bench/logs_index_cost.py --docs 40000 --rounds 3 --warmup 100000
    python bench/logs_index_cost.py --only codec   # the codec alone against "bulk 5000"
    python bench/logs_index_cost.py --only ids --prefill 300000 --docs 100000 --rounds 2   # ids, grown index
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from logs_common import Stack, free_base
from logs_edge import edge_documents, load

from fleetsight.settings import Settings
from pipelines.apply import TEMPLATES_DIR
from pipelines.rsyslog_conf import edge_document_id


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


def with_message(body: dict[str, Any], mapping: dict[str, Any]) -> dict[str, Any]:
    """body with the `message` field mapped as mapping (the line as read: the largest text field)."""
    changed = copy.deepcopy(body)
    changed["mappings"]["properties"]["message"] = mapping
    return changed


IdsFrom = Callable[[dict], str] | None


def bulk_bodies(index: str, documents: list[dict], size: int, ids: IdsFrom = edge_document_id) -> list[str]:
    """_bulk bodies; each document carries ids(document) as _id (the shipper gives the second of the
    line's time and its origin, so a replay overwrites instead of duplicating: OpenSearch then looks each
    id up first); with ids None OpenSearch makes its own ids (append only, no look-up)."""
    bodies = []
    for start in range(0, len(documents), size):
        lines = []
        for document in documents[start : start + size]:
            action = {"_index": index, "_id": ids(document)} if ids else {"_index": index}
            lines.append(json.dumps({"index": action}))
            lines.append(json.dumps(document))
        bodies.append("\n".join(lines) + "\n")
    return bodies


def origin_id(document: dict) -> str:
    """The id the shipper gave an edge document before: its origin alone."""
    return document["event"]["id"]


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
    stack: Stack,
    url: str,
    name: str,
    body: dict,
    bodies_for: Callable[[str, list[dict]], list[str]],
    documents: list[dict],
    prefill: list[dict] | None = None,
) -> tuple[float, float]:
    """OpenSearch CPU-us per document for one fresh index (holding `prefill` first), and its bytes on disk
    per document once force-merged to one segment (what a warm index keeps; measured after the CPU
    figure; the prefill's documents included)."""
    index = f"bench-{name}-{time.monotonic_ns()}"
    assert httpx.put(f"{url}/{index}", json=body, timeout=60).status_code == 200
    with httpx.Client(timeout=300) as client, ThreadPoolExecutor(2) as pool:

        def send(text: str) -> None:
            answer = client.post(
                f"{url}/_bulk", content=text, headers={"content-type": "application/x-ndjson"}
            )
            assert answer.status_code == 200 and not answer.json()["errors"], answer.text[:500]

        def index_all(batch: list[dict]) -> None:
            # Until searchable with the index's own refresh interval: the refresh's segment writes count.
            target = client.get(f"{url}/{index}/_count").json()["count"] + len(batch)
            list(pool.map(send, bodies_for(index, batch)))
            deadline = time.monotonic() + 300
            while client.get(f"{url}/{index}/_count").json()["count"] < target:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{index}: not all searchable after 300 s")
                time.sleep(0.2)

        if prefill:  # an index that already holds documents (a day's index grows): not counted
            index_all(prefill)
        before = stack.cpu_seconds()["opensearch"]
        index_all(documents)
        used = stack.cpu_seconds()["opensearch"] - before
    httpx.post(f"{url}/{index}/_forcemerge?max_num_segments=1", timeout=600).raise_for_status()
    stored = merged_size(url, index)
    httpx.delete(f"{url}/{index}", timeout=60)
    return 1e6 * used / len(documents), stored / (len(documents) + len(prefill or []))


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
    parser.add_argument(
        "--prefill",
        type=int,
        default=0,
        help="documents each variant's index holds before the counted ones (a grown index: more segments "
        "for each id look-up)",
    )
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="fleetsight-index-cost-"))
    base.chmod(0o755)
    stack = Stack(Settings(run_dir=base / "run", port_base=free_base()))
    try:
        stack.start("opensearch")
        url = stack.settings.url("opensearch")
        made = edge_documents(base / "docs", max(args.warmup, args.prefill + args.docs))
        prefill, documents = made[: args.prefill], made[args.prefill : args.prefill + args.docs]
        now = lambda: index_body(False, "best_compression")  # noqa: E731
        variants: dict[str, tuple[dict, int, IdsFrom]] = {
            "bulk 5000, message.raw (before)": (index_body(True, "best_compression"), 5000, edge_document_id),
            "bulk 2000": (now(), 2000, edge_document_id),
            "bulk 5000": (now(), 5000, edge_document_id),
            "bulk 10000": (now(), 10000, edge_document_id),
            "bulk 5000, codec default (LZ4)": (index_body(False, "default"), 5000, edge_document_id),
            "bulk 5000, ids: the origin alone (before)": (now(), 5000, origin_id),
            "bulk 5000, ids made by OpenSearch (a replay would duplicate)": (now(), 5000, None),
            "bulk 5000, message norms off": (
                with_message(now(), {"type": "text", "norms": False}),
                5000,
                edge_document_id,
            ),
            "bulk 5000, message match_only_text": (
                with_message(now(), {"type": "match_only_text"}),
                5000,
                edge_document_id,
            ),
        }
        if args.only:
            variants = {name: v for name, v in variants.items() if args.only in name or name == "bulk 5000"}
        print(f"before: {load()}", flush=True)
        warm = made[: args.warmup]  # a fresh JVM compiles its hot paths first
        run_variant(stack, url, "warmup", now(), lambda i, batch: bulk_bodies(i, batch, 5000), warm)
        results: dict[str, list[float]] = {name: [] for name in variants}
        sizes: dict[str, list[float]] = {name: [] for name in variants}
        for round_ in range(args.rounds):
            for name, (body, size, ids) in variants.items():
                cost, stored = run_variant(
                    stack, url, "v", body,
                    lambda i, batch, s=size, d=ids: bulk_bodies(i, batch, s, d), documents, prefill,
                )  # fmt: skip
                results[name].append(cost)
                sizes[name].append(stored)
                line = f"round {round_ + 1}: {name}: {cost:.1f} us/doc, {stored:.0f} B/doc; {load()}"
                print(line, flush=True)
        print(
            f"OpenSearch CPU per edge document ({args.docs:,} documents a variant into an index holding "
            f"{args.prefill:,}, median of {args.rounds}), and bytes on disk per document force-merged to one"
            " segment:"
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
