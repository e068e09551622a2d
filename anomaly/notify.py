"""Optional push of the anomaly service's flags and clears to the health service
(``POST /v1/events/anomaly``, issue 37), so that a straggler reaches the node's health state when it is
flagged instead of at the health service's next sweep.

Off unless ``FLEETSIGHT_ANOMALY_HEALTH_URL`` names the health service; its bearer token (scope
``events``) comes from the file ``FLEETSIGHT_ANOMALY_HEALTH_TOKEN_FILE`` names, never from a flag or a
log. A post runs on its own thread and never delays or fails a detection cycle: a lost post is logged
and counted, and the health service's reconcile sweep (which reads ``/v1/stragglers``) repairs it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import queue
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import httpx

from fleetsight.secrets import SecretFileError, read_secret_file

from .state import Event

log = logging.getLogger("anomaly.notify")
URL_ENV = "FLEETSIGHT_ANOMALY_HEALTH_URL"
TOKEN_FILE_ENV = "FLEETSIGHT_ANOMALY_HEALTH_TOKEN_FILE"
KINDS = {"flag": "flag", "cause": "flag", "clear": "clear"}  # a refined cause re-flags (same reason)


def iso(unix: float) -> str:
    return dt.datetime.fromtimestamp(unix, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def as_health_event(event: Event) -> dict[str, Any]:
    s = event.straggler
    return {
        "event": KINDS[event.kind],
        "node": s.node,
        "hpc_job": s.job,
        "cause": s.cause,
        "score": round(s.score, 3),
        "since": iso(s.since),
    }


class HealthNotifier:
    """Posts each cycle's events as one batch, in order, from a background thread."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/") + "/v1/events/anomaly"
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.Client(timeout=timeout_s, headers=headers)
        self.pending: queue.Queue[list[dict[str, Any]] | None] = queue.Queue()
        self.sent = 0
        self.failed = 0
        self.thread = threading.Thread(target=self._run, name="anomaly-health-notify", daemon=True)
        self.thread.start()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> HealthNotifier | None:
        url = environ.get(URL_ENV, "").strip()
        if not url:
            return None
        token_file = environ.get(TOKEN_FILE_ENV)
        try:
            token = read_secret_file(token_file, TOKEN_FILE_ENV) if token_file else None
        except SecretFileError as exc:  # no push then: the health service's sweep still reads the flags
            log.warning(
                json.dumps({"event": "health_notify_off", "token_file": token_file, "error": str(exc)})
            )
            return None
        return cls(url, token)

    def send(self, events: Iterable[Event]) -> None:
        batch = [as_health_event(e) for e in events if e.kind in KINDS]
        if batch:
            self.pending.put(batch)

    def close(self) -> None:
        self.pending.put(None)
        self.thread.join(timeout=10)
        self.client.close()

    def _run(self) -> None:
        while (batch := self.pending.get()) is not None:
            try:
                self.client.post(self.url, json={"events": batch}).raise_for_status()
                self.sent += len(batch)
            except httpx.HTTPError as exc:  # the health service's sweep repairs what is lost here
                self.failed += len(batch)
                log.warning(
                    json.dumps({"event": "health_notify_failed", "events": len(batch), "error": str(exc)})
                )
