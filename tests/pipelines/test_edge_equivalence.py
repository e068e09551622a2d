"""One catalogue, two engines, the same documents: per catalogued class (kernel, Fabric Manager, BMC SEL,
audit) a corpus
(every sample, every Xid code of the catalogue in every driver generation's form and line frame, every
line the twin writes for the log tests' scenario, the lines the two parsers used to disagree on, near
misses and garbage) goes through the node-side parser (a real
rsyslogd with the generated liblognorm rulebase) and through the kernel ingest pipeline on the real
OpenSearch; the edge documents are indexed as the centre indexes them (_bulk, no pipeline, id = origin)
and read back; every field of every document must be the same."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from edge_helpers import run_edge
from logs_helpers import TEST_SCENARIO, LogStack
from samples import (
    APPLICATION_EDGE_CASES,
    AUDIT_EDGE_CASES,
    BMC_EDGE_CASES,
    FABRICMANAGER_EDGE_CASES,
    GARBAGE,
    KERNEL_EDGE_CASES,
    SAMPLES,
    xid_generations,
)

from fleetsight import xid_catalog
from pipelines.catalogue import CATALOGUES
from pipelines.logclasses import BY_NAME
from support import FLEETSIGHT, REPO_ROOT

XID_FIXTURE = REPO_ROOT / "tests" / "exporters" / "fixtures" / "kernlog" / "xid_generations.log"
TEST_INDEX = "equivalence-edge"
CLASSES = sorted(CATALOGUES)
# Differ by design: when the pipeline ran (the centre no longer runs one for edge-parsed lines).
PIPELINE_ONLY = {"event.ingested"}


def corpus(log_class: str) -> list[str]:
    lines = [s.line for s in SAMPLES if s.log_class == log_class]
    if log_class == "fabricmanager":
        lines += FABRICMANAGER_EDGE_CASES
    elif log_class == "application":
        lines += APPLICATION_EDGE_CASES
    elif log_class == "bmc":
        lines += BMC_EDGE_CASES
    elif log_class == "audit":
        lines += AUDIT_EDGE_CASES
    else:
        lines += XID_FIXTURE.read_text().splitlines()
        lines += KERNEL_EDGE_CASES
        for code in [*sorted(xid_catalog.CATALOG), 999]:
            lines += xid_generations(code)
    # imfile passes no empty line on (there is nothing to keep); every other garbage line goes.
    lines += [line for line in GARBAGE if line]
    return lines


def flat(document: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in document.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def resolved_index(index: str) -> str:
    """A daily index name, also when the pipeline left it as date math (<prefix-{2026-11-21||/d...}>)."""
    if index.startswith("<"):
        prefix, _, rest = index[1:].partition("{")
        return prefix + rest[:10].replace("-", ".")
    return index


def twin_lines(work: Path) -> dict[str, list[str]]:
    """Every line the twin writes to the catalogued classes' files for the log tests' scenario."""
    result = subprocess.run(
        [*FLEETSIGHT, "twin", "run", "--scenario", str(TEST_SCENARIO), "--out", str(work / "twin"),
         "--truth", str(work / "truth.jsonl")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, f"the twin failed:\n{result.stderr[-3000:]}"
    lines: dict[str, list[str]] = {}
    for name in CLASSES:
        for pattern in BY_NAME[name].twin_files:
            for file in sorted((work / "twin" / "nodes").glob(f"*/{pattern}")):
                lines.setdefault(name, []).extend(file.read_text().splitlines())
    return lines


def run_both(stack: LogStack, work: Path, log_class: str, extra: list[str]) -> list[tuple[str, dict, dict]]:
    lines = corpus(log_class) + extra
    # The application class takes the job and the rank from the file's path.
    file_name = "jobs/4101/rank-13.log" if log_class == "application" else "kern.log"
    edge, records = run_edge(lines, work, log_class, file_name=file_name)
    url = stack.search_url
    pipeline = BY_NAME[log_class].pipeline_id
    docs = [{"_index": pipeline, "_id": r["event"]["id"], "_source": r} for r in records]
    response = httpx.post(f"{url}/_ingest/pipeline/{pipeline}/_simulate", json={"docs": docs}, timeout=120)
    assert response.status_code == 200, response.text
    ingest = [result["doc"] for result in response.json()["docs"]]
    # The centre's way for edge documents: _bulk, no pipeline, the origin as id; then read back.
    index = f"{TEST_INDEX}-{log_class}"
    bulk = "".join(
        json.dumps({"index": {"_index": index, "_id": d["event"]["id"]}}) + "\n" + json.dumps(d) + "\n"
        for d in edge
    )
    response = httpx.post(
        f"{url}/_bulk?refresh=true",
        content=bulk,
        headers={"content-type": "application/x-ndjson"},
        timeout=120,
    )
    assert response.status_code == 200 and not response.json()["errors"], response.text[:2000]
    ids = [d["event"]["id"] for d in edge]
    got = httpx.post(f"{url}/{index}/_mget", json={"ids": ids}, timeout=60).json()["docs"]
    stored = [doc["_source"] for doc in got]
    return list(zip(lines, stored, ingest, strict=True))


@pytest.fixture(scope="module")
def results(log_stack: LogStack, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list]:
    twin = twin_lines(tmp_path_factory.mktemp("twin"))
    assert len(twin.get("kernel", [])) > 20 and twin.get("fabricmanager"), {
        k: len(v) for k, v in twin.items()
    }
    return {
        name: run_both(log_stack, tmp_path_factory.mktemp(name), name, twin.get(name, [])) for name in CLASSES
    }


@pytest.fixture(scope="module")
def both(results: dict[str, list]) -> list[tuple[str, dict, dict]]:
    return results["kernel"]


@pytest.mark.parametrize("log_class", CLASSES)
def test_both_engines_make_the_same_documents(results: dict[str, list], log_class: str) -> None:
    differences = []
    for line, edge, ingest in results[log_class]:
        left = flat(edge)
        right = {k: v for k, v in flat(ingest["_source"]).items() if k not in PIPELINE_ONLY}
        diff = {
            k: (left.get(k), right.get(k)) for k in left.keys() | right.keys() if left.get(k) != right.get(k)
        }
        day = edge["@timestamp"][:10].replace("-", ".")
        want = f"{BY_NAME[log_class].topic}-{day}"
        if resolved_index(ingest["_index"]) != want:
            diff["_index"] = (want, ingest["_index"])
        if diff:
            differences.append(f"{line[:160]!r}: edge vs pipeline {diff}")
    total = len(results[log_class])
    assert not differences, f"{len(differences)} of {total} differ:\n" + "\n".join(differences[:20])


def test_fabric_manager_corpus_covers_its_events(results: dict[str, list]) -> None:
    actions = {edge["event"]["action"] for _, edge, _ in results["fabricmanager"]}
    assert {"nvswitch_fatal", "sxid", "fm_error", "fm_message", "unparsed"} <= actions, actions


def test_application_bmc_and_audit_corpora_cover_their_events(results: dict[str, list]) -> None:
    """Not a vacuous agreement: every event of these classes, both tags, job and rank from the path."""
    app = {e["event"]["action"] for _, e, _ in results["application"]}
    assert {
        "training_progress", "loss_nonfinite", "nccl_timeout", "cuda_error", "nccl_error", "nccl_info",
        "app_error", "app_message", "unparsed",
    } <= app, app  # fmt: skip
    progress = [e for _, e, _ in results["application"] if e["event"]["action"] == "training_progress"]
    assert all(e["fleetsight"]["hpc_job"] == "4101" for e in progress)
    assert any("grad_norm" in e["training"] for e in progress)
    upper = [e for line, e, _ in results["application"] if line.startswith("[2026-11-21 10:01:31] STEP")]
    assert upper and upper[0]["training"]["loss_text"] == "nan", "case-insensitive, lower-cased captures"
    bmc = {(e["event"]["action"], e["log"]["level"]) for _, e, _ in results["bmc"]}
    assert {("bmc_sel", "error"), ("bmc_sel", "warning"), ("bmc_sel", "info"), ("unparsed", "info")} <= bmc
    assert any(e.get("bmc", {}).get("sel", {}).get("sensor") for _, e, _ in results["bmc"])
    audit = {e["event"]["action"] for _, e, _ in results["audit"]}
    assert {"ssh_login", "ssh_login_failed", "sudo", "message", "unparsed"} <= audit, audit
    tags = {t for name in ("bmc", "audit") for _, e, _ in results[name] for t in e.get("tags", [])}
    assert {"parse_failure", "timestamp_unparsed"} <= tags


def test_the_corpus_covers_every_event_and_frame(both: list[tuple[str, dict, dict]]) -> None:
    """Not a vacuous agreement: every catalogued event, every Xid code, both tags, each line frame."""
    actions = {edge["event"]["action"] for _, edge, _ in both}
    catalogue = CATALOGUES["kernel"]
    wanted = {rule.action for rule in catalogue.events} - {"ib_port_state"} | {
        "nvswitch_fatal", "ib_link_down", "ib_link_up", "ib_port_state", "gpu_fallen_off_bus",
        "kernel_message", "unparsed",
    }  # fmt: skip
    assert wanted <= actions, wanted - actions
    codes = {edge.get("nvidia", {}).get("xid", {}).get("code") for _, edge, _ in both}
    assert set(xid_catalog.CATALOG) <= codes
    tags = {tag for _, edge, _ in both for tag in edge.get("tags", [])}
    assert {"parse_failure", "timestamp_unparsed"} <= tags
    # The lines the node agent parses and the pipeline used to miss: now Xids in both.
    for line, edge, _ in both:
        if "NVRM: Xid (PCI:0000:5d:00): 48" in line or line.startswith(("[Fri Aug 30", "kernel: NVRM")):
            assert edge["event"]["action"] == "xid", (line, edge)
    assert all(edge["message"] == line for line, edge, _ in both), "the raw line is kept whole"


def test_a_kernel_line_without_timestamp_still_parses(log_stack: LogStack) -> None:
    pipeline = BY_NAME["kernel"].pipeline_id
    line = "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=p, x"
    response = httpx.post(
        f"{log_stack.search_url}/_ingest/pipeline/{pipeline}/_simulate",
        json={"docs": [{"_source": {"message": line}}]},
        timeout=30,
    )
    source = response.json()["docs"][0]["doc"]["_source"]
    assert "pipeline_error" not in source.get("tags", []), source
    assert source["nvidia"]["xid"]["code"] == 13 and source["@timestamp"] == "2024-08-30T11:43:09.000Z"


@pytest.mark.parametrize("log_class", sorted(BY_NAME))
def test_a_document_without_timestamp_takes_the_ingest_time(log_stack: LogStack, log_class: str) -> None:
    """Every class's pipeline: no @timestamp -> the ingest time, never `pipeline_error`."""
    pipeline = BY_NAME[log_class].pipeline_id
    response = httpx.post(
        f"{log_stack.search_url}/_ingest/pipeline/{pipeline}/_simulate",
        json={"docs": [{"_source": {"message": "no time anywhere"}}]},
        timeout=30,
    )
    source = response.json()["docs"][0]["doc"]["_source"]
    assert "pipeline_error" not in source.get("tags", []), source
    assert source["@timestamp"].startswith(str(datetime.now(UTC).year)), source
    assert source["message"] == "no time anywhere"


def test_generated_files_agree_with_the_catalogue() -> None:
    from pipelines import generate

    assert not generate.stale(), "run `fleetsight logs generate`"


@pytest.mark.parametrize("log_class", CLASSES)
def test_the_rulebase_is_what_rsyslog_loads(tmp_path: Path, log_class: str) -> None:
    """The generated rulebases and ruleset pass rsyslogd's own validation (also run by run_edge)."""
    from pipelines.rsyslog_conf import edge_file_config

    config = tmp_path / "r.conf"
    config.write_text(
        edge_file_config(tmp_path, tmp_path / "in", tmp_path / "o", tmp_path / "r", log_class, "n", "c")
    )
    result = subprocess.run(
        ["rsyslogd", "-N1", "-f", str(config)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "error" not in result.stderr.lower(), result.stderr
