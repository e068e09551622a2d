"""Latency of the health API under a constant request rate on loopback (open loop: every request has a
scheduled send time and its latency counts from then, so a stalled server cannot hide its queue).

Starts `fleetsight health serve` with N static nodes (a share of them unhealthy through a real
Alertmanager when one is installed), then sends a mix the schedulers and dashboards make:
GET /v1/nodes/{node} 60%, POST /v1/preflight (8 nodes) 30%, GET /v1/drain-list 5%, GET /v1/nodes?state=
unhealthy 5%. Prints p50/p90/p99/max per endpoint and overall, and the rate achieved.

    .venv/bin/python bench/health_api_load.py [--rate 1000] [--seconds 20] [--nodes 1000] [--connections 32]

The load generator is asyncio over raw keep-alive HTTP/1.1 connections (no client library in the hot
path), in this process; on a 2-core machine it competes with the server for CPU, so the figures are an
upper bound of what the service costs.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from fleetsight.procs import free_loopback_port
from health.component import serve_command

REPO = Path(__file__).resolve().parents[1]


def wait_http(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not answer in {timeout:.0f}s")


def start_alertmanager(folder: Path) -> tuple[subprocess.Popen[bytes] | None, str | None]:
    binary = shutil.which("prometheus-alertmanager")
    if binary is None:
        return None, None
    (folder / "am.yml").write_text(yaml.safe_dump({"route": {"receiver": "n"}, "receivers": [{"name": "n"}]}))
    port = free_loopback_port()
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={folder / 'am.yml'}",
            f"--storage.path={folder / 'am'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/-/ready")
    return process, url


def fire_alerts(am_url: str, nodes: list[str]) -> None:
    now = dt.datetime.now(dt.UTC)
    alerts = [
        {
            "labels": {"alertname": "GPUXidUncorrectable", "node": n, "severity": "critical", "gpu": "0"},
            "annotations": {"summary": f"Xid 79 on {n}"},
            "startsAt": now.isoformat(),
            "endsAt": (now + dt.timedelta(hours=1)).isoformat(),
        }
        for n in nodes
    ]
    httpx.post(f"{am_url}/api/v2/alerts", json=alerts, timeout=10).raise_for_status()


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def request(self, raw: bytes) -> int:
        self.writer.write(raw)
        status_line = await self.reader.readline()
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await self.reader.readexactly(length)
        return int(status_line.split()[1])


def build_requests(nodes: list[str], port: int) -> list[tuple[str, bytes]]:
    host = f"Host: 127.0.0.1:{port}\r\n"
    rng = random.Random(7)
    requests = []
    for _ in range(5000):
        draw = rng.random()
        if draw < 0.60:
            requests.append(
                ("GET /v1/nodes/{node}", f"GET /v1/nodes/{rng.choice(nodes)} HTTP/1.1\r\n{host}\r\n".encode())
            )
        elif draw < 0.90:
            body = json.dumps({"nodes": rng.sample(nodes, 8)}).encode()
            head = f"POST /v1/preflight HTTP/1.1\r\n{host}Content-Type: application/json\r\n"
            head += f"Content-Length: {len(body)}\r\n\r\n"
            requests.append(("POST /v1/preflight", head.encode() + body))
        elif draw < 0.95:
            requests.append(("GET /v1/drain-list", f"GET /v1/drain-list HTTP/1.1\r\n{host}\r\n".encode()))
        else:
            raw = f"GET /v1/nodes?state=unhealthy HTTP/1.1\r\n{host}\r\n".encode()
            requests.append(("GET /v1/nodes?state=unhealthy", raw))
    return requests


async def load(port: int, requests: list[tuple[str, bytes]], rate: float, seconds: float, connections: int):  # type: ignore[no-untyped-def]
    pool: asyncio.Queue[Connection] = asyncio.Queue()
    for _ in range(connections):
        pool.put_nowait(Connection(*await asyncio.open_connection("127.0.0.1", port)))
    results: list[tuple[str, float, int]] = []
    start = time.perf_counter() + 0.1

    async def one(index: int) -> None:
        name, raw = requests[index % len(requests)]
        scheduled = start + index / rate
        connection = await pool.get()
        try:
            status = await connection.request(raw)
        finally:
            pool.put_nowait(connection)
        results.append((name, time.perf_counter() - scheduled, status))

    tasks = []
    total = int(rate * seconds)
    for index in range(total):
        delay = start + index / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(index)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    return results, elapsed


def percentiles(values: list[float]) -> str:
    ordered = sorted(values)
    q = statistics.quantiles(ordered, n=100, method="inclusive")
    return (
        f"p50 {q[49] * 1000:6.2f} ms  p90 {q[89] * 1000:6.2f} ms  p99 {q[98] * 1000:6.2f} ms  "
        f"max {ordered[-1] * 1000:7.2f} ms  n={len(ordered)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=1000.0, help="requests per second")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="health-bench-"))
    nodes = [f"n{i:05d}" for i in range(1, args.nodes + 1)]
    (folder / "nodes.txt").write_text("\n".join(nodes))
    am, am_url = start_alertmanager(folder)
    policy = yaml.safe_load((REPO / "health" / "policy.yml").read_text())
    policy["circuit_breaker"].update(max_cluster_fraction=0.05, max_unit_fraction=0.5)
    (folder / "policy.yml").write_text(yaml.safe_dump(policy))
    port = free_loopback_port()
    command = serve_command(
        f"127.0.0.1:{port}",
        folder / "state",
        policy=folder / "policy.yml",
        alertmanagers=[am_url] if am_url else None,
        extra=("--nodes-file", str(folder / "nodes.txt")),
    )
    log = (folder / "server.log").open("wb")
    server = subprocess.Popen(command, cwd=REPO, env=os.environ.copy(), stdout=log, stderr=subprocess.STDOUT)
    try:
        try:
            wait_http(f"http://127.0.0.1:{port}/-/ready")
        except SystemExit:
            print((folder / "server.log").read_text()[-3000:])
            raise
        if am_url:
            fire_alerts(am_url, nodes[:: max(1, len(nodes) // 40)])  # ~2.5% of the fleet unhealthy
            time.sleep(7)  # two refreshes (5 s) so the bench reads a fleet with drains and held nodes
        status = httpx.get(f"http://127.0.0.1:{port}/v1/status").json()["states"]
        print(f"fleet: {args.nodes} nodes, states {status}")
        results, elapsed = asyncio.run(
            load(port, build_requests(nodes, port), args.rate, args.seconds, args.connections)
        )
        errors = sum(1 for _, _, s in results if s != 200)
        print(
            f"offered {args.rate:.0f} req/s for {args.seconds:.0f} s over {args.connections} connections: "
            f"{len(results) / elapsed:.0f} req/s completed, {errors} non-200"
        )
        print(f"{'all':<32} {percentiles([r[1] for r in results])}")
        for name in sorted({r[0] for r in results}):
            print(f"{name:<32} {percentiles([r[1] for r in results if r[0] == name])}")
    finally:
        server.terminate()
        server.wait(timeout=20)
        if am:
            am.terminate()
            am.wait(timeout=20)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
