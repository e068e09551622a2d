"""The pace check through a real OpenSearch with FleetSight's own index template (`fleetsight logs apply`):
the twin's per-replica lines indexed as the log pipeline indexes them (pipelines/catalogue.py: the split
keys as numbers), read back by the source, checked by the library, by `fleetsight anomaly pace check`,
and by the training watch's cycle (`fleetsight anomaly sdc serve`), which publishes the pace series."""

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

from anomaly.pace import detect
from anomaly.pace_records import PARTS, from_documents, parse_line
from anomaly.sdc_source import LogStore
from anomaly.sdc_watch import SdcCollector, SdcWatch
from fleetsight.settings import REPO_ROOT
from pipelines.logclasses import BY_NAME
from support import StackEnv, free_port_base
from twin.scenario import from_dict
from twin.sim import Simulation

START = dt.datetime(2026, 11, 21, 10, tzinfo=dt.UTC)
SCENARIO: dict[str, Any] = {
    "seed": 9,
    "duration": "30m",
    "cluster": {"name": "t", "nodes": 8},
    "realism": {"benign_per_node_hour": 0},
    "jobs": [
        {"id": "7201", "nodes": "n0001-n0004", "profile": "llm-8b", "replica_log": True},
        {"id": "7202", "nodes": "n0005-n0008", "profile": "llm-8b", "replica_log": True},
    ],
    "faults": [
        {
            "kind": "slow_host",
            "target": {"node": "n0003"},
            "onset": "18m",
            "duration": "1h",
            "magnitude": 0.25,
        }
    ],
}


def documents(now: dt.datetime) -> list[dict[str, Any]]:
    """The twin's replica lines as the pipeline indexes them, shifted to end now."""
    parsed = from_dict(SCENARIO)
    sim = Simulation(parsed, START)
    while sim.t + parsed.tick < parsed.duration:
        sim.advance()
    shift = now.timestamp() - sim.unix()
    docs = []
    for line in sim.app_lines:
        record = parse_line(line.text)
        if record is None or record.replica is None:
            continue
        moment = dt.datetime.fromtimestamp(sim.unix(line.t) + shift, dt.UTC)
        training: dict[str, Any] = {"step": record.step, "replica": record.replica, "loss": 2.5}
        training |= {"loss_finite": True, "step_time_ms": record.step_ms}
        training |= {part: getattr(record, part) for part in PARTS}
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
    return docs


@pytest.fixture(scope="module")
def store() -> Iterator[str]:
    """OpenSearch runs as an unprivileged user: its run folder must be reachable by it."""
    base = Path(tempfile.mkdtemp(prefix="fleetsight-pace-test-"))
    base.chmod(0o755)
    port_base = free_port_base()
    env = {**os.environ, "FLEETSIGHT_RUN_DIR": str(base / "run"), "FLEETSIGHT_PORT_BASE": str(port_base)}
    stack = StackEnv(base / "run", port_base, env)
    try:
        stack.cli("up", "opensearch", timeout=240)
        url = stack.url("opensearch")
        stack.cli("logs", "apply", "--skip-kafka", "--url", url, timeout=120)
        now = dt.datetime.now(dt.UTC)
        index = f"fleetsight-logs-application-{now:%Y.%m.%d}"
        body = "".join(
            f"{json.dumps({'index': {'_index': index}})}\n{json.dumps(doc)}\n" for doc in documents(now)
        )
        response = httpx.post(
            f"{url}/_bulk",
            params={"refresh": "true"},
            content=body,
            headers={"content-type": "application/x-ndjson"},
            timeout=120,
        )
        assert response.is_success and not response.json()["errors"], response.text[:2000]
        yield url
    finally:
        stack.cli("down", "--timeout", "20", check=False)
        shutil.rmtree(base, ignore_errors=True)


def test_the_store_gives_back_the_split_and_the_slow_host_is_named(store: str) -> None:
    source = LogStore(store)
    try:
        slow = detect(from_documents(source.sources("7201", "2h")), "7201")
        quiet = detect(from_documents(source.sources("7202", "2h")), "7202")
    finally:
        source.close()
    assert slow.flagged and (slow.straggler.cause, slow.straggler.node) == ("host", "n0003")
    assert slow.ranks == 4 and slow.gpus == 32 and slow.gpu_hours_lost > 0
    assert not quiet.flagged and quiet.status == "ok" and quiet.episodes == []


def test_the_cli_reads_the_store_and_exits_1_on_a_straggler(store: str) -> None:
    command = [sys.executable, "-m", "fleetsight.cli", "anomaly", "pace", "check", "--logs-url", store]
    result = subprocess.run(
        [*command, "--since", "2h", "--json"], capture_output=True, text=True, cwd=REPO_ROOT
    )
    assert result.returncode == 1, result.stderr
    verdicts = [json.loads(line) for line in result.stdout.splitlines()]
    assert [v["job"] for v in verdicts] == ["7201", "7202"]
    assert verdicts[0]["straggler"]["node"] == "n0003" and verdicts[0]["straggler"]["cause"] == "host"
    assert verdicts[1]["flagged"] is False and verdicts[1]["status"] == "ok"
    one = subprocess.run([*command, "--job", "7202"], capture_output=True, text=True, cwd=REPO_ROOT)
    assert one.returncode == 0 and one.stdout.startswith("job 7202: ok"), one.stdout + one.stderr


def test_the_training_watch_publishes_the_pace_series(store: str) -> None:
    """One cycle of the training watch: the silent-corruption series as before, and per job its
    slowdown, the GPU-hours lost (a counter) and the straggler with its node and cause."""
    watch = SdcWatch(LogStore(store), since="2h")
    registry = CollectorRegistry()
    registry.register(SdcCollector(watch))
    before = generate_latest(registry).decode()
    assert "fleetsight_job_pace_straggler{" not in before and "fleetsight_job_pace_jobs 0.0" in before
    watch.cycle()
    watch.cycle()  # a second cycle over the same window: the counter does not count the steps twice
    watch.store.close()
    text = generate_latest(registry).decode()
    series = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line[:1] != "#"
    }
    assert series['fleetsight_job_pace_straggler{cause="host",hpc_job="7201",node="n0003"}'] == 1.0
    assert not any(k.startswith("fleetsight_job_pace_straggler{") and "7202" in k for k in series)
    assert 0.15 < series['fleetsight_job_pace_slowdown_ratio{hpc_job="7201"}'] < 0.35
    assert abs(series['fleetsight_job_pace_slowdown_ratio{hpc_job="7202"}']) < 0.03
    lost = series['fleetsight_job_pace_gpu_hours_lost_total{hpc_job="7201"}']
    assert lost == pytest.approx(watch.paces[0].gpu_hours_lost) and lost > 0
    assert series['fleetsight_job_pace_gpu_hours_lost_total{hpc_job="7202"}'] == 0.0
    assert series["fleetsight_training_sdc_jobs"] == 2.0 and series["fleetsight_job_pace_jobs"] == 2.0


def test_the_ingest_pipeline_reads_the_split_keys_as_numbers(store: str) -> None:
    """The installed application pipeline (pipelines/catalogue.py's key_values rule) on a rank's line
    with its split, and on the same line without it (the keys are optional)."""
    full = (
        "[2026-11-21 10:01:30] fleetsight-train step=1201 replica=3 node=n0007 loss=2.412330 "
        "grad_norm=0.8123 step_time_ms=2503.1 data_ms=24.0 compute_ms=2101.7 comm_ms=377.4"
    )
    bare = full.split(" data_ms=")[0]
    docs = [
        {
            "_id": f"n0007:{i}",
            "_source": {
                "@timestamp": "2026-11-21T10:01:31.000Z",
                "message": line,
                "host": {"name": "n0007"},
                "log": {"file": {"path": "/var/log/jobs/4101/rank-24.log"}, "offset": i},
                "event": {"id": f"n0007:{i}"},
                "fleetsight": {"cluster": "test"},
            },
        }
        for i, line in enumerate((full, bare))
    ]
    pipeline = BY_NAME["application"].pipeline_id
    response = httpx.post(f"{store}/_ingest/pipeline/{pipeline}/_simulate", json={"docs": docs}, timeout=60)
    assert response.status_code == 200, response.text
    split, plain = (result["doc"]["_source"] for result in response.json()["docs"])
    assert split["event"]["action"] == plain["event"]["action"] == "training_progress"
    expected = {"step": 1201, "replica": 3, "step_time_ms": 2503.1, "data_ms": 24.0, "compute_ms": 2101.7}
    assert {k: split["training"].get(k) for k in [*expected, "comm_ms"]} == expected | {"comm_ms": 377.4}
    assert all(isinstance(split["training"][k], float) for k in PARTS)
    assert plain["training"]["step_time_ms"] == 2503.1 and not any(k in plain["training"] for k in PARTS)
    (record,) = from_documents([split])
    assert record.split and (record.data_ms, record.comm_ms, record.node) == (24.0, 377.4, "n0007")
