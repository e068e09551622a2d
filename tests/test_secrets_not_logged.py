"""Secrets never reach a log: the stack runs with known secret values (the health and anomaly API tokens,
the Slack webhook URL), they are used (a drain with the token, calls with a wrong one, an alert
delivered to Slack), and every log file of the run is searched for them.

The log path's own secrets (Kafka and Elasticsearch passwords) and indexed log documents join this test
when that transport has credentials (docs/security.md, "Not yet")."""

from __future__ import annotations

import datetime as dt
import secrets
from pathlib import Path

import httpx

from support import StackEnv, wait_until

HEALTH_TOKEN = f"leakcheck-health-{secrets.token_hex(8)}"
ANOMALY_TOKEN = f"leakcheck-anomaly-{secrets.token_hex(8)}"
SLACK_PATH = f"/services/T0LEAK/B0LEAK/leakcheck{secrets.token_hex(8)}"


def test_no_secret_value_appears_in_any_log(stack_env: StackEnv, tmp_path: Path) -> None:
    secrets_dir = tmp_path / "alertmanager-secrets"
    secrets_dir.mkdir()
    slack_url = stack_env.url("slack_sink", SLACK_PATH)
    (secrets_dir / "slack_webhook_url").write_text(slack_url)
    stack_env.env.update(
        FLEETSIGHT_HEALTH_TOKENS=f"{HEALTH_TOKEN}=read,drain",
        FLEETSIGHT_ANOMALY_TOKENS=f"{ANOMALY_TOKEN}=read",
        FLEETSIGHT_ALERTMANAGER_SECRETS_DIR=str(secrets_dir),
    )
    stack_env.cli("up", "slack-sink", "alertmanager", "health")

    # the tokens in use: a drain with the right one, reads and writes with wrong ones
    health = stack_env.url("health")
    wait_until(lambda: httpx.get(f"{health}/-/ready").status_code == 200, timeout=60, what="health")
    drain = f"{health}/v1/nodes/n0001/drain"
    used = httpx.post(
        drain, json={"reason": "leak check"}, headers={"Authorization": f"Bearer {HEALTH_TOKEN}"}
    )
    assert used.status_code in (200, 404), (
        used.text
    )  # authorised (no scheduler here: the node may be unknown)
    for header in (f"Bearer {HEALTH_TOKEN[:-1]}", f"Bearer {ANOMALY_TOKEN}", HEALTH_TOKEN):
        wrong = httpx.post(drain, json={"reason": "x"}, headers={"Authorization": header})
        assert wrong.status_code == 401 and HEALTH_TOKEN[:-1] not in wrong.text

    # the webhook in use: an alert delivered to the Slack stand-in
    now = dt.datetime.now(dt.UTC)
    alert = {
        "labels": {"alertname": "PSUFailed", "cluster": "test", "severity": "critical", "team": "facilities",
                   "node": "n0001", "psu": "PSU1"},
        "annotations": {"summary": "leak check", "runbook_url": "docs/runbooks/PSUFailed.md"},
        "startsAt": (now - dt.timedelta(minutes=1)).isoformat(),
    }  # fmt: skip
    assert httpx.post(stack_env.url("alertmanager", "/api/v2/alerts"), json=[alert]).status_code == 200
    record = stack_env.run_dir / "data" / "slack-sink" / "messages.jsonl"
    wait_until(lambda: record.exists() and "leak check" in record.read_text(), timeout=90, what="Slack")

    logs = sorted((stack_env.run_dir / "logs").glob("*.log"))
    assert len(logs) >= 3, logs
    secret_values = {"health token": HEALTH_TOKEN, "anomaly token": ANOMALY_TOKEN, "Slack URL": SLACK_PATH}
    leaks = [
        f"{path.name}: {what}"
        for path in logs
        for what, value in secret_values.items()
        if value in path.read_text(errors="replace")
    ]
    assert not leaks, f"secrets in logs: {leaks}"
