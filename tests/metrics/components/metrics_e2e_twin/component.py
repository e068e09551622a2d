"""Test-only components (joined through FLEETSIGHT_COMPONENT_PATH by tests/metrics): the twin running
the alert-delivery scenario in real time, and the node agents reading it, each declaring the same
scrape jobs as the stack's own twin and exporter components, so that Prometheus scrapes them exactly as
it scrapes the demo cluster.

The stack's `twin` component always runs the demo scenario; these let the tests choose their faults and
onsets without changing it. They are not started by a plain `fleetsight up` (``default=False``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from exporters.component import node_entries, write_nodes_file
from fleetsight.components import Component, http_ok
from fleetsight.settings import Settings

SCENARIO = Path(__file__).resolve().parents[2] / "alert_faults.yaml"
TWIN = "e2e-twin"
AGENTS = "e2e-agents"


def twin_dir(settings: Settings) -> Path:
    return settings.data_dir(TWIN)


def twin_command(settings: Settings) -> list[str]:
    return [
        sys.executable, "-m", "fleetsight.cli", "twin", "run",
        "--scenario", str(SCENARIO),
        "--out", str(twin_dir(settings)),
        "--serve", "--speed", "realtime",
        "--listen", f"127.0.0.1:{settings.port('e2e_twin')}",
        "--cluster-name", settings.cluster,
    ]  # fmt: skip


def nodes_file(settings: Settings) -> Path:
    return settings.data_dir(AGENTS) / "nodes.json"


def targets_file(settings: Settings) -> Path:
    return settings.data_dir(AGENTS) / "targets.json"


def prepare_agents(settings: Settings) -> None:
    """The agents' node list, built from the twin's output as the stack's exporter component does, and
    their Prometheus targets as production lists them (file_sd), each with the twin's `cluster` label as
    the twin's own dcgm-exporter targets carry it: an alert that joins both sources (GPUFellOffBus)
    must see one cluster, or the pair would route it as two alerts."""
    gpu_maps = settings.data_dir(AGENTS) / "gpus"
    entries = node_entries(twin_dir(settings), settings.url("e2e_twin"), gpu_maps)
    write_nodes_file(nodes_file(settings), entries)
    cluster = json.loads((twin_dir(settings) / "meta.json").read_text())["cluster"]
    address = f"127.0.0.1:{settings.port('e2e_agents')}"
    groups = [
        {
            "targets": [address],
            "labels": {
                "node": e["node"],
                "cluster": cluster,
                "__metrics_path__": f"/nodes/{e['node']}/metrics",
            },
        }
        for e in entries
    ]
    write_nodes_file(targets_file(settings), groups)  # the same atomic JSON write


def agents_command(settings: Settings) -> list[str]:
    return [
        sys.executable, "-m", "fleetsight.cli", "exporter", "node",
        "--nodes-file", str(nodes_file(settings)),
        "--listen", f"127.0.0.1:{settings.port('e2e_agents')}",
        "--state-dir", str(settings.data_dir(AGENTS) / "state"),
        "--bmc-interval", "5",
        "--no-nvml",
    ]  # fmt: skip


def dcgm_job(settings: Settings) -> list[dict[str, Any]]:
    sd = {"url": settings.url("e2e_twin", "/targets/dcgm.json"), "refresh_interval": "5s"}
    return [{"job_name": "dcgm", "http_sd_configs": [sd]}]


def agents_job(settings: Settings) -> list[dict[str, Any]]:
    return [{"job_name": "fleetsight-node", "file_sd_configs": [{"files": [str(targets_file(settings))]}]}]


COMPONENTS = [
    Component(
        name=TWIN,
        description="twin running tests/metrics/alert_faults.yaml in real time",
        command=twin_command,
        ready=lambda s: http_ok(s.url("e2e_twin", "/")),
        urls=lambda s: {"endpoints": s.url("e2e_twin", "/")},
        scrape_configs=dcgm_job,
        default=False,
    ),
    Component(
        name=AGENTS,
        description="node agents of the e2e twin's nodes",
        command=agents_command,
        prepare=prepare_agents,
        ready=lambda s: http_ok(s.url("e2e_agents", "/targets.json")),
        urls=lambda s: {"targets": s.url("e2e_agents", "/targets.json")},
        depends_on=(TWIN,),
        scrape_configs=agents_job,
        default=False,
    ),
]

PORTS = {"e2e_twin": 185, "e2e_agents": 186}
START_PRIORITY = 25
