"""The twin's Redfish BMCs and UFM as typed FastAPI routes, declared once and answered two ways: by
the twin's HTTP server (twin/server.py includes the router) and, without a socket, by
`RouterTransport`, which the backfill hands to the real exporters' httpx clients.

Each route names one resource; its path parameters are typed (a PSU index is an int) and its body
comes from the renderer of that resource (twin/render.py). An unknown node or resource answers 404
with a Redfish error (BMC) or a UFM error object, as the real services do.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Annotated, Any, get_args, get_origin

import httpx
from fastapi import APIRouter, Query
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.routing import Match

from . import render
from .sim import Simulation

BMC = "/bmc/{node}"
REDFISH = BMC + "/redfish/v1"
CHASSIS = REDFISH + "/Chassis/{chassis}"
SUPPLIES = CHASSIS + "/PowerSubsystem/PowerSupplies"
Body = Callable[[Simulation, int], dict[str, Any]]  # a resource's renderer: (simulation, node index)
PsuBody = Callable[[Simulation, int, int], dict[str, Any]]  # (simulation, node index, PSU index)
Filter = Annotated[list[str] | None, Query()]  # a repeatable query filter (?severity=a&severity=b)


class JSON(Response):
    """JSON as json.dumps writes it (the bytes the twin always served)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return json.dumps(content).encode()


def text(status: int, body: str, media_type: str = "text/plain; charset=utf-8") -> Response:
    return Response(body.encode(), status_code=status, media_type=media_type)


def redfish_error(message: str) -> dict[str, Any]:
    return {
        "error": {
            "code": "Base.1.15.ResourceNotFound",
            "message": message,
            "@Message.ExtendedInfo": [{"MessageId": "Base.1.15.ResourceNotFound", "Message": message}],
        }
    }


def redfish_unavailable(node: str) -> dict[str, Any]:
    """The body of a BMC that does not answer its Redfish service (telemetry_dropout, source bmc)."""
    message = f"The service of the BMC of {node} is temporarily unavailable. Retry in 60 seconds."
    return {
        "error": {
            "code": "Base.1.15.ServiceTemporarilyUnavailable",
            "message": message,
            "@Message.ExtendedInfo": [
                {"MessageId": "Base.1.15.ServiceTemporarilyUnavailable", "Message": message}
            ],
        }
    }


def ufm_links(base: str) -> dict[str, str]:
    return {
        "base": f"{base}/ufm",
        "ports": f"{base}/ufm/ufmRest/resources/ports",
        "systems": f"{base}/ufm/ufmRest/resources/systems",
        "events": f"{base}/ufm/ufmRest/app/events",
        "telemetry": f"{base}/ufm/csv/metrics",
    }


class Views:
    """One endpoint per resource. The simulation is read under ``lock`` (the runner's, when served
    beside a running simulation; none in the backfill, which calls between ticks)."""

    def __init__(self, sim: Simulation, lock: AbstractContextManager[Any], base_url: str) -> None:
        self.sim, self.lock, self.base_url = sim, lock, base_url

    # ------------------------------------------------------------------------------- Redfish
    def _redfish(self, node: str, build: Body) -> Response:
        index = self.sim.node_index.get(node)
        if index is None:
            return JSON(redfish_error(f"unknown node {node!r}"), status_code=404)
        with self.lock:
            if not self.sim.answers(index, "bmc"):
                return JSON(redfish_unavailable(node), status_code=503, headers={"Retry-After": "60"})
            body = build(self.sim, index)
        return JSON(body, headers={"OData-Version": "4.0"})

    def _chassis(self, node: str, chassis: str, build: Body) -> Response:
        if chassis != render.CHASSIS_ID:
            return self.redfish_missing(node, f"redfish/v1/Chassis/{chassis}")
        return self._redfish(node, build)

    def _psu(self, node: str, chassis: str, psu: int, build: PsuBody, tail: str = "") -> Response:
        if not 0 <= psu < render.psu_count(self.sim):
            path = f"redfish/v1/Chassis/{chassis}/PowerSubsystem/PowerSupplies/PSU{psu}{tail}"
            return self.redfish_missing(node, path)
        return self._chassis(node, chassis, lambda sim, index: build(sim, index, psu))

    def service_root(self, node: str) -> Response:
        return self._redfish(node, render.service_root)

    def chassis_collection(self, node: str) -> Response:
        return self._redfish(node, render.chassis_collection)

    def chassis(self, node: str, chassis: str) -> Response:
        return self._chassis(node, chassis, render.chassis)

    def power(self, node: str, chassis: str) -> Response:
        return self._chassis(node, chassis, render.power)

    def power_subsystem(self, node: str, chassis: str) -> Response:
        return self._chassis(node, chassis, render.power_subsystem)

    def power_supplies(self, node: str, chassis: str) -> Response:
        return self._chassis(node, chassis, render.power_supplies)

    def psu(self, node: str, chassis: str, psu: int) -> Response:
        return self._psu(node, chassis, psu, render.psu)

    def psu_metrics(self, node: str, chassis: str, psu: int) -> Response:
        return self._psu(node, chassis, psu, render.psu_metrics, "/Metrics")

    def bmc_base(self, node: str) -> Response:
        """The BMC's base URL itself holds no resource: clients start at /redfish/v1."""
        return self.redfish_missing(node, "")

    def redfish_missing(self, node: str, path: str) -> Response:
        if node not in self.sim.node_index:
            return JSON(redfish_error(f"unknown node {node!r}"), status_code=404)
        with self.lock:
            silent = not self.sim.answers(self.sim.node_index[node], "bmc")
        if silent:
            return JSON(redfish_unavailable(node), status_code=503, headers={"Retry-After": "60"})
        return JSON(redfish_error(f"resource /{path.strip('/')} not found"), status_code=404)

    # ----------------------------------------------------------------------------------- UFM
    def ufm_root(self) -> Response:
        return JSON(ufm_links(self.base_url))

    def ufm_ports(self, system: Filter = None) -> Response:
        with self.lock:
            ports = render.ufm_ports(self.sim)
        return JSON([p for p in ports if p["system_name"] in system] if system else ports)

    def ufm_systems(self) -> Response:
        with self.lock:
            return JSON(render.ufm_systems(self.sim))

    def ufm_events(
        self,
        severity: Filter = None,
        object_name: Filter = None,
        category: Filter = None,
        kind: Annotated[list[str] | None, Query(alias="type")] = None,
    ) -> Response:
        with self.lock:
            events = list(self.sim.ufm_events)
        wanted = {"severity": severity, "object_name": object_name, "category": category, "type": kind}
        for key, values in wanted.items():
            if values:
                events = [e for e in events if str(e.get(key)) in values]
        return JSON(events)

    def ufm_telemetry(self) -> Response:
        with self.lock:
            return text(200, render.ufm_telemetry_csv(self.sim), "text/csv; charset=utf-8")

    def ufm_missing(self, path: str) -> Response:
        return JSON({"error": f"no UFM resource /{path.strip('/')}"}, status_code=404)


def router(views: Views) -> APIRouter:
    """The BMC and UFM routes, most specific first (the catch-alls answer the 404s). Each path is
    also served with a trailing slash, as the twin always did (no redirects)."""
    table: tuple[tuple[str, Callable[..., Response]], ...] = (
        (BMC + "/redfish", views.service_root),
        (REDFISH, views.service_root),
        (REDFISH + "/Chassis", views.chassis_collection),
        (CHASSIS, views.chassis),
        (CHASSIS + "/Power", views.power),
        (CHASSIS + "/PowerSubsystem", views.power_subsystem),
        (SUPPLIES, views.power_supplies),
        (SUPPLIES + "/PSU{psu:int}", views.psu),
        (SUPPLIES + "/PSU{psu:int}/Metrics", views.psu_metrics),
        (BMC, views.bmc_base),
        (BMC + "/{path:path}", views.redfish_missing),
        ("/ufm", views.ufm_root),
        ("/ufm/ufmRest/resources/ports", views.ufm_ports),
        ("/ufm/ufmRest/resources/systems", views.ufm_systems),
        ("/ufm/ufmRest/app/events", views.ufm_events),
        ("/ufm/csv/metrics", views.ufm_telemetry),
        ("/ufm/{path:path}", views.ufm_missing),
    )
    api = APIRouter()
    for path, endpoint in table:
        api.add_api_route(path, endpoint, methods=["GET"])
        if not path.endswith(":path}"):
            api.add_api_route(path + "/", endpoint, methods=["GET"], include_in_schema=False)
    return api


class RouterTransport(httpx.BaseTransport):
    """An httpx transport answered by a router's own routes, in-process and synchronously: the route
    that Starlette's matcher picks (typed path convertors included) calls its endpoint with the path
    parameters and the query filters it declares. No ASGI event loop: the backfill sends ~18 BMC
    requests per node and agent step, and running the app through one cost 250-1700 us a request
    (async or threaded endpoints) against ~100 us for the render and httpx alone.
    """

    def __init__(self, api: APIRouter) -> None:
        self.routes = [(route, _query_filters(route)) for route in api.routes if isinstance(route, APIRoute)]

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        scope = {"type": "http", "path": request.url.path, "method": request.method}
        for route, filters in self.routes:
            match, child = route.matches(scope)
            if match is not Match.FULL:
                continue
            params = dict(child["path_params"])
            for name, alias in filters:
                values = request.url.params.get_list(alias)
                if values:
                    params[name] = values
            response = route.endpoint(**params)
            return httpx.Response(response.status_code, headers=response.raw_headers, content=response.body)
        return httpx.Response(404, text=f"no such endpoint {request.url.path!r}\n")


def _query_filters(route: APIRoute) -> list[tuple[str, str]]:
    """(parameter, query name) of each query parameter; the twin's are all repeatable lists."""
    filters = []
    for field in route.dependant.query_params:
        annotation = field.field_info.annotation
        if not any(get_origin(a) is list for a in (annotation, *get_args(annotation))):
            raise TypeError(f"{route.path}: query parameter {field.name} must be a list[str] filter")
        filters.append((field.name, field.alias))
    return filters
