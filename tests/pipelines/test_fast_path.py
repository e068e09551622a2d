"""The kernel and application pipelines read their usual line forms in a fast first script and leave
every other form to grok and date: two paths to the same fields. Every sample line, garbage, edge cases
and every line the twin writes go through each pipeline as shipped and with the fast path switched off
(its script's `fast_path` parameter; grok then does all the work), on the real OpenSearch: the
documents must be the same, and the usual forms must really take the fast path."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from logs_helpers import TEST_SCENARIO, LogStack, shipper_docs
from samples import GARBAGE, SAMPLES

from pipelines.logclasses import BY_NAME
from support import FLEETSIGHT, REPO_ROOT

FAST_CLASSES = ("kernel", "application")
RANK_LOG = "/var/log/jobs/7/rank-1.log"
KERN = (
    "2026-11-21T10:08:00.123456+00:00 n0003 kernel: [1229615.939836] NVRM: Xid (PCI:0000:3a:00): 79, "
    "pid=57075, name=python3, GPU has fallen off the bus."
)
# Near misses of the usual forms, on either side of what the fast script accepts.
EDGE_LINES = {
    "kernel": [
        KERN.replace("+00:00", "+02:00"), KERN.replace("+00:00", "-05:30"), KERN.replace("+00:00", "+18:00"),
        KERN.replace("+00:00", "+19:00"), KERN.replace("T10:08", "T23:08").replace("+00:00", "-05:00"),
        KERN.replace(".123456", ".999999"), KERN.replace("11-21", "02-30"), KERN.replace("T10:", "T24:"),
        KERN.replace("10:08:00", "10:08:60"), KERN.replace("2026-", "0026-"), KERN.replace(".123456", ""),
        KERN.replace("+00:00", "Z"), KERN.replace("n0003", "n0003.example.com"), KERN.replace("n0003", "n-3"),
        KERN.replace("n0003", "-n3"), KERN.replace("n0003", "N3_x"), KERN.replace("n0003", "h" * 63),
        KERN.replace("n0003", "h" * 64), KERN.replace("[1229615.939836]", "[    3.000000]"),
        KERN.replace("[1229615.939836]", "[12]"), KERN.replace("[1229615.939836]", "[1.]"),
        KERN.replace("[1229615.939836]", "[.5]"), KERN.replace("[1229615.939836]", "[-1.5]"),
        KERN.replace("[1229615.939836]", "[1e5]"), KERN.replace("[1229615.939836]", "[ 1.5 ]"),
        KERN.replace("[1229615.939836] ", ""), KERN.replace("kernel: ", "kernel:  "), KERN + "\nsecond line",
        KERN.replace("[1229615.939836]", "[1229615.939836]\n second line"), KERN[:KERN.index("[")],
        KERN[:KERN.index("]") + 1], KERN.replace("kernel:", "kernel"),
    ],
    "application": [
        "[2026-11-21 10:01:30] hello", "[2026-02-30 10:01:30] hello", "[2026-11-21 24:00:00] hello",
        "[2026-11-21 10:01:60] hello", "[2026-11-21 10:01:30]  two spaces", "[2026-11-21 10:01:30] ",
        "[2026-11-21 10:01:30]", "[2026-11-21 10:01:30] a\nb", "[0026-11-21 10:01:30] hello",
        "[2026-11-21T10:01:30] hello", "[2026-11-21 10:01:30.123] hello", "[2026-11-21 10:01:30,123] x",
        "2026-11-21 10:01:30 x", "[2026-1-21 10:01:30] x", "[+026-11-21 10:01:30] x",
        "[9999-12-31 23:59:59] x", "[1970-01-01 00:00:00] x", "[2026-11-21 10:01:30]\tx",
    ],
}  # fmt: skip
# The usual forms: sample and twin lines of these forms must take the fast path (the edge cases above
# include near misses that it rightly leaves to grok).
USUAL = {
    "kernel": re.compile(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+\d\d:\d\d [a-z0-9-]+ kernel: \[ *\d+\.\d+\] "
    ),
    "application": re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] "),
}
DATE_MATH_INDEX = re.compile(r"<(?P<prefix>.+)\{(?P<day>\d{4}\.\d\d\.\d\d)\|\|/d\{yyyy\.MM\.dd\|UTC\}\}>")


@pytest.fixture(scope="module")
def twin_lines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, str]]]:
    """Every kernel and job log line the twin writes for the log tests' scenario, at full speed."""
    out = tmp_path_factory.mktemp("twin")
    result = subprocess.run(
        [*FLEETSIGHT, "twin", "run", "--scenario", str(TEST_SCENARIO), "--out", str(out / "twin"),
         "--truth", str(out / "truth.jsonl")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, f"the twin failed:\n{result.stderr[-3000:]}"
    lines: dict[str, list[tuple[str, str]]] = {}
    for log_class in FAST_CLASSES:
        for pattern in BY_NAME[log_class].twin_files:
            for file in sorted((out / "twin" / "nodes").glob(f"*/{pattern}")):
                path = "/" + str(Path(*file.relative_to(out / "twin" / "nodes").parts[1:]))
                text = file.read_text()
                lines.setdefault(log_class, []).extend((line, path) for line in text.splitlines())
    return lines


def run(stack: LogStack, body: dict[str, Any], docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    response = httpx.post(
        f"{stack.search_url}/_ingest/pipeline/_simulate", json={"pipeline": body, "docs": docs}, timeout=120
    )
    assert response.status_code == 200, response.text[:3000]
    return response.json()["docs"]


def without_fast_path(body: dict[str, Any]) -> dict[str, Any]:
    variant = copy.deepcopy(body)
    envelope = next(p["script"] for p in variant["processors"] if "script" in p)
    assert envelope["params"]["fast_path"] is True, "the first script holds the fast path"
    envelope["params"]["fast_path"] = False
    return variant


def comparable(result: dict[str, Any]) -> dict[str, Any]:
    """What must be the same on both paths. Left out: `_ingest` (simulate's own metadata, the time of
    the run) and `event.ingested` (set from `_ingest.timestamp`: when each run processed the document).
    The daily index is named literally by the fast path and as date math by `date_index_name`: the
    date math is resolved as OpenSearch resolves it (round to the day, UTC) and the names compared."""
    result = copy.deepcopy(result)
    doc = result.get("doc")
    if doc is None:
        return result  # a simulate error: compared whole
    doc.pop("_ingest", None)
    doc["_source"].get("event", {}).pop("ingested", None)
    math = DATE_MATH_INDEX.fullmatch(doc["_index"])
    if math:
        doc["_index"] = math["prefix"] + math["day"]
    return result


def took_fast_path(result: dict[str, Any]) -> bool:
    """Only the fast path names the daily index in the script; the other forms leave it to
    `date_index_name`, which writes date math."""
    return "doc" in result and not result["doc"]["_index"].startswith("<")


@pytest.mark.parametrize("log_class", FAST_CLASSES)
def test_fast_path_and_grok_make_the_same_documents(
    log_stack: LogStack, twin_lines: dict[str, list[tuple[str, str]]], log_class: str
) -> None:
    path = RANK_LOG if log_class == "application" else ""
    samples = [(s.line, s.path) for s in SAMPLES if s.log_class == log_class]
    edges = [(line, path) for line in EDGE_LINES[log_class] + GARBAGE]
    twin = twin_lines.get(log_class, [])
    assert len(twin) > 20, f"the twin wrote too few {log_class} lines: {len(twin)}"
    lines = samples + edges + twin
    body = BY_NAME[log_class].pipeline_body()
    docs = shipper_docs(log_class, lines)
    shipped, grok_only = run(log_stack, body, docs), run(log_stack, without_fast_path(body), docs)

    differ = [
        f"{line!r}\n  fast path: {comparable(fast)}\n  grok only: {comparable(slow)}"
        for (line, _), fast, slow in zip(lines, shipped, grok_only, strict=True)
        if comparable(fast) != comparable(slow)
    ]
    assert not differ, f"{len(differ)} of {len(lines)} lines differ:\n" + "\n".join(differ[:5])
    assert not any(took_fast_path(result) for result in grok_only), "fast_path false must switch it off"
    results = list(zip(lines, shipped, strict=True))
    real = results[: len(samples)] + results[len(samples) + len(edges) :]  # samples and twin lines
    usual = [(line, result) for (line, _), result in real if USUAL[log_class].match(line)]
    missed = [line for line, result in usual if not took_fast_path(result)]
    assert not missed, f"{len(missed)} of {len(usual)} usual lines missed the fast path, e.g. {missed[0]!r}"
    fast = sum(took_fast_path(result) for result in shipped)
    print(
        f"\n{log_class}: {len(lines)} lines ({len(twin)} from the twin) the same on both paths; {fast} fast"
    )
