"""The dashboard viewer: FleetSight's persona dashboards drawn in a browser from the committed Grafana JSON
(the same files production Grafana provisions), their queries run by the project's runner against the real
Prometheus/Thanos and OpenSearch, and a fleet overview page. Grafana's server is AGPL and never built here;
this is the local stack's window onto the same numbers (`fleetsight dashboards serve`).

Pages: ``/`` (the dashboards by persona), ``/d/{uid}`` (one dashboard), ``/overview``, ``/fleet`` (the
clusters side by side, from the global layer when ``--fleet-url`` names it); the browser side is in
``static/`` and draws with Apache ECharts, served from setup's npm cache at ``/vendor/echarts.min.js``.
Every source but Prometheus/Thanos is optional: without ``--logs`` the logs panels say they need it,
without ``--fleet-url`` the fleet page says the global layer is not configured.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field

from fleetsight.prometheus import Prometheus

from .. import build, catalog, verify
from . import data
from .fleet import fleet
from .overview import overview

STATIC = Path(__file__).resolve().parent / "static"
MAX_VARIABLE = 200  # characters of one variable's value: label values are short


@dataclass(frozen=True)
class Sources:
    prometheus_url: str
    logs_url: str | None = None
    chat_url: str | None = None
    fleet_url: str | None = None  # the global layer (fleetsight fleet serve), for /fleet
    fleet_token: str | None = None  # a token with scope `read` there, if its reads need one


class PanelQuery(BaseModel):
    panel: str = Field(description="the panel's viewerKey, from GET /api/dashboards/{uid}")
    vars: dict[str, str | list[str]] = Field(
        default_factory=dict,
        description="variable name -> chosen value, several values, or $__all (the All option)",
    )
    start: str = Field("now-6h", alias="from", description="now, now-<duration> or epoch ms")
    end: str = Field("now", alias="to")


def keyed(dashboard: dict[str, Any]) -> dict[str, Any]:
    """The dashboard with a ``viewerKey`` on each panel that is not a row: its index, or ``row.child``
    for a panel inside a collapsed row (Grafana's JSON gives these panels no id)."""
    for index, panel in enumerate(dashboard.get("panels", [])):
        if panel.get("type") != "row":
            panel["viewerKey"] = str(index)
        for child_index, child in enumerate(panel.get("panels", [])):
            child["viewerKey"] = f"{index}.{child_index}"
    return dashboard


def panel_by_key(dashboard: dict[str, Any], key: str) -> dict[str, Any]:
    for panel in dashboard.get("panels", []):
        for candidate in [panel, *panel.get("panels", [])]:
            if candidate.get("viewerKey") == key:
                return candidate
    raise HTTPException(400, f"dashboard {dashboard.get('uid')!r} has no panel {key!r}")


def load_dashboards(folder: Path = build.OUTPUT_DIR) -> dict[str, dict[str, Any]]:
    """The committed JSON by uid, each with its viewer keys."""
    found = {}
    for path in verify.dashboard_files(folder):
        dashboard = json.loads(path.read_text())
        found[dashboard["uid"]] = keyed(dashboard)
    return found


def parsed_range(start: str, end: str) -> data.TimeRange:
    try:
        return data.time_range(start, end)
    except data.BadRange as exc:
        raise HTTPException(400, f"bad time range: {exc}") from None


def create_app(sources: Sources, echarts_file: Path, folder: Path = build.OUTPUT_DIR) -> FastAPI:
    dashboards = load_dashboards(folder)
    specs = {spec.uid: spec for spec in catalog.DASHBOARDS}
    prometheus = Prometheus(sources.prometheus_url, timeout=30, post_over=0)  # POST, as Grafana sends
    logs = httpx.Client(base_url=sources.logs_url, timeout=30) if sources.logs_url else None
    headers = {"Authorization": f"Bearer {sources.fleet_token}"} if sources.fleet_token else {}
    # The layer answers within its own per-cluster --timeout (5 s by default), missing ones named.
    layer = httpx.Client(timeout=20, headers=headers) if sources.fleet_url else None

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        prometheus.close()
        for client in (logs, layer):
            if client is not None:
                client.close()

    app = FastAPI(title="FleetSight dashboards", description=__doc__, lifespan=lifespan)

    def runner(start: str, end: str) -> verify.Runner:
        window = parsed_range(start, end)
        return verify.Runner(prometheus, logs, window.start, window.end)

    def about(uid: str) -> dict[str, str]:
        spec = specs.get(uid)
        return {"persona": spec.persona if spec else "", "question": spec.question if spec else ""}

    def dashboard_or_404(uid: str) -> dict[str, Any]:
        if uid not in dashboards:
            raise HTTPException(404, f"no dashboard {uid!r} (known: {', '.join(sorted(dashboards))})")
        return dashboards[uid]

    def page(name: str) -> FileResponse:
        return FileResponse(STATIC / name, media_type="text/html")

    @app.get("/", include_in_schema=False)
    def home() -> FileResponse:
        return page("home.html")

    @app.get("/d/{uid}", include_in_schema=False)
    def dashboard_page(uid: str) -> FileResponse:
        dashboard_or_404(uid)
        return page("dashboard.html")

    @app.get("/overview", include_in_schema=False)
    def overview_page() -> FileResponse:
        return page("overview.html")

    @app.get("/fleet", include_in_schema=False)
    def fleet_page() -> FileResponse:
        return page("fleet.html")

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> FileResponse:
        path = STATIC / name
        if "/" in name or name.startswith(".") or not path.is_file():
            raise HTTPException(404, f"no static file {name!r}")
        return FileResponse(path)

    @app.get("/vendor/echarts.min.js", include_in_schema=False)
    def echarts() -> FileResponse:
        return FileResponse(echarts_file, media_type="text/javascript")

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/api/dashboards", summary="The dashboards, by persona, and the chat page's address")
    def list_dashboards() -> dict[str, Any]:
        listed = [
            {"uid": uid, "title": d.get("title", uid), "url": f"/d/{uid}", **about(uid)}
            for uid, d in dashboards.items()
        ]  # fmt: skip
        return {"dashboards": listed, "chat": sources.chat_url, "fleet": "/fleet"}

    @app.get("/api/dashboards/{uid}", summary="One dashboard's Grafana JSON, each panel with its viewerKey")
    def get_dashboard(uid: str) -> dict[str, Any]:
        return {"dashboard": dashboard_or_404(uid), **about(uid)}

    @app.get(
        "/api/dashboards/{uid}/variables",
        summary="The dashboard's variables with their options (var-<name>=<value>: the others' choices)",
    )
    def get_variables(
        uid: str,
        request: Request,
        start: str = Query("now-6h", alias="from"),
        end: str = Query("now", alias="to"),
    ) -> dict[str, Any]:
        chosen = chosen_in(request)
        return {"variables": data.variables_of(runner(start, end), dashboard_or_404(uid), chosen)}

    @app.post("/api/dashboards/{uid}/query", summary="Run one panel's targets; frames or each target's error")
    def query_panel(uid: str, body: PanelQuery) -> dict[str, Any]:
        dashboard = dashboard_or_404(uid)
        panel = panel_by_key(dashboard, body.panel)
        too_long = [name for name, value in body.vars.items() if too_long_value(value)]
        if too_long:
            raise HTTPException(400, f"variable values over {MAX_VARIABLE} characters: {', '.join(too_long)}")
        return data.panel_data(runner(body.start, body.end), dashboard, panel, body.vars)

    @app.get("/api/overview", summary="Every node's health state by rack, the firing alerts, the stragglers")
    def get_overview() -> dict[str, Any]:
        return overview(prometheus, sources.chat_url)

    @app.get(
        "/api/fleet",
        summary="One row per cluster (global layer and Thanos), the clusters missing, the firing alerts",
    )
    def get_fleet() -> dict[str, Any]:
        return fleet(prometheus, layer, sources.fleet_url)

    return app


def too_long_value(value: str | list[str]) -> bool:
    values = [value] if isinstance(value, str) else value
    return len(values) > MAX_VARIABLE or any(len(v) > MAX_VARIABLE for v in values)


def chosen_in(request: Request) -> dict[str, str | list[str]]:
    """Grafana's URL form of variable choices: ``var-cluster=a&var-cluster=b`` (several values)."""
    chosen: dict[str, str | list[str]] = {}
    for key in {k for k in request.query_params if k.startswith("var-")}:
        values = request.query_params.getlist(key)
        if too_long_value(values):
            raise HTTPException(400, f"variable values over {MAX_VARIABLE} characters: {key[4:]}")
        chosen[key[4:]] = values[0] if len(values) == 1 else values
    return chosen
