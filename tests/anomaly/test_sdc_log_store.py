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
