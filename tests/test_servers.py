"""Smoke tests of what `fleetsight setup` installs: each server starts from the installed artefacts on
loopback free ports, in a temporary folder, answers, and is stopped with nothing left behind."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from opensearchpy import OpenSearch

from fleetsight.settings import Settings
from metrics.install import THANOS_BUILD, THANOS_VERSION
from pipelines.kafka_install import KAFKA_VERSION, kafka_java_command, kafka_present, kafka_server_properties
from pipelines.opensearch_install import (
    OPENSEARCH_HEAP,
    OPENSEARCH_VERSION,
    opensearch_command,
    opensearch_present,
    opensearch_run_as,
    prepare_opensearch_instance,
)
from support import free_port, wait_until

pytestmark = pytest.mark.stack

SETTINGS = Settings()
STOP_TIMEOUT_S = 30


def require_installed(step: str, present: bool) -> None:
    if not present:
        pytest.fail(
            f"{step} is not installed (or not the pinned version): run `fleetsight setup --only {step}`"
        )


def child_pids(pid: int) -> list[int]:
    """All live descendants of pid (runuser -> java, a launch script -> java, ...)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def pid_running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server and wait; SIGKILL what is still there after the deadline. Fails the test if
    anything survives. A launcher (runuser) is not signalled itself: it would SIGKILL its child 2 s
    later; its child, the server, is, and the launcher then exits with it."""
    family = [process.pid, *child_pids(process.pid)]
    for pid in family[1:] or family:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=STOP_TIMEOUT_S)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while any(pid_running(pid) for pid in family) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = [pid for pid in family if pid_running(pid)]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert survivors == [], f"processes {survivors} did not stop on SIGTERM within {STOP_TIMEOUT_S}s"


def start(command: list[str], log: Path, **kwargs: object) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(  # type: ignore[call-overload]
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **kwargs
        )


def alive_or_fail(process: subprocess.Popen[bytes], log: Path, name: str) -> None:
    if process.poll() is not None:
        pytest.fail(
            f"{name} exited with code {process.returncode}:\n{log.read_text(errors='replace')[-3000:]}"
        )


# -- Thanos ----------------------------------------------------------------------------------------

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_ulid() -> str:
    """A ULID (48-bit milliseconds + 80 random bits, Crockford base32), as Thanos names blocks."""
    value = (int(time.time() * 1000) << 80) | secrets.randbits(80)
    return "".join(CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


def write_block_meta(bucket: Path, ulid: str) -> None:
    """A block's meta.json as a Thanos sidecar uploads it (the listing reads only this file)."""
    now_ms = int(time.time() * 1000)
    meta = {
        "ulid": ulid,
        "minTime": now_ms - 2 * 3600 * 1000,
        "maxTime": now_ms,
        "stats": {"numSamples": 1440, "numSeries": 2, "numChunks": 12},
        "compaction": {"level": 1, "sources": [ulid]},
        "version": 1,
        "thanos": {
            "labels": {"cluster": "test", "replica": "a"},
            "downsample": {"resolution": 0},
            "source": "sidecar",
        },
    }
    (bucket / ulid).mkdir(parents=True)
    (bucket / ulid / "meta.json").write_text(json.dumps(meta))


def filesystem_objstore(tmp_path: Path, name: str) -> tuple[Path, Path]:
    bucket = tmp_path / name
    bucket.mkdir()
    config = tmp_path / f"{name}.yml"
    config.write_text(f"type: FILESYSTEM\nconfig:\n  directory: {bucket}\n")
    return bucket, config


@pytest.fixture(scope="module")
def thanos() -> Path:
    require_installed("thanos", THANOS_BUILD.present(SETTINGS))
    return THANOS_BUILD.binary(SETTINGS)


def test_thanos_reports_the_pinned_version(thanos: Path) -> None:
    result = subprocess.run([thanos, "--version"], capture_output=True, text=True, timeout=30, check=True)
    assert f"thanos, version {THANOS_VERSION.removeprefix('v')} " in result.stdout + result.stderr


def test_thanos_lists_the_blocks_of_a_filesystem_bucket(thanos: Path, tmp_path: Path) -> None:
    bucket, config = filesystem_objstore(tmp_path, "bucket")
    blocks = sorted(new_ulid() for _ in range(2))
    for ulid in blocks:
        write_block_meta(bucket, ulid)
    result = subprocess.run(
        [thanos, "tools", "bucket", "ls", f"--objstore.config-file={config}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(line.strip() for line in result.stdout.splitlines() if line.strip()) == blocks


def test_thanos_store_starts_on_a_filesystem_bucket_and_reports_ready(thanos: Path, tmp_path: Path) -> None:
    _bucket, config = filesystem_objstore(tmp_path, "empty-bucket")
    http_port, grpc_port = free_port(), free_port()
    log = tmp_path / "store.log"
    store = start(
        [
            thanos,
            "store",
            f"--objstore.config-file={config}",
            f"--data-dir={tmp_path / 'store-data'}",
            f"--http-address=127.0.0.1:{http_port}",
            f"--grpc-address=127.0.0.1:{grpc_port}",
        ],
        log,
    )
    url = f"http://127.0.0.1:{http_port}"
    try:

        def ready() -> bool:
            alive_or_fail(store, log, "thanos store")
            try:
                return httpx.get(url + "/-/ready", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, timeout=60, what="thanos store to be ready")
        metrics = httpx.get(url + "/metrics", timeout=5).text
        assert f'version="{THANOS_VERSION.removeprefix("v")}"' in next(
            line for line in metrics.splitlines() if line.startswith("thanos_build_info{")
        )
    finally:
        stop(store)


# -- Kafka -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KafkaBroker:
    address: str
    log: Path


@pytest.fixture(scope="module")
def kafka_broker() -> Iterator[KafkaBroker]:
    """A single-node KRaft Kafka from the installed jars, in a temporary folder."""
    require_installed("kafka", kafka_present(SETTINGS))
    workdir = Path(tempfile.mkdtemp(prefix="fleetsight-kafka-"))
    broker_port, controller_port = free_port(), free_port()
    properties = workdir / "server.properties"
    properties.write_text(
        kafka_server_properties(
            node_id=1, broker_port=broker_port, controller_port=controller_port, log_dir=workdir / "data"
        )
    )
    log = workdir / "kafka.log"
    cluster_id = subprocess.run(
        kafka_java_command(SETTINGS, "kafka.tools.StorageTool", "random-uuid", heap="128m"),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()[-1]
    subprocess.run(
        kafka_java_command(
            SETTINGS,
            "kafka.tools.StorageTool",
            "format",
            "-t",
            cluster_id,
            "-c",
            str(properties),
            heap="128m",
        ),
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        timeout=120,
        check=True,
    )
    assert (workdir / "data" / "meta.properties").is_file(), "StorageTool format wrote no meta.properties"
    broker = start(kafka_java_command(SETTINGS, "kafka.Kafka", str(properties)), log, cwd=workdir)
    address = f"127.0.0.1:{broker_port}"
    try:
        admin = AdminClient({"bootstrap.servers": address})

        def answers() -> bool:
            alive_or_fail(broker, log, "kafka")
            try:
                return len(admin.list_topics(timeout=2).brokers) == 1
            except Exception:  # the client raises KafkaException until the broker answers
                return False

        wait_until(answers, timeout=90, what="Kafka to answer a metadata request")
        yield KafkaBroker(address, log)
    finally:
        stop(broker)
        shutil.rmtree(workdir, ignore_errors=True)


def test_kafka_logs_through_log4j_and_runs_the_pinned_version(kafka_broker: KafkaBroker) -> None:
    # With the wrong slf4j binding Kafka starts but logs nothing: the log is the proof of the binding.
    log = kafka_broker.log.read_text(errors="replace")
    assert f"Kafka version: {KAFKA_VERSION}" in log
    assert "level=INFO logger=kafka.server.KafkaRaftServer" in log


def test_kafka_delivers_a_produced_message_to_a_consumer(kafka_broker: KafkaBroker) -> None:
    topic = f"smoke-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_broker.address})
    for future in admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)]).values():
        future.result(timeout=30)

    delivered: list[str] = []
    producer = Producer({"bootstrap.servers": kafka_broker.address, "acks": "all"})
    payload = b"node-0007 NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus."
    producer.produce(
        topic,
        key=b"node-0007",
        value=payload,
        on_delivery=lambda err, msg: delivered.append("ok" if err is None else str(err)),
    )
    assert producer.flush(30) == 0, "message still queued after 30 s"
    assert delivered == ["ok"]

    consumer = Consumer(
        {
            "bootstrap.servers": kafka_broker.address,
            "group.id": f"smoke-{topic}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    try:

        def next_message() -> tuple[bytes, bytes] | None:
            message = consumer.poll(1.0)
            if message is None or (message.error() and message.error().code() == KafkaError._PARTITION_EOF):
                return None
            assert message.error() is None, message.error()
            return message.key(), message.value()

        assert wait_until(next_message, timeout=60, interval=0, what="the message to be consumed") == (
            b"node-0007",
            payload,
        )
    finally:
        consumer.close()


# -- OpenSearch ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def opensearch_client() -> Iterator[tuple[OpenSearch, int]]:
    """One OpenSearch node from the installed distribution, as the unprivileged user when we are root,
    in a temporary folder; yields a client and the server's pid."""
    require_installed("opensearch", opensearch_present(SETTINGS))
    # Not pytest's tmp_path: its parents are private to root, and the server runs as someone else.
    instance = Path(tempfile.mkdtemp(prefix="fleetsight-opensearch-"))
    instance.chmod(0o755)
    http_port, transport_port = free_port(), free_port()
    env = prepare_opensearch_instance(SETTINGS, instance, http_port=http_port, transport_port=transport_port)
    log = instance / "console.log"
    server = start(opensearch_command(SETTINGS), log, env=env, cwd=instance)
    client = OpenSearch(hosts=[{"host": "127.0.0.1", "port": http_port}], timeout=10)
    try:

        def answers() -> bool:
            alive_or_fail(server, log, "opensearch")
            try:
                return client.ping()
            except Exception:  # connection refused until the node is up
                return False

        wait_until(answers, timeout=120, interval=0.5, what="OpenSearch to answer GET /")
        yield client, server.pid
    finally:
        stop(server)
        shutil.rmtree(instance, ignore_errors=True)


def test_opensearch_answers_with_the_pinned_version(opensearch_client: tuple[OpenSearch, int]) -> None:
    client, _ = opensearch_client
    info = client.info()
    assert info["version"]["number"] == OPENSEARCH_VERSION
    assert info["version"]["distribution"] == "opensearch"


def process_uid(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("Uid:")).split()[1])


def size_in_bytes(size: str) -> int:
    """A JVM size as in -Xmx ("512m", "1g")."""
    return int(size[:-1]) << {"m": 20, "g": 30}[size[-1]]


def test_opensearch_runs_unprivileged_with_the_small_heap(opensearch_client: tuple[OpenSearch, int]) -> None:
    client, launcher_pid = opensearch_client
    node = next(iter(client.nodes.info(metric="process,jvm")["nodes"].values()))
    java_pid = node["process"]["id"]
    assert java_pid in child_pids(launcher_pid), "the server answering is not the process we started"
    run_as = opensearch_run_as()
    assert process_uid(java_pid) == (pwd.getpwnam(run_as).pw_uid if run_as else os.getuid())
    assert node["jvm"]["mem"]["heap_init_in_bytes"] == size_in_bytes(OPENSEARCH_HEAP[0])
    assert node["jvm"]["mem"]["heap_max_in_bytes"] == size_in_bytes(OPENSEARCH_HEAP[1])


def test_opensearch_has_grok_and_simulates_an_ingest_pipeline(
    opensearch_client: tuple[OpenSearch, int],
) -> None:
    client, _ = opensearch_client
    nodes = client.nodes.info(metric="plugins")["nodes"].values()
    assert "ingest-common" in {module["name"] for node in nodes for module in node["modules"]}
    pipeline = {
        "description": "NVRM Xid lines from the kernel log",
        "processors": [
            {
                "grok": {
                    "field": "message",
                    "patterns": [
                        r"%{HOSTNAME:node} NVRM: Xid \(PCI:%{DATA:pci_bdf}\): %{NUMBER:xid:int}, "
                        r"%{GREEDYDATA:detail}"
                    ],
                }
            }
        ],
    }
    line = "gpu-node-0042 NVRM: Xid (PCI:0000:b3:00): 48, pid=20417, name=python, Ch 00000010, DBE"
    result = client.ingest.simulate(body={"pipeline": pipeline, "docs": [{"_source": {"message": line}}]})
    source = result["docs"][0]["doc"]["_source"]
    assert source["node"] == "gpu-node-0042"
    assert source["pci_bdf"] == "0000:b3:00"
    assert source["xid"] == 48
    assert source["detail"].startswith("pid=20417")

    unmatched = client.ingest.simulate(
        body={"pipeline": pipeline, "docs": [{"_source": {"message": "hello"}}]}
    )
    assert "error" in unmatched["docs"][0], "grok must reject a line that does not match"
