"""Small real HTTP servers for the chatbot's tests: the health and anomaly APIs, a log search and an
OpenAI-compatible chat-completions endpoint, each speaking its real routes and JSON on loopback."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException, Request

from support import free_port, wait_until


@contextmanager
def serve_in_thread(app: FastAPI) -> Iterator[str]:
    """Serve app on a free loopback port for the duration of the block; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, timeout=20, what=f"stub server on port {port}")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@dataclass
class ClusterState:
    """What the stub health and anomaly services report; tests change it between questions."""

    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    stragglers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    logs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    delay_s: float = 0.0  # how long the health service takes to answer (timeouts)
    read_token: str | None = None  # the health API's reads need this bearer token (open_reads: false)
    requests: list[str] = field(default_factory=list)


def psu_failure_state() -> ClusterState:
    """The issue's example: job 4711 slow because n0007's PSU2 failed and the power brake engaged."""
    return ClusterState(
        nodes={
            "n0007": {
                "node": "n0007",
                "state": "degraded",
                "since": "2026-11-23T10:02:30Z",
                "reasons": [
                    {
                        "signal": "PSUFailed",
                        "source": "alertmanager",
                        "effect": "drain",
                        "since": "2026-11-23T10:02:00Z",
                        "evidence": {"psu": "PSU2"},
                        "runbook": "docs/runbooks/PSUFailed.md",
                        "summary": "PSU2 failed (LossOfInput); GPU power brake engaged",
                    }
                ],
            },
            "n0003": {"node": "n0003", "state": "healthy", "since": "2026-11-23T08:00:00Z", "reasons": []},
            # A reason whose runbook is not written (the health service names one per signal).
            "n0004": {
                "node": "n0004",
                "state": "degraded",
                "since": "2026-11-23T07:29:46Z",
                "reasons": [
                    {
                        "signal": "exporter_unreachable",
                        "source": "prometheus",
                        "since": "2026-11-23T07:29:46Z",
                        "runbook": "docs/runbooks/exporter_unreachable.md",
                        "summary": "Prometheus cannot scrape dcgm on n0004",
                    }
                ],
            },
        },
        stragglers={
            "4711": [
                {
                    "hpc_job": "4711",
                    "node": "n0007",
                    "cause": "power_brake",
                    "gpu": 0,
                    "score": 12.5,
                    "since": "2026-11-23T10:03:10Z",
                    "evidence": {"throttle": "HW Power Brake Slowdown"},
                }
            ]
        },
        logs={
            "n0007": [
                {
                    "@timestamp": "2026-11-23T10:01:55Z",
                    "host": {"name": "n0007"},
                    "log": {"level": "error"},
                    "message": "BMC: PSU2 LossOfInput",
                }
            ]
        },
    )


def health_app(state: ClusterState) -> FastAPI:
    """``GET /v1/nodes/{node}`` as the health service answers it (404 for an unknown node)."""
    app = FastAPI()

    @app.get("/v1/nodes/{node}")
    async def node(node: str, request: Request) -> Any:
        state.requests.append(f"health {node}")
        if state.read_token and request.headers.get("authorization") != f"Bearer {state.read_token}":
            raise HTTPException(401, "this needs a bearer token with scope 'read'")
        if state.delay_s:
            await asyncio.sleep(state.delay_s)
        if node == "n0666":  # a proxy or an older API answering JSON of another shape
            return ["not", "a", "node"]
        if node not in state.nodes:
            raise HTTPException(404, f"unknown node {node!r}")
        return state.nodes[node]

    return app


def anomaly_app(state: ClusterState) -> FastAPI:
    """``GET /v1/jobs/{id}/stragglers`` as the anomaly service answers it (404: job not running)."""
    app = FastAPI()

    @app.get("/v1/jobs/{job}/stragglers")
    def stragglers(job: str) -> dict[str, Any]:
        state.requests.append(f"anomaly {job}")
        if job not in state.stragglers:
            raise HTTPException(404, f"job {job} is not running (not in the last window)")
        return {"hpc_job": job, "stragglers": state.stragglers[job]}

    return app


def logs_app(state: ClusterState) -> FastAPI:
    """``POST /{index}/_search`` answering like OpenSearch: the node from the query's host.name term."""
    app = FastAPI()

    @app.post("/{index}/_search")
    async def search(index: str, request: Request) -> dict[str, Any]:
        body = await request.json()
        filters = body["query"]["bool"]["filter"]
        node = next(f["term"]["host.name"] for f in filters if "term" in f)
        state.requests.append(f"logs {index} {node}")
        hits = [{"_index": "fleetsight-logs-kernel", "_source": doc} for doc in state.logs.get(node, [])]
        return {"hits": {"total": {"value": len(hits)}, "hits": hits}}

    return app


@dataclass
class ModelBehaviour:
    """What the stub language model does with the next request."""

    mode: str = "answer"  # answer, slow, invent, bad_citation, error
    delay_s: float = 3.0
    requests: list[dict[str, Any]] = field(default_factory=list)


def openai_app(behaviour: ModelBehaviour) -> FastAPI:
    """``POST /v1/chat/completions`` in OpenAI's format; the answer cites passage [1] and quotes a
    command only when the passages hold it."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> dict[str, Any]:
        body = await request.json()
        behaviour.requests.append({"body": body, "authorization": request.headers.get("authorization")})
        if behaviour.mode == "slow":
            await asyncio.sleep(behaviour.delay_s)
        if behaviour.mode == "error":
            raise HTTPException(500, "model crashed")
        content = {
            "answer": "The GPU fell off the bus: drain the node and reboot it [1][2].",
            "slow": "too late [1]",
            "invent": "Run `nvidia-smi --reset-everything --force` to fix it [1].",
            "bad_citation": "See passage [9].",
        }[behaviour.mode]
        return {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    return app
