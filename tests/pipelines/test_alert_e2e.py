"""An injected CUDA error in one rank's log reaches the Slack stand-in through rsyslog, Kafka, the ingest
pipeline, OpenSearch, ElastAlert2 and Alertmanager, naming node and rank; the delay is printed."""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid

from logs_helpers import LogStack

from alerting.slack_sink import read_records
from support import wait_until


def slack_messages(stack: LogStack) -> list[dict]:
    return read_records(stack.settings.data_dir("slack-sink") / "messages.jsonl")


def test_a_cuda_error_reaches_slack_within_two_minutes(log_stack: LogStack) -> None:
    job = f"e2e{uuid.uuid4().hex[:6]}"
    rank_log = (
        log_stack.settings.data_dir("twin") / "nodes" / "n0003" / "var" / "log" / "jobs" / job / "rank-5.log"
    )
    rank_log.parent.mkdir(parents=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    written = time.time()
    with rank_log.open("a") as handle:
        handle.write(f"[{stamp}] RuntimeError: CUDA error: an illegal memory access was encountered\n")

    def delivered() -> dict | None:
        for message in slack_messages(log_stack):
            if job in json.dumps(message["payload"]):
                return message
        return None

    message = wait_until(delivered, timeout=150, interval=0.5, what=f"a Slack message about job {job}")
    delay = message["received_at"] - written
    print(f"\nlog alert delay (line written -> Slack): {delay:.1f} s")
    text = json.dumps(message["payload"])
    assert "CUDAErrorInJob" in text
    assert "n0003" in text and "rank 5" in text, text
    assert "docs/runbooks/CUDAErrorInJob.md" in text
    assert delay < 120, f"{delay:.0f} s from the log line to Slack"
