"""The local stack's metrics configuration, derived from the production files.

Production (docker-compose.yml) mounts metrics/prometheus.yml and rules/ into both Prometheus replicas.
Here the same file is read and only addresses and paths change: loopback ports instead of service
names, the repo's rules/ folder, the twin's and node agents' HTTP service discovery instead of the
operator's file_sd lists, a filesystem bucket under the run folder instead of S3. Every job keeps its
production intervals and relabelling, so what the tests see is what production scrapes.

Before a replica starts, ``promtool check config`` checks the derived file and every rule file it
loads; a mistake stops that component with an error naming the file (nothing runs half-configured).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from fleetsight.components import load_components
from fleetsight.registry import port_offsets
from fleetsight.settings import Settings

from .install import THANOS_BUILD

METRICS_DIR = Path(__file__).resolve().parent
PRODUCTION_CONFIG = METRICS_DIR / "prometheus.yml"
RULES_DIR = METRICS_DIR.parent / "rules"
NODE_EXPORTER = "prometheus-node-exporter"  # Debian's name for node_exporter
# Extra rule files for a test stack (os.pathsep-separated globs), loaded after rules/*.yml.
EXTRA_RULES_ENV = "FLEETSIGHT_EXTRA_RULE_FILES"
# FleetSight's own services (port name -> production job): scraped when the stack runs them, through
# the job their component declares or, if it declares none, at their port.
OWN_SERVICE_JOBS = {"anomaly": "anomaly", "health": "fleetsight-health", "chatbot": "fleetsight-chatbot"}
# Keys of a scrape job that say where its targets are: the only ones the local stack replaces.
ADDRESS_KEYS_SUFFIX = ("_sd_configs", "static_configs")
# Local-only flag: the store looks for new blocks every minute (default 15 min), so that a block a
# sidecar uploads is queryable from the bucket within a test's patience.
STORE_SYNC_INTERVAL = "1m"
PROMTOOL_TIMEOUT_S = 60


class ConfigError(ValueError):
    """A configuration file is wrong; the message names the file and what is wrong."""


# ----------------------------------------------------------------------------------------- names
def prometheus_name(replica: str) -> str:
    return "prometheus" if replica == "A" else f"prometheus-{replica.lower()}"


def prometheus_port_name(replica: str) -> str:
    return "prometheus" if replica == "A" else f"prometheus_{replica.lower()}"


def sidecar_name(replica: str) -> str:
    return "thanos-sidecar" if replica == "A" else f"thanos-sidecar-{replica.lower()}"


def sidecar_port_names(replica: str) -> tuple[str, str]:
    """(http, grpc) port names of the replica's sidecar."""
    stem = "thanos_sidecar" if replica == "A" else f"thanos_sidecar_{replica.lower()}"
    return f"{stem}_http", f"{stem}_grpc"


def prometheus_config_path(settings: Settings, replica: str = "A") -> Path:
    return settings.config_dir(prometheus_name(replica)) / "prometheus.yml"


def alertmanager_targets(settings: Settings) -> list[str]:
    return [f"127.0.0.1:{settings.port(name)}" for name in ("alertmanager", "alertmanager_b")]


# --------------------------------------------------------------------------------- scrape jobs
def started_components(settings: Settings) -> set[str] | None:
    """The components this stack starts (the supervisor's state file lists them), or None when the
    configuration is built outside a stack (then every declared component counts)."""
    try:
        state = json.loads((settings.run_dir / "state.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    names = {component["name"] for component in state.get("components", [])}
    return names or None


def declared_jobs(settings: Settings) -> dict[str, dict[str, Any]]:
    """The scrape jobs that the stack's components declare, by job name; two components declaring
    the same job (say, two twins) have their target sources merged into one job."""
    started = started_components(settings)
    jobs: dict[str, dict[str, Any]] = {}
    for component in load_components().values():
        if started is not None and component.name not in started:
            continue
        for job in component.scrape_configs(settings):
            known = jobs.setdefault(job["job_name"], dict(job))
            if known == job:  # the first declaration, or the same one again
                continue
            for key, value in job.items():
                if key.endswith(ADDRESS_KEYS_SUFFIX):
                    known[key] = [*known.get(key, []), *value]
    return jobs


# Production scrapes the exporters over TLS with basic auth; the local stack's exporters and the twin
# serve plain HTTP on loopback, so these keys stay in production only.
SCRAPE_SECURITY_KEYS = ("scheme", "tls_config", "basic_auth", "authorization")


def without_addresses(job: dict[str, Any]) -> dict[str, Any]:
    return {
        key: value
        for key, value in job.items()
        if not key.endswith(ADDRESS_KEYS_SUFFIX) and key not in SCRAPE_SECURITY_KEYS
    }


def addresses_of(job: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in job.items() if key.endswith(ADDRESS_KEYS_SUFFIX)}


def own_service_target(settings: Settings, job_name: str) -> dict[str, Any] | None:
    """The static target of the FleetSight service whose production job this is, when the stack runs
    it (its port is declared and a component of that name starts), else None."""
    service = next((port for port, job in OWN_SERVICE_JOBS.items() if job == job_name), None)
    started = started_components(settings)
    if service is None or service not in port_offsets():
        return None
    if started is not None and not any(name.startswith(service) for name in started):
        return None
    return {"targets": [f"127.0.0.1:{settings.port(service)}"]}


def started_replicas(settings: Settings) -> list[str]:
    """The Prometheus replicas this stack runs: both unless the state file says otherwise. Scraping a
    peer that `fleetsight up prometheus` never started would fire ExporterDown for it."""
    started = started_components(settings)
    return [r for r in ("A", "B") if started is None or prometheus_name(r) in started]


def local_scrape_configs(settings: Settings, production: list[dict[str, Any]]) -> list[dict[str, Any]]:
    declared = declared_jobs(settings)
    jobs = []
    for job in production:
        name = job["job_name"]
        if name == "prometheus":
            replicas = started_replicas(settings)
            targets = [f"127.0.0.1:{settings.port(prometheus_port_name(r))}" for r in replicas]
            jobs.append({**without_addresses(job), "static_configs": [{"targets": targets}]})
        elif name in declared:
            jobs.append({**without_addresses(job), **addresses_of(declared.pop(name))})
        elif target := own_service_target(settings, name):
            jobs.append({**without_addresses(job), "static_configs": [target]})
    # Jobs that production does not have (a component's own exporter): as the component declares them.
    jobs.extend(declared.values())
    return jobs


def rule_globs() -> list[str]:
    extra = [glob for glob in os.environ.get(EXTRA_RULES_ENV, "").split(os.pathsep) if glob]
    return [str(RULES_DIR / "*.yml"), *extra]


def prometheus_config(settings: Settings, replica: str = "A") -> dict[str, Any]:
    """Production's configuration with loopback addresses and local paths."""
    production = yaml.safe_load(PRODUCTION_CONFIG.read_text())
    global_section = {**production["global"]}
    # production reads both from the environment (--enable-feature=expand-external-labels)
    labels = {**production["global"]["external_labels"], "cluster": settings.cluster, "replica": replica}
    global_section["external_labels"] = labels
    alerting = {
        **production["alerting"],
        "alertmanagers": [{"static_configs": [{"targets": alertmanager_targets(settings)}]}],
    }
    return {
        "global": global_section,
        "rule_files": rule_globs(),
        "alerting": alerting,
        "scrape_configs": local_scrape_configs(settings, production["scrape_configs"]),
    }


def check_prometheus_config(path: Path) -> None:
    """promtool checks the file and every rule file it loads; its own message names the bad file."""
    try:
        result = subprocess.run(
            ["promtool", "check", "config", str(path)],
            capture_output=True,
            text=True,
            timeout=PROMTOOL_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"could not run promtool check config on {path}: {exc}") from exc
    if result.returncode != 0:
        # promtool writes one error line per bad file to stderr, each naming its file; the derived
        # file is named after the production file it comes from.
        derived = f"{path} (derived from {PRODUCTION_CONFIG})"
        problems = [
            line.strip().removeprefix("FAILED:").strip().replace(str(path), derived)
            for line in result.stderr.splitlines()
            if line.strip() not in ("", "FAILED:")
        ]
        raise ConfigError("; ".join(problems) or f"promtool check config {path} failed")


def prepare_prometheus(settings: Settings, replica: str) -> None:
    path = prometheus_config_path(settings, replica)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(prometheus_config(settings, replica), sort_keys=False))
    check_prometheus_config(path)
    settings.data_dir(prometheus_name(replica)).mkdir(parents=True, exist_ok=True)


def validate_prometheus(settings: Settings, replica: str) -> None:
    """The same preparation and checks in a scratch run folder: a pre-flight check that touches none of
    the stack's files (``extra["validate"]`` of the component)."""
    with tempfile.TemporaryDirectory(prefix="fleetsight-check-") as scratch:
        prepare_prometheus(dataclasses.replace(settings, run_dir=Path(scratch)), replica)


def prometheus_command(settings: Settings, replica: str) -> list[str]:
    """The compose service's flags, with local paths and address."""
    return [
        "prometheus",
        f"--config.file={prometheus_config_path(settings, replica)}",
        f"--storage.tsdb.path={settings.data_dir(prometheus_name(replica))}",
        f"--web.listen-address=127.0.0.1:{settings.port(prometheus_port_name(replica))}",
        "--storage.tsdb.retention.time=30d",
        # 2-hour blocks are what a Thanos sidecar uploads; local compaction must stay off.
        "--storage.tsdb.min-block-duration=2h",
        "--storage.tsdb.max-block-duration=2h",
        "--enable-feature=expand-external-labels",
        "--web.enable-lifecycle",
    ]


# ---------------------------------------------------------------------------------------- Thanos
def bucket_dir(settings: Settings) -> Path:
    return settings.data_dir("thanos-bucket")


def objstore_config_path(settings: Settings) -> Path:
    return settings.config_dir("thanos") / "objstore.yml"


def prepare_bucket(settings: Settings) -> None:
    """The local bucket: Thanos's FILESYSTEM object store under the run folder (production: S3)."""
    bucket_dir(settings).mkdir(parents=True, exist_ok=True)
    path = objstore_config_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    config = {"type": "FILESYSTEM", "config": {"directory": str(bucket_dir(settings))}}
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def sidecar_command(settings: Settings, replica: str) -> list[str]:
    http_port, grpc_port = sidecar_port_names(replica)
    return [
        str(THANOS_BUILD.binary(settings)),
        "sidecar",
        f"--tsdb.path={settings.data_dir(prometheus_name(replica))}",
        f"--prometheus.url={settings.url(prometheus_port_name(replica))}",
        f"--objstore.config-file={objstore_config_path(settings)}",
        f"--grpc-address=127.0.0.1:{settings.port(grpc_port)}",
        f"--http-address=127.0.0.1:{settings.port(http_port)}",
    ]


def store_command(settings: Settings) -> list[str]:
    return [
        str(THANOS_BUILD.binary(settings)),
        "store",
        f"--data-dir={settings.data_dir('thanos-store')}",
        f"--objstore.config-file={objstore_config_path(settings)}",
        f"--grpc-address=127.0.0.1:{settings.port('thanos_store_grpc')}",
        f"--http-address=127.0.0.1:{settings.port('thanos_store_http')}",
        f"--sync-block-duration={STORE_SYNC_INTERVAL}",
    ]


def compact_command(settings: Settings) -> list[str]:
    return [
        str(THANOS_BUILD.binary(settings)),
        "compact",
        "--wait",
        f"--data-dir={settings.data_dir('thanos-compact')}",
        f"--objstore.config-file={objstore_config_path(settings)}",
        f"--http-address=127.0.0.1:{settings.port('thanos_compact_http')}",
        # 30 days raw, 90 days at 5-minute resolution, a year at 1 hour (the IBM Vela retention classes).
        "--retention.resolution-raw=30d",
        "--retention.resolution-5m=90d",
        "--retention.resolution-1h=365d",
        "--deduplication.replica-label=replica",
        "--delete-delay=48h",
    ]


def query_command(settings: Settings) -> list[str]:
    endpoints = [sidecar_port_names(r)[1] for r in ("A", "B")] + ["thanos_store_grpc"]
    return [
        str(THANOS_BUILD.binary(settings)),
        "query",
        f"--http-address=127.0.0.1:{settings.port('thanos_query')}",
        f"--grpc-address=127.0.0.1:{settings.port('thanos_query_grpc')}",
        # The HA pair's series differ only by this external label: query shows each series once.
        "--query.replica-label=replica",
        "--query.auto-downsampling",
        *(f"--endpoint=127.0.0.1:{settings.port(name)}" for name in endpoints),
    ]


# --------------------------------------------------------------------------------- node_exporter
def node_exporter_command(settings: Settings) -> list[str]:
    return [
        NODE_EXPORTER,
        f"--web.listen-address=127.0.0.1:{settings.port('node_exporter')}",
        # No textfile collector: its Debian default folder belongs to the host's own node_exporter.
        "--no-collector.textfile",
    ]


def node_exporter_scrape_configs(settings: Settings) -> list[dict[str, Any]]:
    """This host, named as a node (every series carries `node`)."""
    address = f"127.0.0.1:{settings.port('node_exporter')}"
    group = {"targets": [address], "labels": {"node": socket.gethostname()}}
    return [{"job_name": "node", "static_configs": [group]}]
