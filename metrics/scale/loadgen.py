"""The fleet-scale load source: N nodes, each its own scrape target on its own loopback address,
serving what the twin's exporters served for a node of the same kind (saved by evaluation/scale_capture.py).

Node i gets 127.16.0.0 + i + 1 (127.0.0.0/8 is all loopback on Linux: no set-up, no root needed) and
answers on one port, one path per exporter:

    /dcgm          dcgm-exporter (8 GPUs; ``Hostname`` and ``hpc_job`` in the body, as dcgm-exporter has)
    /node-agent    the FleetSight node agent (``node`` in the body, as the agent writes it)
    /fabric        that node's share of the fabric exporter's series (its HCA and leaf ports)
    /node-exporter node_exporter

Node i replays template node i mod 12 of the capture (so a twelfth of the fleet carries each of the
scenario's faults), renamed, in jobs of 16 nodes. Values change every scrape: each template is
pre-rendered in a few jittered variants (gauges +-1 %, counters rising), and a scrape takes the next
one, so the source costs one bytes.replace per scrape and stays far below Prometheus's own CPU.

Targets reach Prometheus through file_sd (``write_file_sd``), with the stack's labels node, cluster
and rack, under the production job names (dcgm, fleetsight-node, fleetsight-fabric, node), so the
rules in rules/*.yml apply unchanged.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import random
import re
import resource
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metrics.local import without_addresses

from .capture import Capture

FIRST_ADDRESS = ipaddress.IPv4Address("127.16.0.1")
VARIANTS = 6
JOB_NODES = 16  # nodes per scheduler job
RACK_NODES = 32  # nodes per rack (4 racks of 8 nodes... a scalable unit is 32 nodes in the twin's SKU)
PATHS = {
    "/dcgm": "dcgm",
    "/node-agent": "fleetsight-node",
    "/fabric": "fleetsight-fabric",
    "/node-exporter": "node",
}
NODE = b"__NODE__"
JOB = b"__JOB__"
SAMPLE = re.compile(r"^(?P<series>[^#\s][^ ]*(?:\{.*\})?) (?P<value>\S+)$")


def address(index: int) -> str:
    return str(FIRST_ADDRESS + index)


def node_name(index: int) -> str:
    return f"n{index + 1:05d}"


def rack_name(index: int) -> str:
    return f"r{index // RACK_NODES + 1:03d}"


def job_id(index: int) -> str:
    return str(7000 + index // JOB_NODES)


def lines_of(text: str, node: str | None) -> list[str]:
    """Comment lines, and the samples of ``node`` (every sample when node is None)."""
    marks = (f'node="{node}"', f'Hostname="{node}"')
    return [
        line
        for line in text.splitlines()
        if line.startswith("#") or (line.strip() and (node is None or any(m in line for m in marks)))
    ]


def jitter(lines: list[str], variant: int, rng: random.Random) -> str:
    """One variant of an exposition: counters rise with the variant, gauges move by about 1 %,
    0/1 states and integers that name a state stay as they are."""
    counters: set[str] = set()
    out = []
    for line in lines:
        if line.startswith("# TYPE") and line.split()[-1] == "counter":
            counters.add(line.split()[2])
        match = SAMPLE.match(line)
        if not match or line.startswith("#"):
            out.append(line)
            continue
        name = match["series"].split("{", 1)[0]
        try:
            value = float(match["value"])
        except ValueError:
            out.append(line)
            continue
        if name.endswith("_total") or name in counters:
            value += variant * max(1.0, abs(value) * 1e-4)
        elif value not in (0.0, 1.0) and not value.is_integer():
            value *= 1 + rng.gauss(0, 0.01)
        out.append(f"{match['series']} {value!r}")
    return "\n".join(out) + "\n"


@dataclass
class Templates:
    """Per exporter, per template node: VARIANTS pre-rendered bodies with placeholders."""

    bodies: dict[str, list[list[bytes]]]

    @classmethod
    def from_capture(cls, capture: Capture, seed: int = 11) -> Templates:
        rng = random.Random(seed)
        bodies: dict[str, list[list[bytes]]] = {name: [] for name in PATHS.values()}
        for node in capture.nodes:
            sources = {
                "dcgm": lines_of(capture.dcgm[node], node),
                "fleetsight-node": lines_of(capture.node_agent, node),
                "fleetsight-fabric": lines_of(capture.fabric, node),
                "node": lines_of(capture.node_exporter, None),
            }
            for name, lines in sources.items():
                bodies[name].append([placeholders(jitter(lines, v, rng), node) for v in range(VARIANTS)])
        return cls(bodies)


def placeholders(text: str, node: str) -> bytes:
    text = text.replace(f'"{node}"', '"__NODE__"')
    return re.sub(r'hpc_job="\d+"', 'hpc_job="__JOB__"', text).encode()


class NodeProtocol(asyncio.Protocol):
    """A minimal HTTP/1.1 server: GET with keep-alive, one exposition per request."""

    def __init__(self, source: LoadSource, index: int) -> None:
        self.source, self.index, self.buffer = source, index, b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer and self.transport is not None:
            head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
            parts = head.split(b"\r\n", 1)[0].split()
            path = parts[1].decode() if len(parts) > 1 else "/"
            body = self.source.body(self.index, path)
            status = b"200 OK" if body is not None else b"404 Not Found"
            body = body if body is not None else b"not found\n"
            self.transport.write(
                b"HTTP/1.1 " + status + b"\r\nContent-Type: text/plain; version=0.0.4\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )


class LoadSource:
    def __init__(self, templates: Templates, nodes: int) -> None:
        self.templates, self.nodes = templates, nodes
        self.scrapes = [0] * nodes
        self.requests = 0
        self.bytes = 0

    def body(self, index: int, path: str) -> bytes | None:
        exporter = PATHS.get(path.split("?", 1)[0])
        if exporter is None:
            return None
        variants = self.templates.bodies[exporter]
        self.scrapes[index] += 1
        variant = variants[index % len(variants)][self.scrapes[index] % VARIANTS]
        body = variant.replace(NODE, node_name(index).encode()).replace(JOB, job_id(index).encode())
        self.requests += 1
        self.bytes += len(body)
        return body

    async def serve(self, port: int) -> list[asyncio.AbstractServer]:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * self.nodes + 1024)), hard))
        loop = asyncio.get_running_loop()
        return [
            await loop.create_server(lambda i=i: NodeProtocol(self, i), address(i), port, reuse_address=True)
            for i in range(self.nodes)
        ]


def file_sd_groups(nodes: int, port: int, cluster: str, exporter_path: str) -> list[dict]:
    return [
        {
            "targets": [f"{address(i)}:{port}"],
            "labels": {
                "__metrics_path__": exporter_path,
                "node": node_name(i),
                "cluster": cluster,
                "rack": rack_name(i),
            },
        }
        for i in range(nodes)
    ]


def write_file_sd(folder: Path, nodes: int, port: int, cluster: str = "fleet-scale") -> dict[str, Path]:
    """One targets file per production job (dcgm, fleetsight-node, fleetsight-fabric, node)."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for path, job in PATHS.items():
        target = folder / f"{job}.json"
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(file_sd_groups(nodes, port, cluster, path)))
        tmp.replace(target)  # Prometheus re-reads the file: never let it see half of one
        files[job] = target
    return files


def load_source_job(job: dict[str, Any], sd_dir: Path) -> dict[str, Any]:
    """A production scrape job (metrics/prometheus.yml) pointed at the load source: its intervals and
    relabelling kept, its targets from the file ``write_file_sd`` writes, and, as on the local stack,
    no TLS or basic auth (the load source serves plain HTTP on loopback)."""
    job = without_addresses(job)
    job["file_sd_configs"] = [{"files": [str(sd_dir / f"{job['job_name']}.json")]}]
    if job["job_name"] == "dcgm":  # the twin-address rewrite is for compose only
        job["relabel_configs"] = [r for r in job.get("relabel_configs", []) if "twin" not in str(r)]
    return job


async def run(capture_dir: Path, nodes: int, port: int, sd_dir: Path | None) -> None:
    source = LoadSource(Templates.from_capture(Capture.load(capture_dir)), nodes)
    servers = await source.serve(port)
    if sd_dir is not None:
        write_file_sd(sd_dir, nodes, port)
    print(f"loadgen: {nodes} nodes on {address(0)}..{address(nodes - 1)}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for server in servers:
        server.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Serve N nodes' exporters (dcgm, node agent, fabric share, node_exporter), each node "
        "on its own loopback address, from a capture of the twin's exporters.",
        epilog="Example: python -m metrics.scale.loadgen --capture /tmp/cap --nodes 256 --port 9400 "
        "--file-sd /tmp/sd   (capture first: python -m evaluation.scale_capture /tmp/cap)",
    )
    parser.add_argument(
        "--capture", type=Path, required=True, help="folder written by evaluation.scale_capture"
    )
    parser.add_argument("--nodes", type=int, required=True, help="how many nodes to serve")
    parser.add_argument("--port", type=int, required=True, help="the port every node address listens on")
    parser.add_argument("--file-sd", type=Path, help="write Prometheus file_sd target files here")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.nodes > 60000:
        parser.error("--nodes must be between 1 and 60000")
    if not (args.capture / "nodes.json").exists():
        parser.error(
            f"{args.capture} holds no capture (run python -m evaluation.scale_capture {args.capture})"
        )
    asyncio.run(run(args.capture, args.nodes, args.port, args.file_sd))


if __name__ == "__main__":
    main()
