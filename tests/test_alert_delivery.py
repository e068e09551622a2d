"""Alertmanager routes an alert to the Slack stand-in with the production routing file."""

from __future__ import annotations

import datetime as dt
import json

import httpx
import pytest

from support import StackEnv, wait_until

pytestmark = pytest.mark.stack


def test_a_critical_alert_reaches_slack(stack_env: StackEnv) -> None:
    stack_env.cli("up", "alertmanager")
    now = dt.datetime.now(dt.UTC)
    alert = {
        "labels": {
            "alertname": "GpuFallenOffTheBus",
            "severity": "critical",
            "node": "n0042",
            "cluster": "test",
        },
        "annotations": {"summary": "GPU 3 fell off the bus (Xid 79)", "runbook_url": "docs/runbooks/xid.md"},
        "startsAt": now.isoformat(),
    }
    response = httpx.post(stack_env.url("alertmanager", "/api/v2/alerts"), json=[alert])
    assert response.status_code == 200

    record = stack_env.run_dir / "data" / "slack-sink" / "messages.jsonl"
    wait_until(lambda: record.exists() and record.read_text().strip(), timeout=60, what="a Slack message")
    message = json.loads(record.read_text().splitlines()[0])["payload"]
    assert message["channel"] == "#fleetsight-critical"
    attachment = message["attachments"][0]
    assert "GpuFallenOffTheBus" in attachment["title"]
    assert "n0042" in attachment["text"] and "Xid 79" in attachment["text"]
