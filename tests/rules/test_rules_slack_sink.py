"""The Slack stand-in (alerting/slack_sink.py) as a process: Slack's answers, the recording format."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from support import free_port, wait_until


@pytest.fixture(scope="module")
def sink(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    record = tmp_path_factory.mktemp("sink") / "slack-sink" / "messages.jsonl"
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "alerting.slack_sink", f"--listen=127.0.0.1:{port}", f"--record={record}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(url + "/", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, timeout=30, what="the Slack stand-in")
        yield url, record
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_a_message_is_answered_ok_and_recorded(sink: tuple[str, Path]) -> None:
    url, record = sink
    before = httpx.get(url + "/").json()["messages"]
    message = {
        "channel": "#fleetsight-critical",
        "attachments": [{"title": "[FIRING:1] NodeDown", "text": "n0001"}],
    }
    response = httpx.post(url + "/services/local/webhook", json=message)
    assert (response.status_code, response.text) == (200, "ok")
    assert httpx.get(url + "/").json()["messages"] == before + 1
    last = json.loads(record.read_text().splitlines()[-1])
    assert last["path"] == "/services/local/webhook" and last["payload"] == message
    assert isinstance(last["received_at"], float)
    assert httpx.get(url + "/messages").json()[-1]["payload"] == message


@pytest.mark.parametrize(
    ("body", "answer"),
    [
        (b"{not json", "invalid_payload"),
        (b'{"attachments": "x"}', "invalid_payload"),
        (b'{"channel": "#a"}', "no_text"),
    ],
)
def test_bad_bodies_get_slacks_400_and_are_not_recorded(
    sink: tuple[str, Path], body: bytes, answer: str
) -> None:
    url, _ = sink
    before = httpx.get(url + "/").json()["messages"]
    response = httpx.post(url + "/services/x", content=body, headers={"Content-Type": "application/json"})
    assert (response.status_code, response.text) == (400, answer)
    assert httpx.get(url + "/").json()["messages"] == before
