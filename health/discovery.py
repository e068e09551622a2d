"""Prometheus HTTP service discovery from the scheduler's inventory: ``GET /v1/targets/<job>``.

Prometheus's ``http_sd_configs`` expects a JSON list of target groups, ``[{"targets": ["host:port"],
"labels": {...}}]``, and keeps the previous list when a refresh fails (non-200). So:

- the node list is the scheduler's own (slurmrestd ``/nodes``, the twin's, or ``--nodes-file`` when no
  scheduler is configured), never Prometheus's ``up`` (a target would then keep itself alive);
- every node the scheduler lists is a target, DOWN and drained ones included: that is when their
  metrics matter most. Its state is a label (``scheduler_state``), as are ``node``, ``cluster``,
  ``unit`` (the health service's scalable unit / rack) and ``partition``;
- until the scheduler has answered once the route answers 503, so Prometheus keeps what it had (and
  the file_sd fallback lists still apply) instead of dropping every node.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Response

from .service_protocol import ServiceReads

# The scrape jobs of metrics/prometheus.yml that list one target per node, and the port each
# exporter listens on (dcgm-exporter, FleetSight's node agent, node_exporter).
DEFAULT_PORTS: dict[str, int] = {"dcgm": 9400, "fleetsight-node": 9401, "node": 9100}


def parse_ports(values: tuple[str, ...] | list[str]) -> dict[str, int]:
    """``["dcgm=9400", "node=9100"]`` over the defaults; ValueError names a malformed item."""
    ports = dict(DEFAULT_PORTS)
    for value in values:
        job, sep, port = value.partition("=")
        if not sep or not job or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--discovery-port {value!r}: expected JOB=PORT, e.g. dcgm=9400")
        ports[job] = int(port)
    return ports


def inventory_of(service: ServiceReads) -> dict[str, dict[str, Any]] | None:
    """The scheduler's nodes; the static list when no scheduler is configured; None while unknown."""
    sources = service.sources
    if sources.scheduler_url:
        return sources.inventory
    return {name: {"state": ["UNKNOWN"], "partitions": []} for name in sources.static_nodes}


def target_groups(service: ServiceReads, job: str, port: int) -> list[dict[str, Any]]:
    inventory = inventory_of(service)
    if inventory is None:
        raise HTTPException(503, "the scheduler has not answered yet; Prometheus keeps its last targets")
    units = {n: item.get("unit", "") for n, item in service.engine.snapshot()["nodes"].items()}
    groups = []
    for node in sorted(inventory):
        item = inventory[node]
        labels = {
            "node": node,
            "cluster": service.cluster,
            "unit": units.get(node, ""),
            "partition": ",".join(item["partitions"]),
            "scheduler_state": "+".join(word.lower() for word in item["state"]) or "unknown",
        }
        groups.append({"targets": [f"{node}:{port}"], "labels": {k: v for k, v in labels.items() if v}})
    return groups


def add_routes(app: FastAPI, service: ServiceReads, read_check: Any, ports: dict[str, int]) -> None:
    """``read_check``: the service's read-scope check (a bearer token when tokens are configured;
    Prometheus sends one with ``authorization: {credentials_file: ...}``)."""

    @app.get(
        "/v1/targets/{job}",
        summary="Prometheus http_sd target groups for a per-node scrape job, from the scheduler's nodes",
        dependencies=[Depends(read_check)],
    )
    async def targets(job: str) -> Response:
        if job not in ports:
            raise HTTPException(404, f"unknown job {job!r}; known: {', '.join(sorted(ports))}")
        body = json.dumps(target_groups(service, job, ports[job])).encode()
        return Response(body, media_type="application/json")
