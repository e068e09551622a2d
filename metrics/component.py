"""Metrics in the local stack, in production's shape: a Prometheus HA pair (replicas A and B scraping the
same targets), a Thanos sidecar per replica, Thanos store, compactor and query over a filesystem bucket,
and Debian's node_exporter.

Every configuration is derived from the production files (metrics/prometheus.yml, rules/), with only
addresses and paths swapped (metrics/local.py), and is checked with promtool before anything starts.
"""

from __future__ import annotations

from fleetsight.components import Component, http_ok, missing_binary
from fleetsight.settings import Settings

from . import local
from .install import INSTALL_STEPS as THANOS_INSTALL_STEPS
from .install import THANOS_BUILD

REPLICAS = ("A", "B")


def missing_thanos(settings: Settings) -> str | None:
    if not THANOS_BUILD.binary(settings).is_file():
        return f"not installed: {THANOS_BUILD.binary(settings)} (run `fleetsight setup`; it builds Thanos)"
    return None


def prometheus_component(replica: str) -> Component:
    name = local.prometheus_name(replica)
    port = local.prometheus_port_name(replica)
    return Component(
        name=name,
        description=f"Prometheus replica {replica}: scrapes all targets, evaluates rules/, alerts both AMs",
        command=lambda s: local.prometheus_command(s, replica),
        prepare=lambda s: local.prepare_prometheus(s, replica),
        ready=lambda s: http_ok(s.url(port, "/-/ready")),
        urls=lambda s: {"ui": s.url(port)},
        missing=lambda s: missing_binary("prometheus", "promtool"),
        depends_on=("alertmanager", "alertmanager-b"),
        extra={"validate": lambda s: local.validate_prometheus(s, replica)},
    )


def sidecar_component(replica: str) -> Component:
    http_port, _ = local.sidecar_port_names(replica)
    return Component(
        name=local.sidecar_name(replica),
        description=f"Thanos sidecar of replica {replica}: serves its TSDB to query, uploads 2h blocks",
        command=lambda s: local.sidecar_command(s, replica),
        prepare=local.prepare_bucket,
        ready=lambda s: http_ok(s.url(http_port, "/-/ready")),
        urls=lambda s: {"status": s.url(http_port, "/metrics")},
        missing=missing_thanos,
        depends_on=(local.prometheus_name(replica),),
    )


COMPONENTS = [
    Component(
        name="node-exporter",
        description="node_exporter (Debian's prometheus-node-exporter): this host's generic metrics",
        command=local.node_exporter_command,
        ready=lambda s: http_ok(s.url("node_exporter", "/metrics"), timeout=5),
        urls=lambda s: {"metrics": s.url("node_exporter", "/metrics")},
        missing=lambda s: missing_binary(local.NODE_EXPORTER),
        scrape_configs=local.node_exporter_scrape_configs,
    ),
    *(prometheus_component(replica) for replica in REPLICAS),
    *(sidecar_component(replica) for replica in REPLICAS),
    Component(
        name="thanos-store",
        description="Thanos store: serves the blocks in the bucket (history beyond the replicas' TSDBs)",
        command=local.store_command,
        prepare=local.prepare_bucket,
        ready=lambda s: http_ok(s.url("thanos_store_http", "/-/ready")),
        urls=lambda s: {"status": s.url("thanos_store_http", "/metrics")},
        missing=missing_thanos,
        ready_timeout_s=120.0,
    ),
    Component(
        name="thanos-compact",
        description="Thanos compactor: compacts, downsamples, applies retention (30d raw, 90d 5m, 365d 1h)",
        command=local.compact_command,
        prepare=local.prepare_bucket,
        ready=lambda s: http_ok(s.url("thanos_compact_http", "/-/ready")),
        urls=lambda s: {"status": s.url("thanos_compact_http", "/metrics")},
        missing=missing_thanos,
    ),
    Component(
        name="thanos-query",
        description="Thanos query: one PromQL endpoint over both replicas and the bucket, deduplicated",
        command=local.query_command,
        ready=lambda s: http_ok(s.url("thanos_query", "/-/ready")),
        urls=lambda s: {"ui": s.url("thanos_query")},
        missing=missing_thanos,
        depends_on=("thanos-sidecar", "thanos-sidecar-b", "thanos-store"),
    ),
]

PORTS = {
    "prometheus": 90,
    "prometheus_b": 91,
    "thanos_query": 110,
    "thanos_query_grpc": 111,
    "thanos_sidecar_http": 112,
    "thanos_sidecar_grpc": 113,
    "thanos_sidecar_b_http": 114,
    "thanos_sidecar_b_grpc": 115,
    "thanos_store_http": 116,
    "thanos_store_grpc": 117,
    "thanos_compact_http": 118,
    "node_exporter": 150,
}
# Last: the targets Prometheus discovers over HTTP (the twin's, the exporters') answer at its first
# service-discovery refresh.
START_PRIORITY = 90
INSTALL_STEPS = THANOS_INSTALL_STEPS


# Replica A's configuration, under the names that the config checks (tests/test_configs.py) import.
config_path = local.prometheus_config_path
local_config = local.prometheus_config


def prepare(settings: Settings) -> None:
    local.prepare_prometheus(settings, "A")
