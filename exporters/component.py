"""The exporters in the local stack: the node agents of every twin node and the fabric exporter.

The node agents run in the agent's multi-node mode (one process serving ``/nodes/<node>/metrics`` for
every node of the twin's output folder), because a process per node does not fit a laptop once the
twin has more than a handful of nodes; Prometheus finds the nodes through the agent's own HTTP service
discovery document (``/targets.json``), so the node list follows the scenario. In production it is one
agent per node (``fleetsight exporter node``), found through file_sd (metrics/prometheus.yml).
"""

from __future__ import annotations

import sys
from typing import Any

from fleetsight.components import Component, http_ok
from fleetsight.settings import Settings


def twin_dir(settings: Settings) -> str:
    """Where the twin component writes its outputs (twin/component.py passes this as --out)."""
    return str(settings.data_dir("twin"))


def node_command(settings: Settings) -> list[str]:
    return [
        sys.executable, "-m", "fleetsight.cli", "exporter", "node",
        "--twin-dir", twin_dir(settings),
        "--twin-url", settings.url("twin"),
        "--listen", f"127.0.0.1:{settings.port('exporter_node')}",
        "--state-dir", str(settings.data_dir("exporter-node") / "state"),
        "--bmc-interval", "15",
        "--no-nvml",
    ]  # fmt: skip


def fabric_command(settings: Settings) -> list[str]:
    return [
        sys.executable, "-m", "fleetsight.cli", "exporter", "fabric",
        "--ufm-url", settings.url("twin", "/ufm"),
        "--ufm-telemetry-url", settings.url("twin", "/ufm/csv/metrics"),
        "--listen", f"127.0.0.1:{settings.port('exporter_fabric')}",
        "--interval", "15",
    ]  # fmt: skip


def node_scrape_configs(settings: Settings) -> list[dict[str, Any]]:
    return [
        {
            "job_name": "fleetsight-node",
            "scrape_interval": "15s",
            "scrape_timeout": "10s",
            "http_sd_configs": [
                {"url": settings.url("exporter_node", "/targets.json"), "refresh_interval": "30s"}
            ],
        }
    ]


def fabric_scrape_configs(settings: Settings) -> list[dict[str, Any]]:
    return [
        {
            "job_name": "fleetsight-fabric",
            "scrape_interval": "15s",
            "scrape_timeout": "10s",
            "static_configs": [{"targets": [f"127.0.0.1:{settings.port('exporter_fabric')}"]}],
        }
    ]


COMPONENTS = [
    Component(
        name="exporter-node",
        description="FleetSight node agents of every twin node (PCIe, IB, Xid, BMC, Lustre, probes)",
        command=node_command,
        ready=lambda s: http_ok(s.url("exporter_node", "/targets.json")),
        urls=lambda s: {
            "nodes": s.url("exporter_node", "/"),
            "targets": s.url("exporter_node", "/targets.json"),
        },
        depends_on=("twin",),
        scrape_configs=node_scrape_configs,
    ),
    Component(
        name="exporter-fabric",
        description="FleetSight fabric exporter: the twin's UFM (ports, switches, events, counters)",
        command=fabric_command,
        ready=lambda s: http_ok(s.url("exporter_fabric", "/metrics")),
        urls=lambda s: {"metrics": s.url("exporter_fabric", "/metrics")},
        depends_on=("twin",),
        scrape_configs=fabric_scrape_configs,
    ),
]
