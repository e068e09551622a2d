"""The edge shipper reads a node document's id and day without parsing it (pipelines/rsyslog_conf.
edge_fast_path) and parses the document only when that cannot be trusted. Through the real shipper of the
session's log stack (Kafka, rsyslog, OpenSearch):
- documents as a real node rsyslogd writes them take the fast path, the twin's traffic too;
- the same documents with an escaped quote in the id, written by another JSON encoder, or from a record
  that is no JSON take the full parse;
- every document is indexed under its id (the second of its line's time, then its origin), in its line's
  UTC day, as it was sent; a record that is
  no JSON becomes a document of its own, tagged, on the edge path and on the ingest-pipeline path."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import Producer
from edge_helpers import run_edge
from logs_helpers import LogStack, impstats_reports

from pipelines.component import rsyslog_dir
from pipelines.kafka_security import NODE_USER
from pipelines.logclasses import BY_NAME
from pipelines.rsyslog_conf import edge_document_id
from support import wait_until

KERNEL = BY_NAME["kernel"]
RAW = BY_NAME["application"]  # kept raw locally (component.LOCAL_RAW_CLASSES): its ingest pipeline parses it
NODE = "n0777"
BUCKET = "fleetsight_edge_path"


def node_lines(work: Path, file_name: str, lines: list[str]) -> list[str]:
    """The records a real node rsyslogd makes of these lines, as the text it sends."""
    run_edge(lines, work, node=NODE, file_name=file_name)
    return (work / "edge.jsonl").read_text().splitlines()


def as_node_writes(text: str) -> str:
    """A JSON string value as the node's encoder writes it (every / escaped)."""
    return json.dumps(text).replace("/", "\\/")


def relabel(record: str, suffix: str, timestamp: str | None = None) -> str:
    """The node's record with its id suffixed (a document of its own) and maybe another time."""
    document = json.loads(record)
    old_id = document["event"]["id"]
    record = record.replace(f'"id": {as_node_writes(old_id)}', f'"id": {as_node_writes(old_id + suffix)}', 1)
    if timestamp:
        record = record.replace(
            f'"@timestamp": {as_node_writes(document["@timestamp"])}', f'"@timestamp": "{timestamp}"', 1
        )
    assert json.loads(record)["event"]["id"] == old_id + suffix, record
    return record


def path_counts(stack: LogStack) -> dict[str, int]:
    """The shipper's dyn_stats counters of the kernel class's path (fast, parsed), last report."""
    reports = impstats_reports(rsyslog_dir(stack.settings, "shipper") / "impstats.json", BUCKET)
    counts = {key: int(value) for key, value in reports[-1].get("values", {}).items()} if reports else {}
    return {path: counts.get(f"kernel_{path}", 0) for path in ("fast", "parsed")}


def indexed(stack: LogStack, ids: list[str]) -> dict[str, dict[str, Any]]:
    """The documents of these ids (the shipper's: rsyslog_conf.edge_document_id), by origin."""
    httpx.post(f"{stack.search_url}/{KERNEL.topic}-*/_refresh", timeout=60).raise_for_status()
    response = httpx.post(
        f"{stack.search_url}/{KERNEL.topic}-*/_search",
        json={"size": len(ids), "query": {"ids": {"values": ids}}},
        timeout=60,
    )
    response.raise_for_status()
    return {hit["_source"]["event"]["id"]: hit for hit in response.json()["hits"]["hits"]}


def utc_day(timestamp: str) -> str:
    return datetime.fromisoformat(timestamp).astimezone(UTC).strftime("%Y.%m.%d")


def test_node_documents_skip_the_parse_and_everything_else_is_parsed(
    log_stack: LogStack, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    # Kernel lines no catalogue pattern matches: no event, so no alert rule and no other test of the
    # session's stack (which look for the twin's events) sees them.
    lines = [
        f"2026-11-21T10:08:0{n}.000000+00:00 {NODE} kernel: [ 812.00{n}] edge shipper test {run} line {n}"
        for n in range(4)
    ]
    fast = node_lines(tmp_path / "plain", f"fast-{run}/kern.log", lines)
    # Another day's zone: the day is the UTC one (23:30 at -05:00 is the next day in UTC).
    fast += [relabel(fast[0], ":zoned", "2026-11-21T23:30:00.000-05:00")]
    parsed = node_lines(tmp_path / "odd", f'fast-{run}/odd"name.log', lines[:2])  # id with an escaped quote
    parsed += [json.dumps(json.loads(relabel(record, ":foreign"))) for record in fast[:2]]  # another encoder
    # No time of its own: the full parse, and the bare origin as id (a replay's "now" would differ).
    untimed_document = json.loads(relabel(fast[1], ":untimed"))
    del untimed_document["@timestamp"]
    untimed = json.dumps(untimed_document)
    garbage = f"not a document {run}: no JSON here {{"
    assert all('\\"' in json.dumps(json.loads(record)["event"]["id"]) for record in parsed[:2])

    before = path_counts(log_stack)
    producer = Producer({**log_stack.kafka(NODE_USER), "log_level": 0})
    for record in [*fast, *parsed, untimed, garbage]:
        producer.produce(KERNEL.edge_topic, record.encode())
    producer.produce(RAW.topic, garbage.encode())
    assert producer.flush(30) == 0, "records not delivered to Kafka in 30 s"

    sent = {json.loads(record)["event"]["id"]: record for record in fast + parsed}
    found: dict[str, dict[str, Any]] = {}

    def all_indexed() -> bool:
        found.update(indexed(log_stack, [edge_document_id(json.loads(record)) for record in sent.values()]))
        return len(found) == len(sent)

    deadline = time.monotonic() + 120
    while not all_indexed():
        rejected = rsyslog_dir(log_stack.settings, "shipper") / "rejected.jsonl"
        assert time.monotonic() < deadline, (
            f"indexed {len(found)} of {len(sent)}; missing {sorted(set(sent) - set(found))}; the shipper's "
            f"error file ends: {rejected.read_text()[-3000:] if rejected.exists() else '(none)'}"
        )
        time.sleep(0.5)
    for origin, record in sent.items():
        document = json.loads(record)
        hit = found[origin]
        assert hit["_source"] == document, origin
        # The second of the line's own time first, then its origin: one id per line, replay or not.
        seconds = int(datetime.fromisoformat(document["@timestamp"].replace("Z", "+00:00")).timestamp())
        assert hit["_id"] == f"{seconds}:{origin}", (origin, hit["_id"])
        assert hit["_index"] == f"{KERNEL.topic}-{utc_day(document['@timestamp'])}", (origin, hit["_index"])
    assert found[json.loads(fast[-1])["event"]["id"]]["_index"].endswith("2026.11.22")
    untimed_origin = json.loads(untimed)["event"]["id"]
    assert edge_document_id(json.loads(untimed)) == untimed_origin
    wait_until(
        lambda: bool(indexed(log_stack, [untimed_origin])), timeout=60, what="the record without a time"
    )
    assert indexed(log_stack, [untimed_origin])[untimed_origin]["_source"] == json.loads(untimed)

    query = {"query": {"match_phrase": {"message": f"not a document {run}"}}}

    def garbage_documents() -> list[dict[str, Any]]:
        httpx.post(f"{log_stack.search_url}/fleetsight-logs-*/_refresh", timeout=60)
        answer = httpx.post(f"{log_stack.search_url}/fleetsight-logs-*/_search", json=query, timeout=60)
        return answer.json()["hits"]["hits"]

    wait_until(
        lambda: len(garbage_documents()) == 2, timeout=60, what="the records that are no JSON, indexed"
    )
    # The class's index: the line's day where the path could tell it, else the topic's own name.
    by_class = {
        topic: hit["_source"]
        for hit in garbage_documents()
        for topic in (KERNEL.topic, RAW.topic)
        if hit["_index"] == topic or hit["_index"].startswith(topic + "-")
    }
    assert set(by_class) == {KERNEL.topic, RAW.topic}, [hit["_index"] for hit in garbage_documents()]
    for source in by_class.values():
        tags = source["tags"] if isinstance(source["tags"], list) else [source["tags"]]
        assert source["message"] == garbage and "not_a_node_record" in tags, source

    # impstats reports every 10 s: the counters catch up within a few reports.
    deadline = time.monotonic() + 60
    while (after := path_counts(log_stack))["parsed"] - before["parsed"] < len(parsed) + 2:
        assert time.monotonic() < deadline, (before, after)
        time.sleep(1)
    # Exactly these took the full parse: the node's own records (the twin's traffic too) never do.
    assert after["parsed"] - before["parsed"] == len(parsed) + 2, (before, after)
    assert after["fast"] - before["fast"] >= len(fast), (before, after)
