"""The exporters in the local stack: node agents for every twin node, and the fabric exporter.

The node agent knows nothing of the twin. One agent process serves every twin node
(``--nodes-file``: ``/nodes/<node>/metrics`` each, and ``/targets.json``, which Prometheus reads through
``http_sd_configs``), because a process per node does not fit a laptop once the twin has more than a
handful of nodes. Building that list from the twin's output is this runner's business: ``prepare``
writes it before each start, from the sources each node lists in the twin's meta.json (a file format,
documented in docs/twin.md; no twin code is loaded). In
production it is one agent per node (``fleetsight exporter node``), found through file_sd
(metrics/prometheus.yml).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fleetsight.components import Component, fleetsight_command, http_ok
from fleetsight.settings import Settings


def twin_dir(settings: Settings) -> Path:
    """Where the twin component writes its outputs (twin/component.py passes this as --out)."""
    return settings.data_dir("twin")


def nodes_file(settings: Settings) -> Path:
    return settings.data_dir("exporter-node") / "nodes.json"


def read_meta(out: Path) -> dict[str, Any]:
    """The twin's meta.json (docs/twin.md, "Outputs"), or {} while it is not written yet."""
    try:
        meta = json.loads((out / "meta.json").read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def node_entries(out: Path, twin_url: str, gpu_maps: Path) -> list[dict[str, Any]]:
    """One nodes-file entry per node of the twin's output folder ``out``, in the agent's own option
    names, from the sources each node lists in the twin's meta.json; each node's GPU map is written
    under ``gpu_maps``."""
    entries = []
    meta = read_meta(out)
    for node in meta.get("nodes", []):
        sources = node.get("sources") if isinstance(node, dict) else None
        if not isinstance(sources, dict):
            continue  # a meta.json of an older twin: no sources listed
        entry: dict[str, Any] = {
            "node": node["name"],
            "sysfs_root": str(out / sources["sysfs_root"]),
            "procfs_root": str(out / sources["procfs_root"]),
            "kmsg_file": str(out / sources["kernel_log"]),
            "kernel_log_format": sources["kernel_log_format"],
            "redfish_url": twin_url.rstrip("/") + sources["bmc_path"],
            "pcie_bandwidth_file": str(out / sources["pcie_bandwidth_file"]),
            "pcie_probe": "file",
        }
        # the labels the twin's dcgm targets carry too, as a site's service discovery labels every
        # per-node job alike: rules join the two on (cluster, node) (NodeDown: every exporter silent)
        cluster = meta.get("cluster")
        entry["target_labels"] = {"cluster": cluster} if isinstance(cluster, str) and cluster else {}
        if "agent_down_file" in sources:  # the twin plays a crashed host or a silent agent with it
            entry["unreachable_file"] = str(out / sources["agent_down_file"])
        gpus = [{k: gpu.get(k) for k in ("gpu", "pci_bdf", "uuid")} for gpu in node.get("gpus", [])]
        if gpus:
            # The twin's GPUs by PCI address, so that Xids name them from the first scrape on.
            gpu_maps.mkdir(parents=True, exist_ok=True)
            (gpu_maps / f"{node['name']}.json").write_text(json.dumps(gpus))
            entry["gpu_map"] = str(gpu_maps / f"{node['name']}.json")
        entries.append(entry)
    return entries


def write_nodes_file(path: Path, entries: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(entries, indent=1) + "\n")
    tmp.replace(path)  # the agent re-reads the file when it changes: never let it see half of one


def prepare_nodes_file(settings: Settings) -> None:
    gpu_maps = settings.data_dir("exporter-node") / "gpus"
    write_nodes_file(nodes_file(settings), node_entries(twin_dir(settings), settings.url("twin"), gpu_maps))


def node_command(settings: Settings) -> list[str]:
    return [
        *fleetsight_command("exporter", "node"),
        "--nodes-file", str(nodes_file(settings)),
        "--listen", f"127.0.0.1:{settings.port('exporter_node')}",
        "--state-dir", str(settings.data_dir("exporter-node") / "state"),
        "--bmc-interval", "15",
        "--no-nvml",
    ]  # fmt: skip


def fabric_command(settings: Settings) -> list[str]:
    return [
        *fleetsight_command("exporter", "fabric"),
        "--ufm-url", settings.url("twin", "/ufm"),
        "--ufm-telemetry-url", settings.url("twin", "/ufm/csv/metrics"),
        "--listen", f"127.0.0.1:{settings.port('exporter_fabric')}",
        "--interval", "15",
    ]  # fmt: skip


def cluster_label(settings: Settings) -> list[dict[str, Any]]:
    """The twin's cluster name on every series, as its dcgm-exporter targets carry it: without it one
    fault's alerts split in two (one per `cluster` value) and inhibitions that match on it fail."""
    cluster = read_meta(twin_dir(settings)).get("cluster")
    return [{"target_label": "cluster", "replacement": str(cluster)}] if cluster else []


def node_scrape_configs(settings: Settings) -> list[dict[str, Any]]:
    return [
        {
            "job_name": "fleetsight-node",
            "scrape_interval": "15s",
            "scrape_timeout": "10s",
            "http_sd_configs": [
                {"url": settings.url("exporter_node", "/targets.json"), "refresh_interval": "30s"}
            ],
            "relabel_configs": cluster_label(settings),
        }
    ]


def fabric_scrape_configs(settings: Settings) -> list[dict[str, Any]]:
    return [
        {
            "job_name": "fleetsight-fabric",
            "scrape_interval": "15s",
            "scrape_timeout": "10s",
            "static_configs": [{"targets": [f"127.0.0.1:{settings.port('exporter_fabric')}"]}],
            "relabel_configs": cluster_label(settings),
        }
    ]


COMPONENTS = [
    Component(
        name="exporter-node",
        description="FleetSight node agents of every twin node (PCIe, IB, Xid, BMC, Lustre, probes)",
        command=node_command,
        prepare=prepare_nodes_file,
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

# exporter_node: one port; the agent serves every twin node under /nodes/<node>/metrics and lists them in
# /targets.json (Prometheus http_sd).
PORTS = {"exporter_fabric": 99, "exporter_node": 200}
CLI = {"exporter": (".cli", "the node agent and the fabric exporter")}
START_PRIORITY = 30
