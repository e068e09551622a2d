"""One loopback HTTP server for every endpoint the twin plays: dcgm-exporter per node, a Redfish BMC
per node, UFM REST, slurmrestd jobs and Prometheus service discovery. Its root page lists them all.

Handlers read the simulation under the runner's lock; a dcgm page is rendered at most once per tick
and node. A bad path answers 404 with a reason; a handler error answers 500 and is logged, never
taking the server down.
"""

from __future__ import annotations

import html
import json
import logging
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from twin import render
from twin.sim import Simulation

log = logging.getLogger("twin.server")
PROM_TEXT = "text/plain; version=0.0.4; charset=utf-8"


class TwinServer:
    def __init__(self, host: str, port: int, sim: Simulation, lock: threading.RLock) -> None:
        self.sim = sim
        self.lock = lock
        self.dcgm_cache: dict[str, tuple[int, str]] = {}
        self.random = random.Random(sim.scenario.seed + 1)
        self.requests = 0
        handler = type("BoundHandler", (Handler,), {"twin": self})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.host, self.port = self.httpd.server_address[:2]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="twin-http", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # ----------------------------------------------------------------------------------- views
    def dcgm(self, node: str) -> tuple[int, str]:
        sim = self.sim
        index = sim.node_index.get(node)
        if index is None:
            return 404, f"unknown node {node!r}\n"
        with self.lock:
            if not sim.alive[index]:
                return 503, f"node {node} is down\n"
            if sim.scenario.scrape_failure_rate and self.random.random() < sim.scenario.scrape_failure_rate:
                return 500, "error collecting metrics: dcgm: timeout waiting for field values\n"
            cached = self.dcgm_cache.get(node)
            if cached is not None and cached[0] == sim.tick_index:
                return 200, cached[1]
            text = render.dcgm_metrics(sim, index)
            self.dcgm_cache[node] = (sim.tick_index, text)
            return 200, text

    def endpoints(self) -> dict[str, Any]:
        base = self.base_url
        nodes = self.sim.nodes
        return {
            "scenario": self.sim.scenario.name,
            "cluster": self.sim.scenario.cluster.name,
            "sim_time": render.iso_now(self.sim),
            "dcgm": {n: f"{base}/dcgm/{n}/metrics" for n in nodes},
            "redfish": {n: f"{base}/bmc/{n}" for n in nodes},
            "ufm": {
                "base": f"{base}/ufm",
                "ports": f"{base}/ufm/ufmRest/resources/ports",
                "systems": f"{base}/ufm/ufmRest/resources/systems",
                "events": f"{base}/ufm/ufmRest/app/events",
                "telemetry": f"{base}/ufm/csv/metrics",
            },
            "slurm": {"jobs": f"{base}/slurm/v0.0.40/jobs"},
            "targets": {"dcgm": f"{base}/targets/dcgm.json"},
        }


class Handler(BaseHTTPRequestHandler):
    twin: TwinServer
    server_version = "fleetsight-twin/1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: Prometheus scrapes every 5 s
        return

    def do_GET(self) -> None:
        self.twin.requests += 1
        url = urlsplit(self.path)
        try:
            self.route(url.path.rstrip("/") or "/", parse_qs(url.query))
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:  # a handler bug must not take the server down
            log.exception("event=handler_error path=%s error=%s", url.path, exc)
            self.send_text(500, f"internal error: {exc}\n")

    def route(self, path: str, query: dict[str, list[str]]) -> None:
        twin = self.twin
        parts = path.strip("/").split("/")
        if path == "/":
            if "json" in query.get("format", []) or "application/json" in self.headers.get("Accept", ""):
                self.send_json(200, twin.endpoints())
            else:
                self.send_html(index_page(twin.endpoints()))
        elif len(parts) == 3 and parts[0] == "dcgm" and parts[2] == "metrics":
            status, text = twin.dcgm(parts[1])
            self.send_text(status, text, PROM_TEXT if status == 200 else "text/plain; charset=utf-8")
        elif len(parts) >= 2 and parts[0] == "bmc":
            self.bmc(parts[1], "/" + "/".join(parts[2:]))
        elif parts[0] == "ufm":
            self.ufm("/" + "/".join(parts[1:]), query)
        elif path == "/slurm/v0.0.40/jobs":
            with twin.lock:
                self.send_json(200, render.slurm_jobs(twin.sim))
        elif path == "/targets/dcgm.json":
            host = f"{twin.host}:{twin.port}"
            with twin.lock:
                self.send_json(200, render.dcgm_targets(twin.sim, host))
        else:
            self.send_text(404, f"no such endpoint {path!r}; see / for the list\n")

    def bmc(self, node: str, path: str) -> None:
        sim = self.twin.sim
        index = sim.node_index.get(node)
        if index is None:
            self.send_json(404, redfish_error(f"unknown node {node!r}"))
            return
        with self.twin.lock:
            body = render.redfish(sim, index, path)
        if body is None:
            self.send_json(404, redfish_error(f"resource {path} not found"))
        else:
            self.send_json(200, body, headers={"OData-Version": "4.0"})

    def ufm(self, path: str, query: dict[str, list[str]]) -> None:
        twin = self.twin
        with twin.lock:
            if path == "/":
                self.send_json(200, twin.endpoints()["ufm"])
            elif path == "/ufmRest/resources/ports":
                ports = render.ufm_ports(twin.sim)
                wanted = query.get("system")
                if wanted:
                    ports = [p for p in ports if p["system_name"] in wanted]
                self.send_json(200, ports)
            elif path == "/ufmRest/resources/systems":
                self.send_json(200, render.ufm_systems(twin.sim))
            elif path == "/ufmRest/app/events":
                events = list(twin.sim.ufm_events)
                for key in ("severity", "object_name", "category", "type"):
                    if key in query:
                        events = [e for e in events if str(e.get(key)) in query[key]]
                self.send_json(200, events)
            elif path == "/csv/metrics":
                self.send_text(200, render.ufm_telemetry_csv(twin.sim), "text/csv; charset=utf-8")
            else:
                self.send_json(404, {"error": f"no UFM resource {path}"})

    # ----------------------------------------------------------------------------------- replies
    def send_body(
        self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def send_text(self, status: int, text: str, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_body(status, text.encode(), content_type)

    def send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self.send_body(status, json.dumps(body).encode(), "application/json", headers)

    def send_html(self, text: str) -> None:
        self.send_body(200, text.encode(), "text/html; charset=utf-8")


def redfish_error(message: str) -> dict[str, Any]:
    return {
        "error": {
            "code": "Base.1.15.ResourceNotFound",
            "message": message,
            "@Message.ExtendedInfo": [{"MessageId": "Base.1.15.ResourceNotFound", "Message": message}],
        }
    }


def index_page(endpoints: dict[str, Any]) -> str:
    def link(url: str) -> str:
        return f'<a href="{html.escape(url)}">{html.escape(url)}</a>'

    rows = [
        f"<h1>FleetSight digital twin: {html.escape(endpoints['scenario'])}</h1>",
        f"<p>cluster {html.escape(endpoints['cluster'])}, simulated time "
        f"{html.escape(endpoints['sim_time'])}. "
        "Machine-readable list: <a href='/?format=json'>/?format=json</a></p>",
        "<h2>Fabric, scheduler, discovery</h2><ul>",
        *(f"<li>UFM {name}: {link(url)}</li>" for name, url in endpoints["ufm"].items()),
        f"<li>slurmrestd jobs: {link(endpoints['slurm']['jobs'])}</li>",
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
