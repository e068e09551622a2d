"""Slack slash commands: request signature verification (v0) and the reply in Slack's message format.

Slack signs every request: ``X-Slack-Signature: v0=<hex HMAC-SHA256 of "v0:{timestamp}:{raw body}">``
with the app's signing secret, and ``X-Slack-Request-Timestamp``. A request older than 5 minutes is
refused (replay protection), as Slack's documentation asks.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import time
from pathlib import Path
from typing import Any

from .answer import Answer

MAX_AGE_S = 300
SECRET_ENV = "FLEETSIGHT_SLACK_SIGNING_SECRET"
SECRET_FILE_ENV = "FLEETSIGHT_SLACK_SIGNING_SECRET_FILE"
# Slack shows at most 40,000 characters of text; keep replies well under, on a line boundary.
MAX_TEXT = 3500


class SignatureError(Exception):
    """The request is not from Slack (or too old); the message says which check failed."""


def load_signing_secret(path: Path | None = None) -> str | None:
    """The signing secret from a file (``path`` or $FLEETSIGHT_SLACK_SIGNING_SECRET_FILE) or the
    environment; None when Slack is not configured. Never logged."""
    file = path or (Path(os.environ[SECRET_FILE_ENV]) if os.environ.get(SECRET_FILE_ENV) else None)
    if file is not None:
        return file.read_text(encoding="utf-8").strip() or None
    return os.environ.get(SECRET_ENV) or None


def sign(secret: str, timestamp: str, body: bytes) -> str:
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def verify(secret: str, headers: dict[str, str], body: bytes, now: float | None = None) -> None:
    """Raises SignatureError unless the request carries a fresh, valid Slack v0 signature."""
    timestamp = headers.get("x-slack-request-timestamp", "")
    signature = headers.get("x-slack-signature", "")
    if not timestamp or not signature:
        raise SignatureError("missing X-Slack-Signature or X-Slack-Request-Timestamp")
    if not timestamp.isdigit():
        raise SignatureError("X-Slack-Request-Timestamp is not a number")
    if abs((now or time.time()) - int(timestamp)) > MAX_AGE_S:
        raise SignatureError("stale request: timestamp more than 5 minutes away from now")
    if not hmac.compare_digest(sign(secret, timestamp, body), signature):
        raise SignatureError("bad signature")


def mrkdwn(text: str) -> str:
    """Markdown bold (**x**) to Slack's (*x*)."""
    return re.sub(r"\*\*(.+?)\*\*", r"*\1*", text)


def link(base_url: str | None, file: str, anchor: str) -> str:
    return f"<{base_url.rstrip('/')}/files/{file}#{anchor}|{file}>" if base_url else f"`{file}`"


def message(answer: Answer, base_url: str | None) -> dict[str, Any]:
    """The slash command's reply, posted in the channel (``in_channel``)."""
    body = mrkdwn(answer.text)
    if len(body) > MAX_TEXT:
        body = body[: body.rfind("\n", 0, MAX_TEXT)] + "\n…"
    sources = [f"[{c.n}] {link(base_url, c.file, c.anchor)} — {c.section}" for c in answer.citations]
    if answer.declined:
        sources = [f"closest: {link(base_url, f, '')}" for f in answer.closest]
    text = f"*Q:* {answer.question}\n{body}"
    if sources:
        text += "\n\n*Sources*\n" + "\n".join(sources)
    return {"response_type": "in_channel", "text": text}
