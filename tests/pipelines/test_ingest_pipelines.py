"""Every ingest pipeline, installed on a real OpenSearch by `fleetsight logs apply`, run through
`_simulate` on lines of every class and driver generation, and on garbage (kept whole, tagged)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from logs_helpers import LogStack, shipper_docs
from samples import GARBAGE, SAMPLES, Sample

from pipelines.logclasses import BY_NAME, LOG_CLASSES

# Processors that Elasticsearch 8 and OpenSearch 2 both have (production runs Elasticsearch).
PORTABLE_PROCESSORS = {
    "append", "convert", "date", "date_index_name", "dissect", "grok", "gsub", "lowercase", "remove",
    "rename", "script", "set", "split", "trim", "uppercase", "json", "kv", "dot_expander", "pipeline",
}  # fmt: skip
MISSING = object()


def dotted(document: dict[str, Any], key: str) -> Any:
    value: Any = document
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return MISSING
        value = value[part]
    return value


def simulate(stack: LogStack, log_class: str, lines: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Run lines (text, file path) through the installed pipeline of the class, as the shipper sends them."""
    pipeline = BY_NAME[log_class].pipeline_id
    docs = shipper_docs(log_class, lines)
    response = httpx.post(
        f"{stack.search_url}/_ingest/pipeline/{pipeline}/_simulate", json={"docs": docs}, timeout=60
    )
    assert response.status_code == 200, response.text
    results = response.json()["docs"]
    errors = [result for result in results if "error" in result]
    assert not errors, json.dumps(errors, indent=1)[:3000]
    return [result["doc"] for result in results]


@pytest.fixture(scope="module")
def applied(log_stack: LogStack) -> LogStack:
    """The stack's shipper already ran `logs apply`; the pipelines must be there."""
    for log_class in LOG_CLASSES:
        response = httpx.get(f"{log_stack.search_url}/_ingest/pipeline/{log_class.pipeline_id}", timeout=30)
        assert response.status_code == 200, f"pipeline {log_class.pipeline_id} not installed"
    return log_stack


@pytest.mark.parametrize("log_class", sorted(BY_NAME))
def test_known_lines_parse_into_their_fields(applied: LogStack, log_class: str) -> None:
    samples: list[Sample] = [s for s in SAMPLES if s.log_class == log_class]
    assert samples, f"no samples for {log_class}"
    docs = simulate(applied, log_class, [(s.line, s.path) for s in samples])
    for sample, doc in zip(samples, docs, strict=True):
        source = doc["_source"]
        assert source["message"] == sample.line, "the raw line must be kept whole"
        assert "parse_failure" not in source.get("tags", []), (sample.line, source)
        assert source["event"]["dataset"] == f"fleetsight.{log_class}"
        assert source["host"]["name"] == "n0003"
        assert "_tmp" not in source, "scratch fields must not reach the index"
        for key, want in sample.expected.items():
            got = dotted(source, key)
            if want is None:
                assert got is MISSING, f"{key} should be absent for {sample.line!r}: {got}"
            else:
                assert got == want, f"{key}: {got!r} != {want!r} for {sample.line!r}\n{json.dumps(source)}"
        # The line's own day names the index (a replay lands where the first delivery did): named by
        # the pipeline's script on the usual line forms, by date_index_name (date math) on the others.
        day = source["@timestamp"][:10].replace("-", ".")
        topic = BY_NAME[log_class].topic
        index = doc["_index"]
        assert index == f"{topic}-{day}" or index.startswith(f"<{topic}-{{{day}||"), index


@pytest.mark.parametrize("log_class", sorted(BY_NAME))
def test_garbage_is_kept_whole_and_tagged(applied: LogStack, log_class: str) -> None:
    docs = simulate(applied, log_class, [(line, "") for line in GARBAGE])
    assert len(docs) == len(GARBAGE), "no line may be dropped"
    for line, doc in zip(GARBAGE, docs, strict=True):
        source = doc["_source"]
        assert source["message"] == line
        assert "parse_failure" in source["tags"], source
        assert source["event"]["action"] == "unparsed"
        # Without a time of its own, the line keeps the time the shipper read it.
        assert source["@timestamp"].startswith("2026-11-22T08:00:00.123")


def test_a_processor_failure_keeps_the_document(applied: LogStack) -> None:
    """A shipper time no processor can read fails the daily index name: the document still lands
    (in the index the shipper named), tagged, with the error, the line whole."""
    pipeline = BY_NAME["kernel"].pipeline_id
    response = httpx.post(
        f"{applied.search_url}/_ingest/pipeline/{pipeline}/_simulate",
        json={
            "docs": [
                {"_index": "fleetsight-logs-kernel", "_source": {"@timestamp": "yesterday", "message": "x"}}
            ]
        },
        timeout=30,
    )
    doc = response.json()["docs"][0]["doc"]
    source = doc["_source"]
    assert "pipeline_error" in source["tags"], source
    assert "yesterday" in source["error"]["message"]
    assert source["message"] == "x"
    assert doc["_index"] == "fleetsight-logs-kernel"


@pytest.mark.parametrize("log_class", LOG_CLASSES, ids=lambda c: c.name)
def test_pipelines_use_only_processors_elasticsearch_has_too(log_class: Any) -> None:
    def processor_types(processors: list[dict[str, Any]]) -> set[str]:
        found = set()
        for processor in processors:
            ((kind, options),) = processor.items()
            found.add(kind)
            found |= processor_types(options.get("on_failure", []))
        return found

    body = log_class.pipeline_body()
    used = processor_types(body["processors"]) | processor_types(body.get("on_failure", []))
    assert used <= PORTABLE_PROCESSORS, used - PORTABLE_PROCESSORS
    assert body.get("on_failure"), "a pipeline-level on_failure keeps documents whose processing failed"
