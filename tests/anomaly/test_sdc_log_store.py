"""The silent-corruption check through a real OpenSearch with FleetSight's own index template (`fleetsight
logs apply`): documents shaped as the log pipeline indexes the twin's lines (a corrupt job with
per-replica lines, a healthy one with Megatron lines from every rank), read back by the source
(anomaly/sdc_source.py) and checked, by the library and by `fleetsight anomaly sdc check`."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from anomaly.sdc import detect
from anomaly.sdc_records import parse_line
from anomaly.sdc_source import LogStore, SourceError
from anomaly.sdc_watch import SdcCollector, SdcWatch
from anomaly.sdc_window import INGESTED_MARGIN_S, WindowReader
from fleetsight.settings import REPO_ROOT
from support import StackEnv, free_port_base
from twin.scenario import from_dict
from twin.sim import Simulation

START = dt.datetime(2026, 11, 21, 10, tzinfo=dt.UTC)
SCENARIO: dict[str, Any] = {
    "seed": 5,
    "duration": "25m",
    "cluster": {"name": "t", "nodes": 6},
    "realism": {"benign_per_node_hour": 0},
    "jobs": [
        {"id": "7101", "nodes": "n0001-n0004", "profile": "llm-8b", "replica_log": True},
        {"id": "7102", "nodes": "n0005-n0006", "profile": "llm-20b", "pipeline_stages": 1},
    ],
    "faults": [{"kind": "sdc_training", "target": {"node": "n0002"}, "onset": "15m", "magnitude": 0.4}],
}


def documents(now: dt.datetime) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The twin's training lines as the pipeline indexes them (fields of pipelines/catalogue.py), shifted
    to end now; and the corruption's truth."""
    parsed = from_dict(SCENARIO)
    sim = Simulation(parsed, START)
    while sim.t + parsed.tick < parsed.duration:
        sim.advance()
    shift = now.timestamp() - sim.unix()
    docs = []
    for line in sim.app_lines:
        record = parse_line(line.text)
        if record is None:
            continue
        moment = dt.datetime.fromtimestamp(sim.unix(line.t) + shift, dt.UTC)
        training: dict[str, Any] = {"step": record.step, "loss": record.loss, "loss_finite": True}
        if record.grad_norm is not None:
            training["grad_norm"] = record.grad_norm
        if record.replica is not None:
            training["replica"] = record.replica
        docs.append(
            {
                "@timestamp": moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
                "host": {"name": sim.nodes[line.node]},
                "event": {"action": "training_progress", "dataset": "fleetsight.application"},
                "fleetsight": {"hpc_job": line.job, "rank": line.rank, "log_class": "application"},
                "training": training,
                "message": line.text,
            }
        )
    truth = next(t for t in sim.truth_lines if t["kind"] == "sdc_training")
    return docs, truth


@pytest.fixture(scope="module")
def store() -> Iterator[tuple[str, dict[str, Any]]]:
    """OpenSearch runs as an unprivileged user: its run folder must be reachable by it."""
    base = Path(tempfile.mkdtemp(prefix="fleetsight-sdc-test-"))
    base.chmod(0o755)
    port_base = free_port_base()
    env = {**os.environ, "FLEETSIGHT_RUN_DIR": str(base / "run"), "FLEETSIGHT_PORT_BASE": str(port_base)}
    stack = StackEnv(base / "run", port_base, env)
    try:
        stack.cli("up", "opensearch", timeout=240)
        url = stack.url("opensearch")
        stack.cli("logs", "apply", "--skip-kafka", "--url", url, timeout=120)
        now = dt.datetime.now(dt.UTC)
        docs, truth = documents(now)
        index = f"fleetsight-logs-application-{now:%Y.%m.%d}"
        body = "".join(f"{json.dumps({'index': {'_index': index}})}\n{json.dumps(doc)}\n" for doc in docs)
        response = httpx.post(
            f"{url}/_bulk",
            params={"refresh": "true"},
            content=body,
            headers={"content-type": "application/x-ndjson"},
            timeout=120,
        )
        assert response.is_success and not response.json()["errors"], response.text[:2000]
        yield url, truth
    finally:
        stack.cli("down", "--timeout", "20", check=False)
        shutil.rmtree(base, ignore_errors=True)


def test_the_corrupt_job_is_flagged_with_its_replica_and_the_healthy_one_is_not(
    store: tuple[str, dict[str, Any]],
) -> None:
    url, truth = store
    source = LogStore(url)
    try:
        assert source.jobs("2h") == ["7101", "7102"]
        corrupt = detect(source.records("7101", "2h"), "7101")
        healthy_records = source.records("7102", "2h")
        healthy = detect(healthy_records, "7102")
    finally:
        source.close()
    assert corrupt.flagged and corrupt.reason == "replicas_disagree"
    assert truth["onset_step"] <= corrupt.step <= truth["onset_step"] + 10
    assert [(s.replica, s.node) for s in corrupt.suspects] == [(truth["replica"], "n0002")]
    assert not healthy.flagged and healthy.replicas == 0
    assert len({r.step for r in healthy_records}) == len(healthy_records), "one record per step, not per rank"


def test_the_cli_reads_the_store_and_exits_1_on_a_flag(store: tuple[str, dict[str, Any]]) -> None:
    url, _ = store
    command = [sys.executable, "-m", "fleetsight.cli", "anomaly", "sdc", "check", "--logs-url", url]
    result = subprocess.run([*command, "--since", "2h"], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("job 7101: FLAGGED at step") and "on n0002" in lines[0], lines
    assert lines[1].startswith("job 7102: no sign of corruption"), lines
    bad = subprocess.run([*command, "--since", "six hours"], capture_output=True, text=True, cwd=REPO_ROOT)
    assert bad.returncode == 2 and "a number and a unit" in bad.stderr


def test_the_service_cycle_publishes_the_suspect_for_the_alert(store: tuple[str, dict[str, Any]]) -> None:
    """What `fleetsight anomaly sdc serve` publishes after a cycle: the series the rule reads
    (rules/training.yml), the suspect's labels, and that it read the store."""
    url, truth = store
    watch = SdcWatch(LogStore(url), since="2h")
    registry = CollectorRegistry()
    registry.register(SdcCollector(watch))
    assert "fleetsight_training_sdc_source_up 0.0" in generate_latest(registry).decode()
    verdicts = watch.cycle()
    watch.store.close()
    assert [v.job for v in verdicts if v.flagged] == ["7101"]
    text = generate_latest(registry).decode()
    suspects = [line for line in text.splitlines() if line.startswith("fleetsight_training_sdc_suspect{")]
    assert len(suspects) == 1 and 'hpc_job="7101"' in suspects[0] and 'node="n0002"' in suspects[0]
    assert f'replica="{truth["replica"]}"' in suspects[0] and suspects[0].endswith(" 1.0")
    assert 'fleetsight_training_sdc_flagged{hpc_job="7101",reason="replicas_disagree"} 1.0' in text
    assert "fleetsight_training_sdc_jobs 2.0" in text and "fleetsight_training_sdc_source_up 1.0" in text


def test_an_unreachable_store_is_a_clear_error() -> None:
    source = LogStore(f"http://127.0.0.1:{free_port_base() + 1}", timeout_s=2.0)
    with pytest.raises(SourceError, match="log store unreachable"):
        source.jobs()
    source.close()


def training_document(job: str, step: int, at: dt.datetime, ingested: dt.datetime) -> dict[str, Any]:
    """A job-wide progress line as the ingest pipeline indexes it, with the moment it was indexed."""
    return {
        "@timestamp": at.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
        "host": {"name": "n0009"},
        "event": {
            "action": "training_progress",
            "dataset": "fleetsight.application",
            "ingested": ingested.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
        },
        "fleetsight": {"hpc_job": job, "rank": 0, "log_class": "application"},
        "training": {"step": step, "loss": 3.0 - step / 1000, "loss_finite": True, "grad_norm": 1.0},
    }


def bulk(url: str, documents: list[dict[str, Any]], now: dt.datetime) -> None:
    index = f"fleetsight-logs-application-{now:%Y.%m.%d}"
    body = "".join(f"{json.dumps({'index': {'_index': index}})}\n{json.dumps(doc)}\n" for doc in documents)
    response = httpx.post(
        f"{url}/_bulk", params={"refresh": "true"}, content=body,
        headers={"content-type": "application/x-ndjson"}, timeout=60,
    )  # fmt: skip
    assert response.is_success and not response.json()["errors"], response.text[:2000]


def read_counts(registry: CollectorRegistry) -> dict[str, float]:
    return {
        kind: registry.get_sample_value("fleetsight_training_sdc_documents_read_total", {"read": kind}) or 0.0
        for kind in ("whole", "partial")
    }


def test_later_cycles_read_only_what_was_indexed_since_and_see_what_a_whole_read_sees(
    store: tuple[str, dict[str, Any]],
) -> None:
    """The watch keeps each job's documents (anomaly/sdc_window.py): a second cycle asks the store only for
    documents indexed since the first (event.ingested), late lines and a line delivered twice included,
    and the job's documents are then exactly those a whole read returns, in the same order. Runs last in
    this module: it adds job 7103."""
    url, _ = store
    now = dt.datetime.now(dt.UTC)
    # The first 60 steps were indexed one every 5 s, ending 10 minutes ago.
    first_indexed = now - dt.timedelta(minutes=10)
    first = [
        training_document(
            "7103",
            step,
            now - dt.timedelta(seconds=300 - step),
            first_indexed - dt.timedelta(seconds=5 * (60 - step)),
        )
        for step in range(1, 61)
    ]
    bulk(url, first, now)
    watch = SdcWatch(LogStore(url), since="2h")
    registry = CollectorRegistry()
    registry.register(SdcCollector(watch))
    try:
        watch.cycle()
        whole_after_first = read_counts(registry)["whole"]
        assert whole_after_first >= 60 and read_counts(registry)["partial"] == 0
        # New steps, a late line (its own time before the newest step already read) and step 30 again
        # (a shipper's retry: another document), all indexed now.
        later = [
            training_document("7103", step, now - dt.timedelta(seconds=300 - step), now) for step in (61, 62)
        ]
        late = training_document("7103", 63, now - dt.timedelta(seconds=290), now)
        again = training_document("7103", 30, now - dt.timedelta(seconds=270), now)
        bulk(url, [*later, late, again], now)
        watch.cycle()
        counts = read_counts(registry)
        kept = [
            (d["training"]["step"], d["@timestamp"]) for d in watch.reader.read("7103", now.timestamp() + 1)
        ]
        whole = LogStore(url)
        try:
            expected = [(d["training"]["step"], d["@timestamp"]) for d in whole.sources("7103", "2h")]
        finally:
            whole.close()
        # Past the bound on what is kept, a job is read whole each cycle and not kept.
        bounded = WindowReader(LogStore(url), since="2h", max_kept=10)
        try:
            assert len(bounded.read("7103")) == len(bounded.read("7103")) == 64
            assert "7103" not in bounded.jobs and bounded.documents_read == {"whole": 128, "partial": 0}
            assert bounded.kept_total == 0
        finally:
            bounded.store.close()
    finally:
        watch.store.close()
    # The jobs without event.ingested (7101, 7102: indexed outside the pipelines) are read whole each
    # cycle; 7103's second read brought its 4 new documents and those indexed within the margin before
    # the newest it had (the index refresh and the ingest nodes' clocks): 25 of the first 60.
    margin_start = first_indexed - dt.timedelta(seconds=INGESTED_MARGIN_S)
    again_read = sum(
        1 for d in first if d["event"]["ingested"] >= margin_start.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    )
    assert again_read == 25 and counts["partial"] == 4 + again_read, counts
    assert len(expected) == 64 and kept == expected
    assert watch.reader.jobs["7103"].newest_ingested == pytest.approx(now.timestamp(), abs=0.01)
    # The running total of what is kept is the jobs' sum, and forgetting a job takes its part.
    reader = watch.reader
    assert reader.kept_total == sum(len(w.documents) for w in reader.jobs.values()) >= 64
    reader.keep_only(name for name in reader.jobs if name != "7103")
    assert reader.kept_total == sum(len(w.documents) for w in reader.jobs.values())
    assert "7103" not in reader.jobs


def test_a_page_that_ends_inside_a_group_of_equal_sort_values_loses_none_of_it(
    store: tuple[str, dict[str, Any]],
) -> None:
    """The ranks of one host log a step in the same millisecond: their documents share every sort value
    (step, time, host). Pages of 5 over 4 steps of 3 such lines each end inside a group (after 5, 10):
    every document is read once, in the store's order. Runs after the others: it adds job 7104."""
    url, _ = store
    now = dt.datetime.now(dt.UTC)
    moments = {step: now - dt.timedelta(seconds=60 - step) for step in range(1, 5)}
    lines = []
    for step, moment in moments.items():
        for rank in range(3):
            line = training_document("7104", step, moment, now)
            line["training"]["grad_norm"] = 1.0 + rank  # which rank's line: `_source` holds training.*
            lines.append(line)
    bulk(url, lines, now)
    paged = LogStore(url, page=5)
    try:
        read = paged.documents("7104", "2h")
        ids = [key for key, _ in read]
        assert len(ids) == len(set(ids)) == 12, ids
        assert sorted(d["training"]["grad_norm"] for _, d in read if d["training"]["step"] == 2) == [1, 2, 3]
        assert [d["training"]["step"] for _, d in read] == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]
        # A whole page of one group cannot be paged past: said, not skipped.
        narrow = LogStore(url, page=3)
        with pytest.raises(SourceError, match="more than a page"):
            narrow.documents("7104", "2h")
        narrow.close()
    finally:
        paged.close()


def test_a_job_that_cannot_be_paged_is_skipped_and_the_others_are_still_checked(
    store: tuple[str, dict[str, Any]],
) -> None:
    """Job 7104 (the test above) holds groups of 3 documents with equal sort values: pages of 3 cannot get
    past them. The watch's cycle skips that job and still checks the others, instead of failing whole."""
    url, _ = store
    watch = SdcWatch(LogStore(url, page=3), since="2h")
    try:
        verdicts = watch.cycle()
    finally:
        watch.store.close()
    assert watch.up
    assert "7104" not in {v.job for v in verdicts} and "7103" in {v.job for v in verdicts}
