"""The global layer's configuration in the local stack (`fleetsight up --clusters N`,
fleetsight/clusters.py): its endpoints are every cluster's of the run folder's plan."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from fleetsight.clusters import read_plan
from fleetsight.settings import Settings

PROMTOOL_TIMEOUT_S = 60


def store_endpoints(settings: Settings) -> list[str]:
    """Every cluster's Thanos gRPC endpoints: both sidecars (recent data) and the store gateway (blocks)."""
    ports = ("thanos_sidecar_grpc", "thanos_sidecar_b_grpc", "thanos_store_grpc")
    return [f"127.0.0.1:{c.settings.port(p)}" for c in read_plan(settings) for p in ports]


def clusters_file(settings: Settings) -> Path:
    return settings.config_dir("fleet-api") / "clusters.yml"


def prepare_clusters_file(settings: Settings) -> None:
    """The read API's clusters file (docs/fleet.md): each cluster's health service."""
    entries = [{"name": c.name, "health": c.settings.url("health")} for c in read_plan(settings)]
    path = clusters_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"clusters": entries}, sort_keys=False))


def prometheus_config(settings: Settings) -> dict[str, Any]:
    """The global layer's Prometheus: the layer's own series and its one alert (rules/fleet.yml), sent to
    the layer's Alertmanager (the stack's `alertmanager` component, run from the global run folder)."""
    rules = settings.repo_root / "rules" / "fleet.yml"
    return {
        "global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
        "rule_files": [str(rules)],
        "alerting": {
            "alertmanagers": [
                {"static_configs": [{"targets": [f"127.0.0.1:{settings.port('alertmanager')}"]}]}
            ]
        },
        "scrape_configs": [
            {
                # The series' `cluster` is the cluster watched, not this target's (docs/fleet.md).
                "job_name": "fleet",
                "honor_labels": True,
                "static_configs": [{"targets": [f"127.0.0.1:{settings.port('fleet_api')}"]}],
            }
        ],
    }


def prometheus_config_path(settings: Settings) -> Path:
    return settings.config_dir("fleet-prometheus") / "prometheus.yml"


def prepare_prometheus(settings: Settings) -> None:
    """Write the configuration and have promtool check it and the rule file (its message names them)."""
    path = prometheus_config_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(prometheus_config(settings), sort_keys=False))
    result = subprocess.run(
        ["promtool", "check", "config", str(path)], capture_output=True, text=True, timeout=PROMTOOL_TIMEOUT_S
    )
    if result.returncode != 0:
        raise ValueError(f"promtool check config {path}: {result.stderr.strip() or result.stdout.strip()}")
    settings.data_dir("fleet-prometheus").mkdir(parents=True, exist_ok=True)
