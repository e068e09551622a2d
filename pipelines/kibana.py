"""The Kibana saved objects of the log path (data views, saved searches, a dashboard), as one ndjson
file that Kibana's import API takes; `fleetsight logs kibana-import` posts it (docker-compose runs it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

SAVED_OBJECTS = Path(__file__).resolve().parent / "kibana" / "fleetsight-logs.ndjson"


def saved_objects(path: Path = SAVED_OBJECTS) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def import_saved_objects(
    kibana_url: str, path: Path = SAVED_OBJECTS, timeout_s: float = 60.0
) -> dict[str, Any]:
    """POST the file to Kibana's saved-objects import API (overwriting our own ids); its JSON answer."""
    from .es_security import client_options  # Kibana checks the same users (production)

    response = httpx.post(
        f"{kibana_url.rstrip('/')}/api/saved_objects/_import?overwrite=true",
        headers={"kbn-xsrf": "fleetsight"},
        files={"file": (path.name, path.read_bytes(), "application/ndjson")},
        timeout=timeout_s,
        **client_options(),
    )
    if not response.is_success:
        raise ValueError(
            f"Kibana at {kibana_url} refused the import: HTTP {response.status_code} {response.text[:500]}"
        )
    answer = response.json()
    if not answer.get("success", False):
        raise ValueError(f"Kibana imported with errors: {json.dumps(answer.get('errors'))[:1000]}")
    return answer
