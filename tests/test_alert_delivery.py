"""The Alertmanager pair delivers an alert to the Slack stand-in once, with the production routing file,
although (as from the two Prometheus replicas) both Alertmanagers receive it."""

from __future__ import annotations

import datetime as dt
import json
import time

import httpx
import pytest

from alerting.slack_sink import read_records
from support import StackEnv, wait_until

pytestmark = pytest.mark.stack

# Alertmanager's peer timeout is 15 s: the second of the pair waits that long for the first one's
# notification to reach it by gossip before it would notify itself. Watch a little longer than that.
DUPLICATE_WINDOW_S = 25


def cluster_size(url: str) -> int:
    try:
        return len(httpx.get(f"{url}/api/v2/status", timeout=5).json()["cluster"].get("peers") or [])
    except (httpx.HTTPError, json.JSONDecodeError):
        return 0


def test_an_alert_sent_to_both_alertmanagers_reaches_slack_once(stack_env: StackEnv) -> None:
    stack_env.cli("up", "alertmanager", "alertmanager-b")
    pair = [stack_env.url("alertmanager"), stack_env.url("alertmanager_b")]
    for url in pair:
        wait_until(lambda u=url: cluster_size(u) == 2, timeout=60, what=f"{url} to see both peers")

    alert = {
        "labels": {
            "alertname": "GPUFellOffBus",
            "severity": "critical",
            "team": "sre",
            "node": "n0042",
            "gpu": "3",
            "cluster": "test",
        },
        "annotations": {
            "summary": "GPU 3 on n0042 fell off the bus (Xid 79)",
            "description": "GPU 3 of node n0042 is no longer reachable on PCIe (Xid 79).",
            "runbook_url": "docs/runbooks/GPUFellOffBus.md",
        },
        "startsAt": dt.datetime.now(dt.UTC).isoformat(),
    }
    for url in pair:
        assert httpx.post(f"{url}/api/v2/alerts", json=[alert], timeout=10).status_code == 200

    record = stack_env.run_dir / "data" / "slack-sink" / "messages.jsonl"
    wait_until(lambda: record.exists() and record.read_text().strip(), timeout=60, what="a Slack message")
    time.sleep(DUPLICATE_WINDOW_S)  # the window in which the second Alertmanager would post a duplicate
    messages = [entry["payload"] for entry in read_records(record)]
    per_channel: dict[str, int] = {}
    for message in messages:
        per_channel[message["channel"]] = per_channel.get(message["channel"], 0) + 1
    print(f"messages per channel: {per_channel}")
    assert per_channel and all(count == 1 for count in per_channel.values()), per_channel
    for message in messages:
        attachment = message["attachments"][0]
        assert "GPUFellOffBus" in attachment["title"]
        assert "n0042" in attachment["text"] and "docs/runbooks/GPUFellOffBus.md" in json.dumps(message)
