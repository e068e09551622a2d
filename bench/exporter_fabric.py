"""Benchmark: the fabric exporter on a 20,000-port fabric.

A real HTTP server plays UFM (``/ufmRest/resources/ports``, ``/systems``, ``/app/events``, and UFM
Telemetry's ``/csv/metrics``) for 2,500 hosts x 4 HCA ports and their leaf ports (20,000 ports). The
exporter's sources gather behind its cached runner (fetch, parse, build the families, render with the
shared renderer, gzip) in the background; a scrape sends the rendered bytes.

    .venv/bin/python bench/exporter_fabric.py [--hosts 2500] [--scrapes 10]

Target (docs/exporters.md): a scrape of a 20,000-port fabric takes under 2 s.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests" / "exporters"), str(REPO / "tests")]
from exporter_helpers import JsonServer  # noqa: E402

from exporters.fabric import FabricExporter  # noqa: E402
from exporters.serving import serve  # noqa: E402
from support import free_port  # noqa: E402

PORTS_PER_HOST = 4
LEAF_PORTS = 64


def fabric(hosts: int) -> dict[str, object]:
    ports, systems, rows = [], [], []
    header = (
        "timestamp,source_id,tag,node_guid,port_guid,port_num,PortXmitDataExtended,PortRcvDataExtended,"
        "PortXmitPktsExtended,PortRcvPktsExtended,SymbolErrorCounterExtended,LinkDownedCounterExtended,"
        "LinkErrorRecoveryCounterExtended,PortRcvErrorsExtended,PortXmitDiscardsExtended,PortXmitWaitExtended"
    )
    rows.append(header)
    for h in range(hosts):
        node = f"n{h + 1:05d}"
        systems.append({"system_name": node, "type": "host", "severity": "Info", "state": "active"})
        for p in range(PORTS_PER_HOST):
            index = h * PORTS_PER_HOST + p
            guid, leaf_guid = f"b8cef603{index:08x}", f"fc6a1c03{index // LEAF_PORTS:08x}"
            leaf, leaf_port = f"leaf-{index // LEAF_PORTS:04d}", index % LEAF_PORTS + 1
            common = {
                "physical_state": "Link Up",
                "logical_state": "Active",
                "active_speed": "NDR",
                "active_width": "4x",
                "severity": "Info",
                "mtu": 4096,
            }
            ports.append(
                {
                    **common,
                    "name": f"{guid}_1",
                    "guid": guid,
                    "number": 1,
                    "dname": f"mlx5_{p}/1",
                    "description": "Computer IB Port",
                    "node_description": f"{node} mlx5_{p}",
                    "system_name": node,
                    "systemID": guid,
                    "peer": f"{leaf_guid}_{leaf_port}",
                    "peer_node_name": leaf,
                    "peer_port_dname": str(leaf_port),
                }
            )
            ports.append(
                {
                    **common,
                    "name": f"{leaf_guid}_{leaf_port}",
                    "guid": leaf_guid,
                    "number": leaf_port,
                    "dname": str(leaf_port),
                    "description": "Switch IB Port",
                    "node_description": leaf,
                    "system_name": leaf,
                    "systemID": leaf_guid,
                    "peer": f"{guid}_1",
                    "peer_node_name": node,
                    "peer_port_dname": f"mlx5_{p}/1",
                }
            )
            rows.append(
                f"1795255200000000,ufm,0,0x{guid},0x{guid},1,{index * 1000},{index * 999},{index},{index},"
                "0,0,0,0,0,12"
            )
    for leaf in range(hosts * PORTS_PER_HOST // LEAF_PORTS + 1):
        systems.append(
            {
                "system_name": f"leaf-{leaf:04d}",
                "type": "switch",
                "model": "MQM9790",
                "severity": "Info",
                "state": "active",
            }
        )
    events = [
        {"id": i, "severity": "Info", "category": "Fabric Notification", "name": "Port Up"}
        for i in range(500)
    ]
    return {
        "/ufmRest/resources/ports": ports,
        "/ufmRest/resources/systems": systems,
        "/ufmRest/app/events": events,
        "/csv/metrics": "\n".join(rows) + "\n",
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, default=2500)
    parser.add_argument("--scrapes", type=int, default=10)
    args = parser.parse_args()
    routes = fabric(args.hosts)
    ufm = JsonServer(routes, prefix="/ufm")
    exporter = FabricExporter(
        ufm_url=f"{ufm.url}/ufm", telemetry_url=f"{ufm.url}/ufm/csv/metrics", timeout_s=60
    )
    port = free_port()
    server = serve(f"127.0.0.1:{port}", exporter.page)
    try:
        refreshes = []
        for _ in range(3):
            cpu, wall = time.process_time(), time.perf_counter()
            exporter.refresh()
            refreshes.append((time.perf_counter() - wall, time.process_time() - cpu))
        url = f"http://127.0.0.1:{port}/metrics"
        plain, gzipped = [], []
        for _ in range(args.scrapes):
            started = time.perf_counter()
            body = httpx.get(url, timeout=60).content
            plain.append(time.perf_counter() - started)
            started = time.perf_counter()
            httpx.get(url, headers={"Accept-Encoding": "gzip"}, timeout=60)
            gzipped.append(time.perf_counter() - started)
        ports = len(routes["/ufmRest/resources/ports"])  # type: ignore[arg-type]
        lines = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
        print(f"\nfabric: {ports} ports ({args.hosts} hosts x {PORTS_PER_HOST} HCA ports + their leaf ports)")
        print(
            f"series per scrape: {lines}; exposition {len(body) / 1e6:.1f} MB, gzip "
            f"{len(exporter.snapshot.gzipped) / 1e6:.1f} MB"
        )
        wall = sorted(r[0] for r in refreshes)[1]
        cpu = sorted(r[1] for r in refreshes)[1]
        print(
            f"background refresh (fetch + parse + render + gzip): {wall:.2f} s wall, {cpu:.2f} s CPU"
            " (median of 3; the UFM stand-in shares this process)"
        )
        print(
            f"scrape, plain: median {sorted(plain)[len(plain) // 2] * 1000:.0f} ms, "
            f"max {max(plain) * 1000:.0f} ms"
        )
        print(
            f"scrape, gzip:  median {sorted(gzipped)[len(gzipped) // 2] * 1000:.0f} ms, "
            f"max {max(gzipped) * 1000:.0f} ms   (target: under 2 s)"
        )
        print(
            f"peak RSS of this process (exporter + UFM stand-in): "
            f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB"
        )
    finally:
        server.shutdown()
        exporter.close()
        ufm.close()


if __name__ == "__main__":
    main()
