"""A node rsyslog stopped while Kafka cannot be reached keeps what librdkafka still held in omkafka's
failed-message file, one record per line, and sends every record after its restart, with no new line to
carry it (the nudge: pipelines/rsyslog_conf.NUDGE_INTERVAL_S).

This was #25's node-side loss: omkafka writes "topic<TAB>key<TAB>payload" to that file with no separator
of its own and reads it back line by line, so records without a trailing newline were glued into one
line and all but the first were lost (pipelines/rsyslog_conf.RECORD_END). Here the node's real
configuration points first at a loopback port that takes connections and never answers, then at the
session's Kafka; the shipper indexes what arrives, and every line must be in OpenSearch exactly once."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from logs_helpers import LogStack, impstats_reports

from pipelines.component import NODE_RSYSLOG_STOP_TIMEOUT_S, kafka_bootstrap, local_node_options, rsyslog_env
from pipelines.logclasses import BY_NAME
from pipelines.rsyslog_conf import node_config
from support import wait_until

KERNEL = BY_NAME["kernel"]
LINES = 30
NUDGE_INTERVAL_S = 5  # after the restart
QUIET = 3600  # no nudge before the stop: the kernel action's counter counts its lines only


@contextmanager
def silent_broker() -> Iterator[str]:
    """A loopback address that takes connections and never answers (a hung or cut-off Kafka): librdkafka
    accepts records at once and holds them, and no connection error suspends the action first."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen(64)
    try:
        yield f"127.0.0.1:{holder.getsockname()[1]}"
    finally:
        holder.close()


@dataclass
class NodeRun:
    process: subprocess.Popen
    stopped_in: float = 0.0  # seconds from SIGTERM to exit


@contextmanager
def node_rsyslog(
    stack: LogStack, work: Path, nodes_root: Path, broker: str, nudge_interval_s: int
) -> Iterator[NodeRun]:
    """The node's generated configuration, run in the foreground; stopped with SIGTERM as systemd does."""
    options = dataclasses.replace(
        local_node_options(stack.settings),
        brokers=[broker],
        work_dir=work,
        files_root=str(nodes_root),
        stats_file=work / "impstats.json",
        nudge_interval_s=nudge_interval_s,
    )
    config = work / "rsyslog.conf"
    config.write_text(node_config(options))
    pid_file = work / "rsyslogd.pid"
    pid_file.unlink(missing_ok=True)
    log = (work / "rsyslogd.out").open("ab")
    process = subprocess.Popen(
        ["rsyslogd", "-n", "-f", str(config), "-i", str(pid_file)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **rsyslog_env(stack.settings)},
    )
    try:
        wait_until(lambda: pid_file.exists() or process.poll() is not None, timeout=60, what="node rsyslogd")
        assert process.poll() is None, (work / "rsyslogd.out").read_text()
        run = NodeRun(process)
        yield run
    finally:
        if process.poll() is None:
            began = time.monotonic()
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=NODE_RSYSLOG_STOP_TIMEOUT_S + 30)
            run.stopped_in = time.monotonic() - began
        log.close()


def omkafka_counter(work: Path, counter: str) -> int:
    """The kernel class's omkafka counter in the last impstats report (0 before the first, every 10 s)."""
    reports = impstats_reports(work / "impstats.json", f"omkafka_{KERNEL.name}")
    return int(reports[-1].get(counter, 0)) if reports else 0


def indexed_ids(stack: LogStack, node: str) -> list[str]:
    httpx.post(f"{stack.search_url}/{KERNEL.index_pattern}/_refresh", timeout=60).raise_for_status()
    body = {"size": 1000, "_source": ["event.id"], "query": {"term": {"host.name": node}}}
    response = httpx.post(f"{stack.search_url}/{KERNEL.index_pattern}/_search", json=body, timeout=60)
    response.raise_for_status()
    return [hit["_source"]["event"]["id"] for hit in response.json()["hits"]["hits"]]


def test_records_failed_at_shutdown_are_kept_one_per_line_and_sent_after_the_restart(
    log_stack: LogStack, tmp_path: Path
) -> None:
    node = f"n{uuid.uuid4().hex[:8]}"
    nodes_root = tmp_path / "nodes"
    kern_log = nodes_root / node / "var/log/kern.log"
    kern_log.parent.mkdir(parents=True)
    work = tmp_path / "work"
    work.mkdir()
    lines = [f"kernel: failed-message test line {n} of {node}" for n in range(LINES)]

    with silent_broker() as silent, node_rsyslog(log_stack, work, nodes_root, silent, QUIET) as down:
        kern_log.write_text("".join(line + "\n" for line in lines))
        # The lines are inside librdkafka (impstats reports every 10 s): what it holds at the stop goes
        # to the failed-message file.
        wait_until(
            lambda: omkafka_counter(work, "submitted") >= LINES,
            timeout=90,
            interval=1,
            what="the kernel lines to reach librdkafka",
        )

    assert down.stopped_in < NODE_RSYSLOG_STOP_TIMEOUT_S, f"stop took {down.stopped_in:.1f} s with Kafka down"
    text = (work / f"kafka_{KERNEL.name}.failed").read_text()
    records = text.splitlines()
    kept = text.count(f"{KERNEL.edge_topic}\t")
    assert kept >= LINES, f"{kept} records in the failed-message file, {LINES} lines held: {records}"
    assert len(records) == kept, f"{kept} records on {len(records)} lines: glued together, all but one lost"
    for record in records:
        topic, key, payload = record.split("\t", 2)
        assert topic == KERNEL.edge_topic and key == "", record
        assert json.loads(payload)["host"]["name"] == node, record

    # No line comes after the restart: omkafka sends the records it took back from the file when the
    # nudge calls the idle action (rsyslog_conf.NUDGE_INTERVAL_S, short here).
    with node_rsyslog(log_stack, work, nodes_root, kafka_bootstrap(log_stack.settings), NUDGE_INTERVAL_S):

        def all_indexed() -> list[str]:
            ids = indexed_ids(log_stack, node)
            return ids if len(ids) >= LINES else []

        ids = wait_until(all_indexed, timeout=120, interval=2, what=f"{LINES} lines of {node} indexed")
    assert len(ids) == len(set(ids)) == LINES, sorted(ids)
    assert not (work / f"kafka_{KERNEL.name}.failed").exists(), "the failed records were not taken back"
