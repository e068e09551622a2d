"""The global Thanos Query through the layer: Prometheus's HTTP API (``/api/v1/...``) passed on to the
Query as it is, with a warning added to every successful answer for each cluster whose metrics the Query
cannot read.

Thanos Query answers from the stores it reaches and says nothing of one it cannot (docs/fleet.md,
measured): a fleet-wide sum then quietly leaves a cluster out. Prometheus's API has a place for exactly
this, the ``warnings`` list of an answer, which Grafana shows on the panel and promtool and the API
clients print. So a Grafana Prometheus datasource (or any client) pointed at the layer instead of the
Query gets the same answers, each saying which cluster it lacks. Reads only: the API has no write route
(and Thanos Query none either).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from fastapi import FastAPI, Request, Response

from .stores import StoreView

# The read routes of Prometheus's API that Grafana's Prometheus datasource and the API clients use; any
# other path (an admin route, say) is 404 here, whatever the Query behind would do with it.
READ_PATHS = re.compile(
    r"query|query_range|query_exemplars|format_query|series|labels|label/[^/]+/values|metadata"
    r"|status/buildinfo|rules|alerts"
)
# Headers of the caller's request that the Query needs (a form-encoded POST, as Grafana sends).
FORWARDED_HEADERS = ("content-type", "accept")


def missing_warnings(clusters: list[str], view: StoreView | None) -> list[str]:
    """One warning per configured cluster whose live stores do not answer (or one saying the Query's
    store list cannot be read)."""
    if view is None:
        return []
    if view.error:
        return [f"FleetSight: cannot tell which clusters this answer covers: {view.error}"]
    warnings = []
    for name in clusters:
        stores = view.clusters.get(name)
        if stores is None or stores.missing:
            why = stores.why_missing() if stores else "no store with this cluster label"
            warnings.append(f"FleetSight: cluster {name} is missing from this answer: {why}")
    return warnings


def with_warnings(content: bytes, warnings: list[str]) -> bytes | None:
    """The answer with ``warnings`` added (Prometheus's own kept first), or None when it is not a
    successful JSON answer of Prometheus's API (passed on untouched)."""
    try:
        body = json.loads(content)
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("status") != "success":
        return None
    body["warnings"] = [*(body.get("warnings") or []), *warnings]
    return json.dumps(body).encode()


def add_query_routes(
    app: FastAPI,
    reader: Any,
    client: httpx.AsyncClient,
    thanos_url: str,
    clusters: list[str],
    stores: Callable[[], Awaitable[StoreView | None]],
) -> None:
    """``/api/v1/{path}`` (GET and POST) onto the global Query at ``thanos_url``; ``stores`` reads which
    of the ``clusters`` it can read (the layer's Watch, which also keeps its gauges current)."""

    @app.api_route(
        "/api/v1/{path:path}",
        methods=["GET", "POST"],
        summary="Prometheus's HTTP API of the global Thanos Query, naming the clusters an answer lacks",
        dependencies=[reader],
    )
    async def prometheus_api(path: str, request: Request) -> Response:
        if not READ_PATHS.fullmatch(path):
            error = {
                "status": "error",
                "errorType": "not_found",
                "error": f"/api/v1/{path} is not a read route",
            }
            return Response(json.dumps(error), status_code=404, media_type="application/json")
        headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED_HEADERS}
        try:
            answer = await client.request(
                request.method,
                f"{thanos_url}/api/v1/{path}",
                params=list(request.query_params.multi_items()),
                content=await request.body(),
                headers=headers,
            )
        except httpx.HTTPError as exc:
            error = {"status": "error", "errorType": "unavailable", "error": f"global Thanos Query: {exc!r}"}
            return Response(json.dumps(error), status_code=502, media_type="application/json")
        content = answer.content
        if answer.status_code == 200:
            warnings = missing_warnings(clusters, await stores())
            content = (with_warnings(content, warnings) if warnings else None) or content
        media = answer.headers.get("content-type", "application/json")
        return Response(content, status_code=answer.status_code, media_type=media)
