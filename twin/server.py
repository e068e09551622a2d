"""One loopback HTTP server for every endpoint the twin plays: dcgm-exporter per node, a Redfish BMC
per node, UFM REST, slurmrestd jobs and Prometheus service discovery. Its root page lists them all.

FastAPI routes, typed by path (the Redfish and UFM ones declared in twin/api.py, which the backfill
answers in-process too); uvicorn serves them from a thread beside the simulation. Handlers
read the simulation under the runner's lock; a dcgm page is rendered at most once per tick and node.
A bad path answers 404 with a reason; a handler error answers 500 and is logged, never taking the
server down. URLs and JSON bodies are those of the real services (and of the twin before FastAPI).
"""

from __future__ import annotations

import html
import logging
import random
import socket
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response

from . import api as routes
from . import dcgm, render
from .api import JSON, text
from .sim import Simulation

log = logging.getLogger("twin.server")
PROM_TEXT = "text/plain; version=0.0.4; charset=utf-8"


class TwinServer:
    def __init__(self, host: str, port: int, sim: Simulation, lock: threading.RLock) -> None:
        self.sim = sim
        self.lock = lock
        self.dcgm_cache: dict[str, tuple[int, str]] = {}
        self.random = random.Random(sim.scenario.seed + 1)
        self.requests = 0
        # IPPROTO_TCP named explicitly: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose proto
        # says TCP, and with proto 0 every response waited ~40 ms for the client's delayed ACK.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        self.socket.listen(2048)  # connections queue from now on, before uvicorn accepts them
        self.host, self.port = self.socket.getsockname()[:2]
        config = uvicorn.Config(app(self), log_level="warning", access_log=False, lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, name="twin-http", daemon=True
        )

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        """Serve from a thread; return once uvicorn accepts connections."""
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise OSError(f"the twin's HTTP server did not start on {self.base_url}")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.socket.close()

    # ----------------------------------------------------------------------------------- views
    def dcgm(self, node: str) -> tuple[int, str]:
        sim = self.sim
        index = sim.node_index.get(node)
        if index is None:
            return 404, f"unknown node {node!r}\n"
        with self.lock:
            if not sim.alive[index]:
                return 503, f"node {node} is down\n"
            if not sim.answers(index, "dcgm-exporter"):
                return silent_exporter(node)
            if sim.scenario.scrape_failure_rate and self.random.random() < sim.scenario.scrape_failure_rate:
                return 500, "error collecting metrics: dcgm: timeout waiting for field values\n"
            cached = self.dcgm_cache.get(node)
            if cached is not None and cached[0] == sim.tick_index:
                return 200, cached[1]
            body = dcgm.metrics(sim, index)
            self.dcgm_cache[node] = (sim.tick_index, body)
            return 200, body

    def endpoints(self) -> dict[str, Any]:
        base = self.base_url
        nodes = self.sim.nodes
        return {
            "cluster": self.sim.scenario.cluster.name,
            "sim_time": render.iso_now(self.sim),
            "dcgm": {n: f"{base}/dcgm/{n}/metrics" for n in nodes},
            "redfish": {n: f"{base}/bmc/{n}" for n in nodes},
            "ufm": routes.ufm_links(base),
            "slurm": {"jobs": f"{base}/slurm/v0.0.40/jobs", "nodes": f"{base}/slurm/v0.0.40/nodes"},
            "targets": {"dcgm": f"{base}/targets/dcgm.json"},
        }


def silent_exporter(node: str) -> tuple[int, str]:
    """What a scrape of a dcgm-exporter that stopped answering gets (telemetry_dropout): 503, as from the
    proxy or Service in front of a pod that is not ready; Prometheus records up = 0."""
    return 503, f"dcgm-exporter on {node} is not answering\n"


def app(twin: TwinServer) -> FastAPI:
    """The twin's routes. Trailing slashes are accepted as before (no redirects)."""
    api = FastAPI(
        title="FleetSight twin", redirect_slashes=False, docs_url=None, redoc_url=None, openapi_url=None
    )

    @api.middleware("http")
    async def count_and_contain(request: Request, call_next: Any) -> Response:
        twin.requests += 1
        try:
            return await call_next(request)
        except Exception as exc:  # a handler bug must not take the server down
            log.exception("event=handler_error path=%s error=%s", request.url.path, exc)
            return text(500, f"internal error: {exc}\n")

    @api.get("/")
    def index(request: Request, format: str = "") -> Response:
        if format == "json" or "application/json" in request.headers.get("accept", ""):
            return JSON(twin.endpoints())
        return HTMLResponse(index_page(twin.endpoints()))

    @api.get("/dcgm/{node}/metrics")
    @api.get("/dcgm/{node}/metrics/", include_in_schema=False)
    def dcgm(node: str) -> Response:
        status, body = twin.dcgm(node)
        return text(status, body, PROM_TEXT if status == 200 else "text/plain; charset=utf-8")

    api.include_router(routes.router(routes.Views(twin.sim, twin.lock, twin.base_url)))

    @api.get("/slurm/v0.0.40/jobs")
    @api.get("/slurm/v0.0.40/jobs/", include_in_schema=False)
    def slurm_jobs() -> Response:
        with twin.lock:
            return JSON(render.slurm_jobs(twin.sim))

    @api.get("/slurm/v0.0.40/nodes")
    @api.get("/slurm/v0.0.40/nodes/", include_in_schema=False)
    def slurm_nodes() -> Response:
        with twin.lock:
            return JSON(render.slurm_nodes(twin.sim))

    @api.get("/targets/dcgm.json")
    def targets() -> Response:
        with twin.lock:
            return JSON(render.dcgm_targets(twin.sim, f"{twin.host}:{twin.port}"))

    @api.api_route("/{path:path}", methods=["GET"], include_in_schema=False)
    def unknown(path: str) -> Response:
        shown = "/" + path.rstrip("/")
        return text(404, f"no such endpoint {shown!r}; see / for the list\n")

    return api


def index_page(endpoints: dict[str, Any]) -> str:
    def link(url: str) -> str:
        return f'<a href="{html.escape(url)}">{html.escape(url)}</a>'

    rows = [
        f"<h1>FleetSight digital twin: {html.escape(endpoints['cluster'])}</h1>",
        f"<p>cluster {html.escape(endpoints['cluster'])}, simulated time "
        f"{html.escape(endpoints['sim_time'])}. "
        "Machine-readable list: <a href='/?format=json'>/?format=json</a></p>",
        "<h2>Fabric, scheduler, discovery</h2><ul>",
        *(f"<li>UFM {name}: {link(url)}</li>" for name, url in endpoints["ufm"].items()),
        f"<li>slurmrestd jobs: {link(endpoints['slurm']['jobs'])}</li>",
        f"<li>slurmrestd nodes: {link(endpoints['slurm']['nodes'])}</li>",
        f"<li>Prometheus http_sd targets: {link(endpoints['targets']['dcgm'])}</li></ul>",
        "<h2>Nodes</h2><table><tr><th>node</th><th>dcgm-exporter</th><th>Redfish BMC</th></tr>",
        *(
            f"<tr><td>{html.escape(node)}</td><td>{link(url)}</td>"
            f"<td>{link(endpoints['redfish'][node] + '/redfish/v1/')}</td></tr>"
            for node, url in endpoints["dcgm"].items()
        ),
        "</table>",
    ]
    return (
        "<!doctype html><html><head><title>FleetSight twin</title></head><body>"
        + "\n".join(rows)
        + "</body></html>"
    )
