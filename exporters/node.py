"""The node agent: the collectors of :mod:`exporters` for one node on a Prometheus endpoint; or, with a
nodes file, several nodes from one process (``/nodes/<node>/metrics`` and ``/targets.json``)."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

# Each collector's module registers it (exporters.core.register_collector) when imported.
from . import bmc, gpus, infiniband, lustre, pcie, probes, xid  # noqa: F401
from .core import Source, collectors, kv
from .exposition import render
from .runners import DeadlineRunner
from .serving import Page, html_page, json_page, metrics_page, not_found, parse_listen

log = logging.getLogger("fleetsight.exporters.node")

COLLECTORS = tuple(collectors())  # pcie, infiniband, xid, bmc, lustre, probes
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
    lustre_required: bool = False  # False: a host without a Lustre client exports no Lustre series, quietly
    infiniband_required: bool = False  # False: a host without /sys/class/infiniband: no IB series, quietly
    pcie_bandwidth_file: str | None = None
    pcie_probe: str = "auto"  # auto (file if given), file, cuda, off
    pcie_probe_interval_s: float = 3600.0
    gpu_map_file: str | None = None
    nvml: bool = True
    state_dir: str | None = None  # None: positions and counts live in memory only
    state_read_only: bool = False  # read the saved state, never write it (``--once``)
    deadline_s: float = 5.0
    # Where the BMC's HTTP requests go (None: the network). The twin's backfill answers them in-process
    # at each simulated tick; the agent's code path is otherwise the same.
    bmc_transport: httpx.BaseTransport | None = None
    collectors: tuple[str, ...] = field(default_factory=lambda: COLLECTORS)


def build_sources(opts: NodeOptions) -> list[Source]:
    """The enabled collectors' sources; a collector whose source is not configured (no BMC URL...) is
    skipped."""
    map_files = [p for p in (opts.gpu_map_file, opts.pcie_bandwidth_file) if p]
    gpu_map = gpus.discover(
        opts.sysfs_root,
        map_files,
        use_nvml=opts.nvml,
        procfs_root=opts.procfs_root,
        state_file=os.path.join(opts.state_dir, f"gpus-{opts.node}.json") if opts.state_dir else None,
        save_state=not opts.state_read_only,
    )
    wanted = set(opts.collectors)
    made = (make(opts, gpu_map) for name, make in collectors().items() if name in wanted)
    return [source for source in made if source is not None]


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


# A node-set entry may name a file whose presence means "this node's agent does not answer": a simulator's
# way to play a host that crashed or an agent that stopped (the twin writes it), as the one process that
# serves every node cannot itself go away for one of them. The node's page is then a 503, as a scrape of
# a dead host's agent fails.
UNREACHABLE_KEY = "unreachable_file"
# And labels for the node's target in /targets.json (a simulator's cluster and rack): the labels a site's
# service discovery gives every per-node job alike (the health service's http_sd: cluster, node, unit),
# so that rules joining this job with dcgm-exporter's on (cluster, node) find both.
TARGET_LABELS_KEY = "target_labels"
NOT_OPTIONS = (UNREACHABLE_KEY, TARGET_LABELS_KEY)


class NodeSet:
    """Several nodes served by one process (a test bench, a simulator, a host that sees several nodes'
    files): a JSON file lists them, each an object whose keys are the agent's own option names
    (``{"node": "n0001", "sysfs_root": "...", "redfish_url": "..."}``); ``make_options`` turns an entry
    into :class:`NodeOptions` (the command line's options fill what an entry leaves out). The file is
    re-read when it changes: nodes come, go, or change with it; a file that does not parse keeps the
    nodes as they were, and says so in the log."""

    def __init__(self, path: str, make_options: Callable[[dict], NodeOptions]) -> None:
        self.path = path
        self.make_options = make_options
        self.agents: dict[str, NodeAgent] = {}
        self.entries: dict[str, dict] = {}
        self.lock = threading.Lock()
        self.stamp: tuple[int, int] | None = None
        self.problem = ""

    def load(self) -> list[dict]:
        """The file's entries; raises ValueError (naming the file and the entry) when it is malformed."""
        try:
            with open(self.path) as f:
                entries = json.load(f)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{self.path}: {exc}") from exc
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise ValueError(f"{self.path}: expected a JSON list of objects (one per node)")
        names = [str(e.get("node", "")) for e in entries]
        for index, name in enumerate(names):
            if not _NODE_NAME.match(name):
                raise ValueError(f"{self.path}: entry {index}: 'node' {name!r} is not a valid host name")
            if names.count(name) > 1:
                raise ValueError(f"{self.path}: node {name!r} is listed twice")
        return entries

    def refresh(self) -> dict[str, NodeAgent]:
        """The agents, after taking in any change of the file (checked by mtime and size: cheap enough
        for every scrape)."""
        with self.lock:
            try:
                info = os.stat(self.path)
                stamp = (info.st_mtime_ns, info.st_size)
            except OSError:
                stamp = None
            if stamp is not None and stamp != self.stamp:
                self.stamp = stamp
                try:
                    self._apply(self.load())
                    self.problem = ""
                except (ValueError, OSError) as exc:
                    if str(exc) != self.problem:
                        log.error(kv(event="nodes_file_invalid", file=self.path, error=str(exc)))
                    self.problem = str(exc)
            return dict(self.agents)

    def _apply(self, entries: list[dict]) -> None:
        """Takes in the file's entries, all or nothing: the new and changed nodes' agents are built
        before any old one is let go."""
        wanted = {str(e["node"]): e for e in entries}
        changed = [name for name, entry in wanted.items() if entry != self.entries.get(name)]
        built: dict[str, NodeAgent] = {}
        try:
            for name in changed:
                options = {k: v for k, v in wanted[name].items() if k not in NOT_OPTIONS}
                built[name] = NodeAgent(self.make_options(options))
        except Exception:
            for agent in built.values():
                agent.close()
            raise
        for name in [n for n in self.agents if n not in wanted or n in built]:
            self.agents.pop(name).close()
            if name not in wanted:
                log.info(kv(event="node_removed", node=name))
        for name, agent in built.items():
            log.info(kv(event="node_changed" if name in self.entries else "node_added", node=name))
            self.agents[name] = agent
        self.entries = wanted

    def scrape_all(self) -> bytes:
        """Every node's metrics as one exposition (families merged, as the text format wants)."""
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


def single_node_pages(agent: NodeAgent) -> Callable[[str], Page | None]:
    def page(path: str) -> Page | None:
        if path == "/metrics":
            return metrics_page(agent.scrape())
        if path == "/":
            return html_page(
                f"<h1>FleetSight node agent ({agent.opts.node})</h1><a href='/metrics'>/metrics</a>\n"
            )
        return None

    return page


def target_labels(entry: dict) -> dict[str, str]:
    """An entry's own labels for its target (TARGET_LABELS_KEY), string values only."""
    labels = entry.get(TARGET_LABELS_KEY)
    if not isinstance(labels, dict):
        return {}
    return {
        str(k): str(v) for k, v in labels.items() if isinstance(v, str | int) and not str(k).startswith("__")
    }


def node_set_pages(nodes: NodeSet, address: str) -> Callable[[str], Page | None]:
    """``/nodes/<node>/metrics`` per node and an HTTP service-discovery document ``/targets.json``
    (each target carries ``node`` and ``__metrics_path__``) for Prometheus's ``http_sd_configs``."""

    def page(path: str) -> Page | None:
        if path.startswith("/nodes/") and path.endswith("/metrics"):
            node = path[len("/nodes/") : -len("/metrics")]
            agent = nodes.refresh().get(node)
            if agent is None:
                return not_found(f"unknown node {node!r}")
            marker = nodes.entries.get(node, {}).get(UNREACHABLE_KEY)
            if marker and os.path.exists(marker):
                return Page(
                    f"the agent of {node} does not answer\n".encode(), "text/plain; charset=utf-8", 503
                )
            return metrics_page(agent.scrape())
        if path == "/targets.json":
            agents = nodes.refresh()
            targets = [
                {"targets": [address], "labels": {**target_labels(nodes.entries.get(n, {})), "node": n,
                                                   "__metrics_path__": f"/nodes/{n}/metrics"}}
                for n in sorted(agents)
            ]  # fmt: skip
            return json_page(json.dumps(targets))
        if path == "/":
            links = "".join(f"<li><a href='/nodes/{n}/metrics'>{n}</a></li>" for n in sorted(nodes.refresh()))
            return html_page(
                f"<h1>FleetSight node agents</h1><a href='/targets.json'>targets</a><ul>{links}</ul>\n"
            )
        return None

    return page


def advertised_address(listen: str) -> str:
    """The HOST:PORT a scraper reaches ``listen`` at (a wildcard address stands for this host)."""
    host, port = parse_listen(listen)
    if host in ("0.0.0.0", "::"):
        host = socket.getfqdn()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
