"""The node agent: one process per node (or, for a twin, one process serving many nodes) exposing the
collectors of :mod:`exporters` on a Prometheus endpoint."""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from exporters import gpus
from exporters.bmc import BmcSource, IpmiClient, RedfishClient, load_credentials
from exporters.core import DeadlineRunner, Source, kv, render, start_http_server
from exporters.infiniband import InfinibandSource
from exporters.lustre import LustreSource
from exporters.pcie import PcieSource
from exporters.probes import PcieBandwidthSource
from exporters.xid import XidSource

log = logging.getLogger("fleetsight.exporters.node")

COLLECTORS = ("pcie", "infiniband", "xid", "bmc", "lustre", "probes")
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,252}$")


@dataclass
class NodeOptions:
    """Everything that says where one node's data lives. Every root and URL is configurable so that
    the same agent reads a real host, a fixture tree or the twin."""

    node: str
    sysfs_root: str = "/sys"
    procfs_root: str = "/proc"
    kmsg_file: str = "/dev/kmsg"  # /dev/kmsg, or a syslog-format file
    kernel_log_format: str = "auto"  # auto (kmsg for a character device, else syslog), kmsg, syslog
    journald: bool = False
    journalctl: str = "journalctl"
    redfish_url: str | None = None
    ipmitool: str | None = None
    ipmi_host: str | None = None
    bmc_credentials_file: str | None = None
    bmc_verify_tls: bool = True
    bmc_ca_file: str | None = None
    bmc_timeout_s: float = 3.0
    bmc_interval_s: float = 30.0
    lctl: str | None = None
    lustre_jobstats: bool = False
    pcie_bandwidth_file: str | None = None
    pcie_probe: str = "auto"  # auto (file if given), file, cuda, off
    pcie_probe_interval_s: float = 3600.0
    gpu_map_file: str | None = None
    gpus: list[dict] | None = None  # an explicit GPU map ({gpu, pci_bdf, uuid}), e.g. from the twin's meta
    nvml: bool = True
    state_dir: str | None = None  # None: positions and counts live in memory only
    state_read_only: bool = False  # read the saved state, never write it (``--once``)
    deadline_s: float = 5.0
    collectors: tuple[str, ...] = field(default_factory=lambda: COLLECTORS)


def kernel_log_mode(opts: NodeOptions) -> str:
    """``journald``, ``kmsg`` (records with sequence numbers: /dev/kmsg or a file of its records) or
    ``file`` (a syslog-format file such as /var/log/kern.log)."""
    if opts.journald:
        return "journald"
    if opts.kernel_log_format == "kmsg":
        return "kmsg"
    if opts.kernel_log_format == "syslog":
        return "file"
    try:
        is_device = stat.S_ISCHR(os.stat(opts.kmsg_file).st_mode)
    except OSError:
        is_device = False
    return "kmsg" if is_device or opts.kmsg_file == "/dev/kmsg" else "file"


def build_sources(opts: NodeOptions) -> list[Source]:
    """The enabled collectors; a collector whose source is not configured (no BMC URL...) is skipped."""
    map_files = [p for p in (opts.gpu_map_file, opts.pcie_bandwidth_file) if p]
    if opts.gpus:
        gpu_map = gpus.GpuMap(gpus.from_entries(opts.gpus))
    else:
        gpu_map = gpus.discover(opts.sysfs_root, map_files, use_nvml=opts.nvml)
    sources: list[Source] = []
    wanted = set(opts.collectors)
    if "pcie" in wanted:
        sources.append(PcieSource(opts.sysfs_root, gpu_map))
    if "infiniband" in wanted:
        sources.append(InfinibandSource(opts.sysfs_root))
    if "xid" in wanted:
        state_file = os.path.join(opts.state_dir, f"xid-{opts.node}.json") if opts.state_dir else None
        sources.append(
            XidSource(
                kernel_log_mode(opts),
                opts.kmsg_file,
                gpu_map,
                state_file,
                opts.procfs_root,
                opts.journalctl,
                save_state=not opts.state_read_only,
            )
        )
    if "bmc" in wanted and (opts.redfish_url or opts.ipmitool):
        credentials = load_credentials(opts.bmc_credentials_file)
        client: RedfishClient | IpmiClient
        if opts.redfish_url:
            verify: bool | str = opts.bmc_ca_file or opts.bmc_verify_tls
            client = RedfishClient(opts.redfish_url, credentials, opts.bmc_timeout_s, verify)
        else:
            assert opts.ipmitool is not None
            client = IpmiClient(opts.ipmitool, opts.ipmi_host, credentials, opts.bmc_timeout_s * 3)
        sources.append(BmcSource(client, opts.bmc_interval_s))
    if "lustre" in wanted:
        sources.append(LustreSource(opts.procfs_root, opts.sysfs_root, opts.lctl, opts.lustre_jobstats))
    probe = opts.pcie_probe
    if probe == "auto":
        probe = "file" if opts.pcie_bandwidth_file else "off"
    if "probes" in wanted and probe != "off":
        sources.append(
            PcieBandwidthSource(gpu_map, opts.pcie_bandwidth_file, probe, opts.pcie_probe_interval_s)
        )
    return sources


class NodeAgent:
    """One node's collectors behind a registry of their own."""

    def __init__(self, opts: NodeOptions) -> None:
        if not _NODE_NAME.match(opts.node):
            raise ValueError(f"node name {opts.node!r} is not a valid host name")
        self.opts = opts
        self.runner = DeadlineRunner(build_sources(opts), opts.deadline_s, const_labels={"node": opts.node})
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.runner)

    def scrape(self) -> bytes:
        return render(self.registry.collect())

    def close(self) -> None:
        self.runner.close()


def twin_node_options(
    twin_dir: str, node: str, twin_url: str | None, base: NodeOptions, gpu_list: list[dict] | None = None
) -> NodeOptions:
    """Options for one node of a twin output folder (the twin's output contract)."""
    root = Path(twin_dir) / "nodes" / node
    probe_file = root / "fleetsight" / "pcie_bandwidth.json"
    return NodeOptions(
        **{
            **base.__dict__,
            "node": node,
            "sysfs_root": str(root / "sys"),
            "procfs_root": str(root / "proc"),
            "kmsg_file": str(root / "var" / "log" / "kern.log"),
            "journald": False,
            "kernel_log_format": "syslog",
            "redfish_url": f"{twin_url.rstrip('/')}/bmc/{node}" if twin_url else None,
            "pcie_bandwidth_file": str(probe_file),
            "pcie_probe": "file",
            "nvml": False,
            "gpus": gpu_list,
        }
    )


def twin_nodes(twin_dir: str) -> dict[str, list[dict] | None]:
    """Node names (with their GPU maps) from the twin's meta.json, else from its nodes/ folder."""
    try:
        meta = json.loads((Path(twin_dir) / "meta.json").read_text())
        nodes: dict[str, list[dict] | None] = {}
        for entry in meta.get("nodes", []):
            if isinstance(entry, dict) and "name" in entry:
                nodes[str(entry["name"])] = entry.get("gpus") if isinstance(entry.get("gpus"), list) else None
            elif isinstance(entry, str):
                nodes[entry] = None
        if nodes:
            return nodes
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    nodes_dir = Path(twin_dir) / "nodes"
    return {p.name: None for p in sorted(nodes_dir.iterdir()) if p.is_dir()} if nodes_dir.is_dir() else {}


class MultiNodeAgents:
    """Node agents for every node of a twin, created as the twin's nodes appear."""

    def __init__(self, twin_dir: str, twin_url: str | None, base: NodeOptions) -> None:
        self.twin_dir, self.twin_url, self.base = twin_dir, twin_url, base
        self.agents: dict[str, NodeAgent] = {}
        self.lock = threading.Lock()
        self._meta_stamp = -2

    def refresh(self) -> dict[str, NodeAgent]:
        """The agents, after adding any node the twin has added (meta.json is re-read only when it
        changes: it is large for a large twin, and this runs on every scrape)."""
        with self.lock:
            try:
                stamp = os.stat(os.path.join(self.twin_dir, "meta.json")).st_mtime_ns
            except OSError:
                stamp = -1
            if stamp == self._meta_stamp and stamp != -1:
                return dict(self.agents)
            self._meta_stamp = stamp
            for node, gpu_list in twin_nodes(self.twin_dir).items():
                if node not in self.agents and _NODE_NAME.match(node):
                    opts = twin_node_options(self.twin_dir, node, self.twin_url, self.base, gpu_list)
                    self.agents[node] = NodeAgent(opts)
                    log.info(kv(event="node_added", node=node))
            return dict(self.agents)

    def scrape_all(self) -> bytes:
        """Every node's metrics as one exposition (families merged, as Prometheus's text format wants)."""
        merged: dict[str, Metric] = {}
        for agent in self.refresh().values():
            for family in agent.registry.collect():
                if family.name in merged:
                    merged[family.name].samples.extend(family.samples)
                else:
                    merged[family.name] = family
        return render(merged.values())

    def close(self) -> None:
        for agent in self.agents.values():
            agent.close()


def serve(listen: str, single: NodeAgent | None, multi: MultiNodeAgents | None) -> ThreadingHTTPServer:
    """An HTTP server: ``/metrics`` for a single agent; ``/nodes/<node>/metrics`` and an HTTP service
    discovery document ``/targets.json`` in multi-node mode. Returns the started server."""
    host, _, port = listen.rpartition(":")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if single is not None and path == "/metrics":
                self._send(200, single.scrape(), CONTENT_TYPE_LATEST)
            elif multi is not None and path.startswith("/nodes/") and path.endswith("/metrics"):
                node = path[len("/nodes/") : -len("/metrics")]
                agent = multi.refresh().get(node)
                if agent is None:
                    self._send(404, f"unknown node {node!r}\n".encode(), "text/plain")
                else:
                    self._send(200, agent.scrape(), CONTENT_TYPE_LATEST)
            elif multi is not None and path == "/targets.json":
                self._send(200, json.dumps(self._targets()).encode(), "application/json")
            elif path == "/":
                self._send(200, self._index().encode(), "text/html; charset=utf-8")
            else:
                self._send(404, b"not found\n", "text/plain")

        def _targets(self) -> list[dict]:
            address = f"{self.server.server_address[0]}:{self.server.server_address[1]}"
            assert multi is not None
            return [
                {"targets": [address], "labels": {"node": node, "__metrics_path__": f"/nodes/{node}/metrics"}}
                for node in sorted(multi.refresh())
            ]

        def _index(self) -> str:
            if single is not None:
                return f"<h1>FleetSight node agent ({single.opts.node})</h1><a href='/metrics'>/metrics</a>\n"
            assert multi is not None
            links = "".join(f"<li><a href='/nodes/{n}/metrics'>{n}</a></li>" for n in sorted(multi.refresh()))
            return (
                f"<h1>FleetSight node agents (twin)</h1><a href='/targets.json'>targets</a><ul>{links}</ul>\n"
            )

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return start_http_server(host, int(port), Handler)
