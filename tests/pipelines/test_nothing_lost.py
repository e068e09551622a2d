"""Nothing lost, nothing doubled: while the twin writes, OpenSearch goes away and comes back, Kafka goes
away and comes back, and the node-side rsyslog restarts during one of the outages. Afterwards every line
the twin wrote is in the index exactly once. CI uses outages of 10 s; bench/logs_outages.py runs the
long ones (OpenSearch 5 min, Kafka 1 min).

The node rsyslog restarts during the Kafka outage, when librdkafka holds records it cannot deliver: omkafka
keeps them in its failed-message file and sends them after the restart (test_failed_messages.py shows that
file's format; lines were lost here before the node's records ended in a newline).
FLEETSIGHT_LOSS_RESTART_DURING=opensearch restarts it during the OpenSearch outage instead."""

from __future__ import annotations

import fnmatch
import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable

from confluent_kafka import Consumer, TopicPartition
from logs_helpers import LOSS_SCENARIO, LogStack

from evaluation.log_ledger import indexed_origins, written_origins
from pipelines.catalogue import CATALOGUES
from pipelines.component import LOCAL_RAW_CLASSES, NODE_RSYSLOG_STOP_TIMEOUT_S
from pipelines.logclasses import BY_NAME, LOG_CLASSES
from support import FLEETSIGHT, REPO_ROOT, wait_until

# bench/logs_outages.py sets these to the long outages (OpenSearch 5 min, Kafka 1 min).
OPENSEARCH_OUTAGE_S = float(os.environ.get("FLEETSIGHT_LOSS_OPENSEARCH_OUTAGE_S", "10"))
KAFKA_OUTAGE_S = float(os.environ.get("FLEETSIGHT_LOSS_KAFKA_OUTAGE_S", "10"))
TWIN_DURATION = os.environ.get("FLEETSIGHT_LOSS_TWIN_DURATION", "40m")  # simulated, at 8x real time
RESTART_DURING = os.environ.get("FLEETSIGHT_LOSS_RESTART_DURING", "kafka")  # or "opensearch" (see above)
assert RESTART_DURING in ("opensearch", "kafka"), RESTART_DURING


def kafka_records(stack: LogStack, topics: list[str]) -> int:
    """Records in these topics: lines delivered to Kafka, repeats included."""
    consumer = Consumer({**stack.kafka(), "group.id": "loss-test-count", "log_level": 0})
    try:
        total = 0
        for name in topics:
            topic = consumer.list_topics(name, timeout=30).topics[name]
            for partition in topic.partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(name, partition), timeout=30)
                total += high - low
        return total
    finally:
        consumer.close()


# The catalogued classes are parsed on the node and indexed with no pipeline (the edge path); the local
# stack ships the jobs' logs raw, through their ingest pipeline. Each path's counts are reported apart.
EDGE_CLASSES = [name for name in CATALOGUES if name not in LOCAL_RAW_CLASSES]
EDGE_TOPICS = [BY_NAME[name].edge_topic for name in EDGE_CLASSES]
EDGE_PATH = f"edge ({', '.join(EDGE_CLASSES)}: parsed on the node, no pipeline)"
PIPELINE_TOPICS = [c.topic for c in LOG_CLASSES]
PIPELINE_PATH = f"pipeline ({', '.join(LOCAL_RAW_CLASSES)}: raw, through the ingest pipelines)"
EDGE_FILES = ["*/" + path for name in EDGE_CLASSES for path in BY_NAME[name].twin_files]


def is_edge(origin: tuple[str, int]) -> bool:
    return any(fnmatch.fnmatch(origin[0], pattern) for pattern in EDGE_FILES)


def path_counts(
    written: set[tuple[str, int]], documents: list[tuple[str, int]], edge: bool
) -> dict[str, int]:
    mine = {o for o in written if is_edge(o) == edge}
    counts = Counter(o for o in documents if is_edge(o) == edge)
    return {
        "written": len(mine),
        "indexed": len(counts),
        "missing": len(mine - set(counts)),
        "duplicated": sum(n - 1 for n in counts.values()),
    }


def _during(restart: dict[str, Callable[[], None]], server: str) -> dict[str, Callable[[], None]]:
    return {"during": restart[server]} if server in restart else {}


def outage(
    stack: LogStack,
    name: str,
    seconds: float,
    lines: Callable[[], int],
    during: Callable[[], None] = lambda: None,
) -> str:
    """Stop a server for `seconds` while the twin keeps writing, then start it again."""
    before = lines()
    began = time.monotonic()
    stop_s = stack.stop(name)
    during()
    # The outage's length is the experiment, not a synchronisation: poll the clock.
    wait_until(lambda: time.monotonic() - began >= seconds, timeout=seconds + 60, what=f"{name}'s outage")
    stack.start(name)
    down = time.monotonic() - began
    return f"{name} down {down:.0f} s (stopped in {stop_s:.1f} s), {lines() - before} lines written meanwhile"


def test_outages_lose_nothing_and_double_nothing(log_stack: LogStack) -> None:
    settings = log_stack.settings
    nodes_root = settings.data_dir("twin") / "nodes"
    log_stack.stop("twin")  # the session's twin: its files stay, and count too
    twin_log = settings.log_file("twin-loss")
    with twin_log.open("ab") as out:
        twin = subprocess.Popen(
            [*FLEETSIGHT, "twin", "run", "--scenario", str(LOSS_SCENARIO),
             "--out", str(settings.data_dir("twin")), "--speed", "8", "--duration", TWIN_DURATION],
            env=log_stack.env(), cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    events = []
    try:
        lines = lambda: len(written_origins(nodes_root))  # noqa: E731
        wait_until(lambda: lines() > 500, timeout=120, what="the twin to write its first job logs")

        def restart_node_rsyslog() -> None:
            # A stopping rsyslogd waits up to omkafka's closeTimeout per action for librdkafka, then
            # purges what is left into its failed-message file; a kill only after that (the supervisor's
            # deadline), since a kill can lose what imfile already marked as read.
            stopped_in = log_stack.stop("logs-node", deadline_s=NODE_RSYSLOG_STOP_TIMEOUT_S)
            log_stack.start("logs-node")
            events.append(
                f"node rsyslog restarted during the {RESTART_DURING} outage (stopped in {stopped_in:.1f} s)"
            )

        restart = {RESTART_DURING: restart_node_rsyslog}
        events.append(
            outage(log_stack, "opensearch", OPENSEARCH_OUTAGE_S, lines, **_during(restart, "opensearch"))
        )
        events.append(outage(log_stack, "kafka", KAFKA_OUTAGE_S, lines, **_during(restart, "kafka")))
        after = lines()
        wait_until(lambda: lines() > after + 100, timeout=120, what="the twin to write on after the outages")
        assert twin.poll() is None, "the twin stopped early: " + twin_log.read_text()[-2000:]
    finally:
        # Its last line may be half written: only complete lines count (imfile sends nothing else).
        twin.terminate()
        twin.wait(timeout=30)

    written = written_origins(nodes_root)
    began = time.monotonic()

    def converged() -> bool:
        return set(indexed_origins(log_stack.search_url, nodes_root)) >= written

    try:
        wait_until(converged, timeout=300, interval=3, what="every written line to be indexed")
    finally:
        documents = indexed_origins(log_stack.search_url, nodes_root)
        counts = Counter(documents)
        missing = written - set(counts)
        duplicated = sum(n - 1 for n in counts.values())
        unexpected = set(counts) - written
        delivered = kafka_records(log_stack, EDGE_TOPICS + PIPELINE_TOPICS)
        edge_delivered = kafka_records(log_stack, EDGE_TOPICS)
        per_path = {
            EDGE_PATH: path_counts(written, documents, True),
            PIPELINE_PATH: path_counts(written, documents, False),
        }
        rejected = settings.data_dir("rsyslog-shipper") / "rejected.jsonl"
        if rejected.exists():
            print(f"shipper error file: {rejected.read_text()[-3000:]}")
        node_log = settings.log_file("logs-node")
        if node_log.exists():
            # omkafka warns "may indicate data loss" at every close; only a non-empty outqueue loses.
            # "Failed to send remaining N messages" is what librdkafka still held when its close timed
            # out: keepFailedMessages saves those to its failed-message file for the restart.
            warnings = [
                line
                for line in node_log.read_text(errors="replace").splitlines()
                if ("data loss" in line and "outqueue: 0 " not in line) or "Failed to send remaining" in line
            ]
            print("node rsyslog on losses: " + ("\n".join(warnings[-5:]) or "nothing"))
        print(
            "\n"
            + "\n".join(events)
            + f"\ncaught up {time.monotonic() - began:.0f} s after the twin stopped\n"
            f"lines written: {len(written)}  indexed: {len(counts)}  missing: {len(missing)}  "
            f"duplicated: {duplicated}  unexpected: {len(unexpected)}  "
            f"Kafka records: {delivered} ({delivered - len(written):+d} vs written: repeats absorbed by ids)"
            + (f"\nfirst missing (file, offset): {sorted(missing)[:5]}" if missing else "")
            + "".join(
                f"\n{path}: " + "  ".join(f"{key} {value}" for key, value in numbers.items())
                for path, numbers in per_path.items()
            )
            + f"\nedge topic records: {edge_delivered}"
        )
    assert not missing, sorted(missing)[:10]
    assert duplicated == 0
    assert not unexpected, sorted(unexpected)[:10]
    # The edge path was exercised: kernel lines were written and went through the edge topic.
    edge = per_path[EDGE_PATH]
    assert edge["written"] > 0 and edge_delivered >= edge["written"], (edge, edge_delivered)
    assert per_path[PIPELINE_PATH]["written"] > 0, "the ingest-pipeline path was not exercised"
