"""A stand-in for Slack's incoming-webhook endpoint, for the local stack and the tests.

Slack cannot be reached from here, so Alertmanager's ``slack_configs`` post to this server instead.
It answers as Slack does (``200 ok``; ``400 invalid_payload`` for a body that is not a JSON message)
and appends every message to a JSON-lines file (``{"received_at", "path", "payload"}`` per line), so
that a test or an operator can see exactly what would have reached the channel.

Routes (FastAPI): ``POST /<any webhook path>`` (Slack's are ``/services/T.../B.../...``), ``GET /``
(how many messages arrived: readiness and a quick look), ``GET /messages`` (the recorded lines).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from fleetsight.webconfig import run_server


class SlackAttachment(BaseModel):
    """The parts of a Slack attachment that Alertmanager fills; anything else is kept as sent."""

    model_config = ConfigDict(extra="allow")
    title: str | None = None
    text: str | None = None
    color: str | None = None
    fallback: str | None = None


class SlackMessage(BaseModel):
    """An incoming-webhook message: Slack needs text or attachments (or blocks)."""

    model_config = ConfigDict(extra="allow")
    channel: str | None = None
    username: str | None = None
    text: str | None = None
    attachments: list[SlackAttachment] = []
    blocks: list[dict[str, Any]] | None = None

    def has_content(self) -> bool:
        return bool(self.text or self.attachments or self.blocks)


class MessageCount(BaseModel):
    messages: int


class Recorder:
    """Appends messages to the record file; one writer at a time, each line whole."""

    def __init__(self, record_file: Path) -> None:
        self.record_file = record_file
        self.lock = threading.Lock()
        record_file.parent.mkdir(parents=True, exist_ok=True)

    def append(self, path: str, payload: dict[str, Any]) -> None:
        line = json.dumps({"received_at": time.time(), "path": path, "payload": payload}) + "\n"
        # One unbuffered write: a buffered text file writes a line longer than its buffer in parts.
        with self.lock, self.record_file.open("ab", buffering=0) as out:
            out.write(line.encode())

    def lines(self) -> list[dict[str, Any]]:
        return read_records(self.record_file)


def read_records(record_file: Path) -> list[dict[str, Any]]:
    """Every whole line of a record file. A reader that catches the writer mid-line leaves that
    unfinished last line for its next read instead of failing on it."""
    if not record_file.exists():
        return []
    text = record_file.read_text()
    whole = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in whole.splitlines() if line.strip()]


def make_app(record_file: Path) -> FastAPI:
    recorder = Recorder(record_file)
    app = FastAPI(title="FleetSight Slack stand-in", docs_url=None, redoc_url=None)

    @app.get("/")
    def count() -> MessageCount:
        return MessageCount(messages=len(recorder.lines()))

    @app.get("/messages")
    def messages() -> list[dict[str, Any]]:
        return recorder.lines()

    @app.post("/{webhook_path:path}", response_class=PlainTextResponse)
    async def webhook(webhook_path: str, request: Request) -> PlainTextResponse:
        # Parsed by hand, not as a typed body parameter: Slack answers a bad body with
        # `400 invalid_payload`, where FastAPI would answer 422.
        try:
            payload = json.loads(await request.body())
            message = SlackMessage.model_validate(payload)
        except (json.JSONDecodeError, UnicodeDecodeError, ValidationError):
            return PlainTextResponse("invalid_payload", status_code=400)
        if not message.has_content():
            return PlainTextResponse("no_text", status_code=400)
        recorder.append("/" + webhook_path, payload)
        return PlainTextResponse("ok")

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Record Slack webhook posts to a JSON-lines file.")
    parser.add_argument("--listen", default="127.0.0.1:19095", help="host:port to listen on")
    parser.add_argument("--record", type=Path, required=True, help="JSON-lines file to append messages to")
    args = parser.parse_args(argv)
    host, port = args.listen.rsplit(":", 1)
    print(f"event=listening address={args.listen} record={args.record}", flush=True)
    run_server(make_app(args.record), host, int(port))


if __name__ == "__main__":
    main()
