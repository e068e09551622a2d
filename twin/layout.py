"""The twin's output layout, defined once: where each node's files lie under a run's output folder
(``OUT``, e.g. ``run/data/twin``), and where its BMC answers on the twin's HTTP server.

The twin's writers lay the files out with these functions, and whoever reads them (the stack runner
building the node agents' nodes file, tests) finds them with the same functions. Pure: paths and
names only, no numpy and no other twin module, so a reader imports it without the simulator.

    OUT/meta.json                                   the run: nodes (name, GPUs...), jobs, start
    OUT/nodes/<node>/sys/...                        sysfs: PCI devices, InfiniBand ports, Lustre
    OUT/nodes/<node>/proc/...                       procfs: Lustre client stats, boot id
    OUT/nodes/<node>/var/log/kern.log               the kernel log (syslog format)
    OUT/nodes/<node>/var/log/jobs/<job>/            the job's per-rank logs
    OUT/nodes/<node>/var/log/fabricmanager.log      NVIDIA Fabric Manager's log
    OUT/nodes/<node>/var/log/bmc-sel.log            the BMC's System Event Log (`ipmitool sel elist` lines)
    OUT/nodes/<node>/fleetsight/pcie_bandwidth.json the PCIe bandwidth probe's results
    OUT/servers/<server>/proc/fs/lustre/...         a Lustre OSS's or MDS's procfs: per-job job_stats
    http://<twin>/bmc/<node>/redfish/v1/...         the node's BMC (Redfish)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

META_FILE = "meta.json"
NODES_DIR = "nodes"
SERVERS_DIR = "servers"  # the Lustre storage servers (OSS, MDS): not compute nodes
KERNEL_LOG = "var/log/kern.log"
KERNEL_LOG_FORMAT = "syslog"  # RFC 3339 stamp, host, "kernel:", message
JOB_LOGS_DIR = "var/log/jobs"
FABRIC_MANAGER_LOG = "var/log/fabricmanager.log"
BMC_SEL_LOG = "var/log/bmc-sel.log"
PCIE_BANDWIDTH_FILE = "fleetsight/pcie_bandwidth.json"
BMC_URL_PATH = "/bmc/{node}"


def meta_file(out: str | Path) -> Path:
    return Path(out) / META_FILE


def node_root(out: str | Path, node: str) -> Path:
    return Path(out) / NODES_DIR / node


def sysfs_root(out: str | Path, node: str) -> Path:
    return node_root(out, node) / "sys"


def procfs_root(out: str | Path, node: str) -> Path:
    return node_root(out, node) / "proc"


def server_root(out: str | Path, server: str) -> Path:
    return Path(out) / SERVERS_DIR / server


def server_procfs_root(out: str | Path, server: str) -> Path:
    return server_root(out, server) / "proc"


def server_names(out: str | Path) -> list[str]:
    """The run's Lustre servers (``lustre.servers`` in meta.json), whose agents export job_stats."""
    lustre = read_meta(out).get("lustre")
    servers = lustre.get("servers") if isinstance(lustre, dict) else None
    return [name for name in servers if isinstance(name, str)] if isinstance(servers, list) else []


def kernel_log(out: str | Path, node: str) -> Path:
    return node_root(out, node) / KERNEL_LOG


def fabric_manager_log(out: str | Path, node: str) -> Path:
    return node_root(out, node) / FABRIC_MANAGER_LOG


def bmc_sel_log(out: str | Path, node: str) -> Path:
    return node_root(out, node) / BMC_SEL_LOG


def job_log_dir(out: str | Path, node: str, job: str) -> Path:
    return node_root(out, node) / JOB_LOGS_DIR / job


def pcie_bandwidth_file(out: str | Path, node: str) -> Path:
    return node_root(out, node) / PCIE_BANDWIDTH_FILE


def bmc_url(twin_url: str, node: str) -> str:
    """The node's BMC base URL on the twin's HTTP server (Redfish below it)."""
    return twin_url.rstrip("/") + BMC_URL_PATH.format(node=node)


AGENT_DOWN_FILE = "agent.down"


def node_sources(node: str) -> dict[str, str]:
    """A node's sources as meta.json lists them: paths relative to OUT, the BMC's path on the twin."""
    root = Path(NODES_DIR) / node
    return {
        "sysfs_root": str(root / "sys"),
        "procfs_root": str(root / "proc"),
        "kernel_log": str(root / KERNEL_LOG),
        "kernel_log_format": KERNEL_LOG_FORMAT,
        "pcie_bandwidth_file": str(root / PCIE_BANDWIDTH_FILE),
        "bmc_path": BMC_URL_PATH.format(node=node),
        # present while the node's agent does not answer (a crashed host, a telemetry_dropout of the
        # node agent): the file a multi-node agent serving the twin turns into a 503 for this node
        "agent_down_file": str(root / AGENT_DOWN_FILE),
    }


def read_meta(out: str | Path) -> dict:
    """The run's meta.json, or {} while it is not written yet (or unreadable)."""
    try:
        meta = json.loads(meta_file(out).read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def node_names(out: str | Path) -> list[str]:
    """The run's nodes: from meta.json (entries are objects with a ``name``, or names), else the
    folders under ``nodes/``."""
    names = []
    for entry in read_meta(out).get("nodes", []):
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            names.append(entry["name"])
        elif isinstance(entry, str):
            names.append(entry)
    if names:
        return names
    nodes_dir = Path(out) / NODES_DIR
    try:
        return sorted(d.name for d in os.scandir(nodes_dir) if d.is_dir())
    except OSError:
        return []


def node_gpus(out: str | Path) -> dict[str, list[dict]]:
    """Each node's GPU map from meta.json: ``{node: [{"gpu", "pci_bdf", "uuid"}, ...]}``."""
    found = {}
    for entry in read_meta(out).get("nodes", []):
        if (
            isinstance(entry, dict)
            and isinstance(entry.get("name"), str)
            and isinstance(entry.get("gpus"), list)
        ):
            found[entry["name"]] = [
                {key: gpu.get(key) for key in ("gpu", "pci_bdf", "uuid")}
                for gpu in entry["gpus"]
                if isinstance(gpu, dict)
            ]
    return found
