"""The twin in the local stack: the demo scenario (or FLEETSIGHT_TWIN_SCENARIO's) in real time, served on
loopback, with Prometheus scraping every node's dcgm-exporter endpoint (found through the twin's http_sd
target list)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleetsight.components import Component, fleetsight_command, http_ok
from fleetsight.settings import Settings

DEMO_SCENARIO = Path(__file__).resolve().parent / "scenarios" / "demo.yaml"


def scenario_path(settings: Settings) -> Path:
    """The scenario the stack's twin runs (`fleetsight up --scenario`: FLEETSIGHT_TWIN_SCENARIO), else the
    demo; ScenarioError (a ValueError) names a bad one."""
    from .scenario import resolve  # late: the scenario model is heavier than a declaration needs

    return resolve(settings.twin_scenario) if settings.twin_scenario else DEMO_SCENARIO


def describe_scenario(value: str) -> dict[str, str]:
    """What `fleetsight up --scenario` needs of a scenario before anything starts: its file, its cluster's
    name, and how its jobs are scheduled (Kubernetes when dcgm-exporter labels GPUs with their pods)."""
    from .scenario import load, resolve

    path = resolve(value)
    scenario = load(path)
    scheduler = "kubernetes" if scenario.dcgm.labels == "kubernetes" else "slurm"
    return {"path": str(path), "cluster": scenario.cluster.name, "scheduler": scheduler}


def command(settings: Settings) -> list[str]:
    return fleetsight_command(
        "twin",
        "run",
        "--scenario",
        str(scenario_path(settings)),
        "--out",
        str(settings.data_dir("twin")),
        "--serve",
        "--speed",
        "realtime",
        "--listen",
        f"127.0.0.1:{settings.port('twin')}",
        "--cluster-name",
        settings.cluster,
    )


def scrape_configs(settings: Settings) -> list[dict[str, Any]]:
    """One scrape job for all nodes: targets (with node, cluster and __metrics_path__) come from the
    twin's http_sd endpoint, so the node list follows the scenario."""
    return [
        {
            "job_name": "dcgm",
            "scrape_interval": "5s",
            "scrape_timeout": "4s",
            "http_sd_configs": [
                {"url": settings.url("twin", "/targets/dcgm.json"), "refresh_interval": "30s"},
            ],
        }
    ]


COMPONENTS = [
    Component(
        name="twin",
        description="Digital twin: the scenario's dcgm-exporter, Redfish, UFM, Slurm endpoints and files",
        command=command,
        ready=lambda s: http_ok(s.url("twin", "/")),
        urls=lambda s: {
            "endpoints": s.url("twin", "/"),
            "dcgm targets": s.url("twin", "/targets/dcgm.json"),
            "files": str(s.data_dir("twin")),
        },
        scrape_configs=scrape_configs,
        ready_timeout_s=60.0,
    ),
]

PORTS = {"twin": 100}
# How the core reads a scenario for `fleetsight up --scenario` (fleetsight/clusters.py).
SCENARIO_READERS = [describe_scenario]
CLI = {"twin": (".cli", "the digital twin: run a scenario, serve it, check scenario files")}
START_PRIORITY = 20
