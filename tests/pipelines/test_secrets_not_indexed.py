"""Secrets never reach the indexed logs: in the session's log stack (Kafka, OpenSearch, the rsyslog node
side and shipper, the twin, Alertmanager with the Slack stand-in, ElastAlert2), once an alert has gone
out through the webhook, no document of any OpenSearch index (the log indices, ElastAlert's writeback
indices) and no log file under the stack's run folder holds a secret value the stack is configured with.

The secret values are read where the stack's components get them, so that a credential added to the
log path later is searched for without editing this test: every file of Alertmanager's secrets folder
(the Slack webhook URL), and every environment variable a component of the stack is given whose name
says it is a secret (``..._PASSWORD``, ``..._SECRET``, ``..._TOKEN(S)``, ``..._KEY``; the Kafka and
Elasticsearch passwords when that transport has credentials)."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import httpx
from logs_helpers import LOG_STACK, LogStack

from alerting.component import secrets_dir
from pipelines.component import kafka_secrets
from pipelines.kafka_security import USERS
from support import wait_until

SECRET_NAME = re.compile(r"(PASSWORD|PASSWD|SECRET|TOKENS?|_KEY)$")
PAGE = 1000


def configured_secrets(stack: LogStack) -> dict[str, str]:
    """What the stack's components hold as secrets: name -> value."""
    found: dict[str, str] = {}
    folder = secrets_dir(stack.settings)
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if path.is_file() and not path.name.endswith((".yml", ".yaml", ".tmpl")):
            value = path.read_text().strip()
            if value:
                found[f"alertmanager secret {path.name}"] = value
    kafka = kafka_secrets(stack.settings)  # the SCRAM passwords the nodes, shippers and admin log in with
    for user in USERS:
        if kafka.password_file(user).is_file():
            found[f"kafka password of {user}"] = kafka.password(user)
    for name in LOG_STACK:
        for key, value in stack.components[name].env(stack.settings).items():
            if SECRET_NAME.search(key) and len(value) >= 6:
                found[f"{name} ${key}"] = value
    return found


def every_document(search_url: str) -> list[dict[str, Any]]:
    """Every document of every index (hidden ones too), paged with the scroll API."""
    client = httpx.Client(base_url=search_url, timeout=30)
    response = client.post(
        "/*,.*/_search", params={"scroll": "1m", "expand_wildcards": "all"}, json={"size": PAGE}
    )
    response.raise_for_status()
    body = response.json()
    documents: list[dict[str, Any]] = []
    while body["hits"]["hits"]:
        documents.extend(body["hits"]["hits"])
        body = client.post("/_search/scroll", json={"scroll": "1m", "scroll_id": body["_scroll_id"]}).json()
    client.delete("/_search/scroll", params={"scroll_id": body.get("_scroll_id", "")})
    return documents


def fire_alert(stack: LogStack) -> None:
    """The webhook in use: an alert through the stack's Alertmanager to the Slack stand-in."""
    marker = f"secrets-index-check-{dt.datetime.now(dt.UTC):%H%M%S%f}"
    alert = {
        "labels": {"alertname": "PSUFailed", "cluster": "test", "severity": "critical", "team": "facilities",
                   "node": "n0002", "psu": "PSU1"},
        "annotations": {"summary": marker, "runbook_url": "docs/runbooks/PSUFailed.md"},
        "startsAt": (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)).isoformat(),
    }  # fmt: skip
    response = httpx.post(stack.settings.url("alertmanager", "/api/v2/alerts"), json=[alert], timeout=10)
    assert response.status_code == 200, response.text
    record: Path = stack.settings.data_dir("slack-sink") / "messages.jsonl"
    wait_until(lambda: record.exists() and marker in record.read_text(), timeout=90, what="the Slack alert")


def test_no_secret_value_is_in_any_indexed_document_or_log_file(log_stack: LogStack) -> None:
    fire_alert(log_stack)
    secret_values = configured_secrets(log_stack)
    assert any(name.startswith("alertmanager secret slack_webhook_url") for name in secret_values)
    assert all(f"kafka password of {user}" in secret_values for user in USERS), sorted(secret_values)
    wait_until(
        lambda: httpx.get(f"{log_stack.search_url}/_cat/count", timeout=10).text.split()[-1] != "0",
        timeout=120,
        what="documents indexed by the log path",
    )
    # the scan itself finds a value in a document (a canary in an index of its own, removed after)
    canary_index = "secrets-scan-canary"
    canary = f"canary-{dt.datetime.now(dt.UTC):%H%M%S%f}"
    put = httpx.put(
        f"{log_stack.search_url}/{canary_index}/_doc/1",
        params={"refresh": "true"},
        json={"message": canary},
        timeout=10,
    )
    assert put.status_code in (200, 201), put.text
    try:
        documents = every_document(log_stack.search_url)
    finally:
        httpx.delete(f"{log_stack.search_url}/{canary_index}", timeout=10)
    assert any(canary in json.dumps(doc.get("_source", {})) for doc in documents)
    assert len(documents) > 1, "no document indexed by the log path: nothing was searched"
    leaks = [
        f"{doc['_index']}/{doc['_id']}: {what}"
        for doc in documents
        for what, value in secret_values.items()
        if value in json.dumps(doc.get("_source", {}))
    ]
    logs = [path for path in log_stack.settings.run_dir.rglob("*.log") if path.is_file()]
    assert logs, "no log file under the stack's run folder"
    leaks += [
        f"{path.relative_to(log_stack.settings.run_dir)}: {what}"
        for path in logs
        for what, value in secret_values.items()
        if value in path.read_text(errors="replace")
    ]
    print(f"searched {len(documents)} documents and {len(logs)} log files for {sorted(secret_values)}")
    assert not leaks, f"secrets indexed or logged: {leaks[:20]}"
