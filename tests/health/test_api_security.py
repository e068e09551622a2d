"""The HTTP APIs under attack, on the real servers: the health service (writes need a scoped token) and
the anomaly service (reads behind a token when configured). Each API is fuzzed from its own OpenAPI
schema with schemathesis (property-based: generated paths, queries and bodies): no 5xx, every response
as the schema says, and every write refused without a token. Bounded here; bench/api_fuzz.py runs
longer and prints the counts."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from api_fuzz import fuzz
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from health_helpers import fast_policy, start_health

from support import Process, free_port, wait_until

HEALTH_TOKEN = "health-test-token-0000drain"
ANOMALY_TOKEN = "anomaly-test-token-0000read"
FUZZ_EXAMPLES = 25  # per operation; bench/api_fuzz.py runs more
WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE")


@pytest.fixture(scope="module")
def health_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("health-security")
    nodes = folder / "nodes.txt"
    nodes.write_text("n0001\nn0002\nn0003\n")
    process, url = start_health(
        folder, fast_policy(), ["--nodes-file", str(nodes)], tokens=f"{HEALTH_TOKEN}=read,drain,override"
    )
    yield url
    process.stop()


@pytest.fixture(scope="module")
def anomaly_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The anomaly service with token reads; its Prometheus does not exist (it keeps serving, and says
    the source is down)."""
    folder = tmp_path_factory.mktemp("anomaly-security")
    port = free_port()
    command = [
        sys.executable, "-m", "fleetsight.cli", "anomaly", "serve",
        "--prometheus-url", f"http://127.0.0.1:{free_port()}", "--listen", f"127.0.0.1:{port}",
        "--token-reads", "--interval", "5",
    ]  # fmt: skip
    env = {**os.environ, "FLEETSIGHT_ANOMALY_TOKENS": f"{ANOMALY_TOKEN}=read"}
    process = Process("anomaly", command, folder / "anomaly.log", env)
    url = f"http://127.0.0.1:{port}"
    process.wait_ready(f"{url}/healthz")
    yield url
    process.stop()


# ---------------------------------------------------------------------------------------- auth
def test_anomaly_reads_need_the_token_when_configured(anomaly_url: str) -> None:
    assert httpx.get(f"{anomaly_url}/v1/stragglers").status_code == 401
    wrong = httpx.get(f"{anomaly_url}/v1/stragglers", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "nope" not in wrong.text
    good = httpx.get(f"{anomaly_url}/v1/stragglers", headers={"Authorization": f"Bearer {ANOMALY_TOKEN}"})
    assert good.status_code == 200 and good.json()["stragglers"] == []
    assert httpx.get(f"{anomaly_url}/healthz").status_code == 200  # the probe stays open


def test_every_write_route_refuses_a_caller_without_a_token(health_url: str) -> None:
    """Every route that changes state (its summary names its scope: drain or override) answers 401 to
    a caller without a token; a POST that only reads (the prolog's preflight) stays open."""
    spec = httpx.get(f"{health_url}/openapi.json").json()
    writes = [
        (method.upper(), path.replace("{node}", "n0001"))
        for path, operations in spec["paths"].items()
        for method, operation in operations.items()
        if method.upper() in WRITE_METHODS and "(scope: " in operation.get("summary", "")
    ]
    assert len(writes) >= 4 and ("POST", "/v1/preflight") not in writes, writes
    for method, path in writes:
        response = httpx.request(method, f"{health_url}{path}", json={"reason": "x"})
        assert response.status_code == 401, (method, path, response.text)


@pytest.mark.parametrize("url_fixture", ["health_url", "anomaly_url"])
def test_a_huge_body_is_refused_before_it_is_read(url_fixture: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue(url_fixture)
    headers = {"Authorization": f"Bearer {HEALTH_TOKEN}", "Content-Type": "application/json"}
    big = b'{"reason": "' + b"x" * (256 * 1024) + b'"}'
    response = httpx.post(f"{url}/v1/nodes/n0001/drain", content=big, headers=headers)
    assert response.status_code == 413, response.text
    if url_fixture == "anomaly_url":
        return  # no route of it reads a body: a streamed one is answered (404) without being read

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit counts the streamed bytes
        yield big[:1000]
        yield big[1000:]

    streamed = httpx.post(f"{url}/v1/nodes/n0001/drain", content=chunks(), headers=headers)
    assert streamed.status_code == 413, streamed.text


# ---------------------------------------------------------------------------------------- fuzz
def test_health_api_fuzzed_from_its_schema(health_url: str) -> None:
    report = fuzz(f"{health_url}/openapi.json", {"Authorization": f"Bearer {HEALTH_TOKEN}"}, FUZZ_EXAMPLES)
    print(report.line("health"))
    assert report.requests >= 10 * FUZZ_EXAMPLES // 2
    assert report.server_errors == 0 and report.schema_violations == 0, "\n".join(report.failures)


def test_anomaly_api_fuzzed_from_its_schema(anomaly_url: str) -> None:
    report = fuzz(f"{anomaly_url}/openapi.json", {"Authorization": f"Bearer {ANOMALY_TOKEN}"}, FUZZ_EXAMPLES)
    print(report.line("anomaly"))
    assert report.requests >= FUZZ_EXAMPLES
    assert report.server_errors == 0 and report.schema_violations == 0, "\n".join(report.failures)


def test_fuzzing_can_fail(tmp_path: Path) -> None:
    """The fuzz catches a server error: a route that answers 500 is counted and named."""
    app = FastAPI()

    @app.get("/v1/broken/{n}")
    def broken(n: int) -> JSONResponse:
        return JSONResponse({"n": n}, status_code=500)  # what an unhandled error answers

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, timeout=20, what="the broken app")
        report = fuzz(f"http://127.0.0.1:{port}/openapi.json", {}, 5)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert report.requests >= 1 and report.server_errors == report.requests
    assert "/v1/broken/" in report.failures[0]
