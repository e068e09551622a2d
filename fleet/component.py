"""The global layer in the local stack: started by `fleetsight up --clusters N` only
(fleetsight/clusters.py), from the run folder above the clusters' own stacks; `fleetsight up` alone keeps
one cluster and none of these (docs/fleet.md)."""

from __future__ import annotations

from pathlib import Path

from fleetsight.components import Component, fleetsight_command, http_ok, missing_binary
from fleetsight.settings import Settings

from . import local

# The layer waits this long for one cluster's health service (its `--timeout`), and the global Query as
# long for one store: a cut-off cluster then costs each global query 5 s, not Thanos's own 15 s or more
# (docs/fleet.md, "What a cut-off cluster costs").
CLUSTER_TIMEOUT = "5s"
# How often the layer asks every cluster (`--poll-interval`): a cluster that goes missing shows within it.
POLL_INTERVAL = "5s"


def thanos(settings: Settings) -> Path:
    """The Thanos binary that setup builds for the metrics component (metrics/install.py)."""
    return settings.bin_dir / "thanos"


def query_command(settings: Settings) -> list[str]:
    return [
        str(thanos(settings)),
        "query",
        f"--http-address=127.0.0.1:{settings.port('fleet_query')}",
        f"--grpc-address=127.0.0.1:{settings.port('fleet_query_grpc')}",
        # Each cluster's pair differs only by `replica`; `cluster` keeps the clusters apart.
        "--query.replica-label=replica",
        "--query.auto-downsampling",
        f"--store.response-timeout={CLUSTER_TIMEOUT}",
        *(f"--endpoint={address}" for address in local.store_endpoints(settings)),
    ]


def query_missing(settings: Settings) -> str | None:
    if not thanos(settings).is_file():
        return f"not installed: {thanos(settings)} (run `fleetsight setup`; it builds Thanos)"
    return None


def api_command(settings: Settings) -> list[str]:
    return fleetsight_command(
        "fleet", "serve",
        "--clusters-file", str(local.clusters_file(settings)),
        "--listen", f"127.0.0.1:{settings.port('fleet_api')}",
        "--thanos-url", settings.url("fleet_query"),
        "--timeout", CLUSTER_TIMEOUT,
        "--poll-interval", POLL_INTERVAL,
    )  # fmt: skip


def prometheus_command(settings: Settings) -> list[str]:
    return [
        "prometheus",
        f"--config.file={local.prometheus_config_path(settings)}",
        f"--storage.tsdb.path={settings.data_dir('fleet-prometheus')}",
        f"--web.listen-address=127.0.0.1:{settings.port('fleet_prometheus')}",
        "--storage.tsdb.retention.time=30d",
    ]


def dashboards_command(settings: Settings) -> list[str]:
    return fleetsight_command(
        "dashboards", "serve",
        "--listen", f"127.0.0.1:{settings.port('fleet_dashboards')}",
        "--prometheus", settings.url("fleet_query"),
        "--fleet-url", settings.url("fleet_api"),
    )  # fmt: skip


COMPONENTS = [
    Component(
        name="fleet-query",
        description="Global Thanos Query: PromQL over every cluster's sidecars and store gateway",
        command=query_command,
        ready=lambda s: http_ok(s.url("fleet_query", "/-/ready")),
        urls=lambda s: {"ui": s.url("fleet_query"), "stores": s.url("fleet_query", "/api/v1/stores")},
        missing=query_missing,
        default=False,
    ),
    Component(
        name="fleet-api",
        description="Global read API: every cluster's health service, each answer naming the missing ones",
        command=api_command,
        prepare=local.prepare_clusters_file,
        ready=lambda s: http_ok(s.url("fleet_api", "/-/ready")),
        urls=lambda s: {
            "clusters": s.url("fleet_api", "/v1/clusters"),
            "metrics": s.url("fleet_api", "/metrics"),
        },
        depends_on=("fleet-query",),
        default=False,
    ),
    Component(
        name="fleet-prometheus",
        description="The global layer's Prometheus: scrapes fleet-api, evaluates rules/fleet.yml",
        command=prometheus_command,
        prepare=local.prepare_prometheus,
        ready=lambda s: http_ok(s.url("fleet_prometheus", "/-/ready")),
        urls=lambda s: {"ui": s.url("fleet_prometheus")},
        missing=lambda s: missing_binary("prometheus", "promtool"),
        depends_on=("fleet-api", "alertmanager"),
        default=False,
    ),
    Component(
        name="fleet-dashboards",
        description="Dashboard viewer on the global Query, with the fleet page (/fleet) across clusters",
        command=dashboards_command,
        ready=lambda s: http_ok(s.url("fleet_dashboards", "/healthz")),
        urls=lambda s: {"fleet": s.url("fleet_dashboards", "/fleet"), "home": s.url("fleet_dashboards", "/")},
        depends_on=("fleet-query", "fleet-api"),
        default=False,
    ),
]
# 160-169 are the health tests' Slurm's; the layer takes the 170s.
PORTS = {
    "fleet_query": 170,
    "fleet_query_grpc": 171,
    "fleet_api": 172,
    "fleet_prometheus": 173,
    "fleet_dashboards": 174,
}
START_PRIORITY = 96
# What `fleetsight up --clusters N` runs from the global run folder (fleetsight/clusters.py): the fleet's
# one Slack stand-in and the layer's own Alertmanager are the stack's own components.
GLOBAL_LAYER = [
    "slack-sink",
    "alertmanager",
    "fleet-query",
    "fleet-api",
    "fleet-prometheus",
    "fleet-dashboards",
]

CLI = {"fleet": (".cli", "the global layer: one read API over every cluster's health service")}
