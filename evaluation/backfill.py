"""History for Prometheus without waiting: simulate a scenario at max speed and write what a live
stack's scrapes would have stored, as OpenMetrics with timestamps in the past, cut into TSDB blocks
by promtool.

What the history holds, produced by the real code wherever the stack has code:

- dcgm-exporter's series (the fields in BACKFILL_FIELDS) at every tick, with the labels a live scrape
  of the twin gets (dcgm-exporter's, ``hpc_job`` while a job runs on the GPU, plus the twin's target
  labels node, cluster and rack, and instance, job="dcgm");
- the node agent's series (``fleetsight_*``: PCIe, InfiniBand, Xid/SXid and kernel events, BMC, Lustre,
  PCIe probe, collector self-metrics): every ``agent_step`` seconds the twin writes its node files for
  that tick and the real agent (exporters/node.py) of every live node gathers once; its BMC requests
  are answered in-process by the twin's own Redfish routes (an httpx transport, no socket), so the
  agent parses the same JSON as over the network. An agent that restarts with its host keeps its Xid
  counts in a state folder, as the live agent does;
- the Lustre servers' agents (``job="fleetsight-lustre-server"``, node oss0, mds0...: the Lustre
  collector with ``--lustre-jobstats``) over the OSS and MDS job_stats the twin writes, at the same step;
- the fabric exporter's series, from the twin's UFM renderer, at the same step;
- ``up`` per target as Prometheus writes it: 0 while the host is down, and for dcgm-exporter also for
  the scrapes the scenario lets fail (``scrape_failure_rate``, drawn from the seed).

Labels follow the local stack's scrape configurations: the node agent's series carry its target's
``node`` and, as Prometheus renames a scraped label that a target label overrides, ``exported_node``;
``cluster`` comes from relabelling. The stream is cut into block-aligned chunks (``CHUNK_S``): each
chunk's OpenMetrics file becomes one block (``promtool --max-block-duration``) and is deleted before
the next one is written, so a day needs the disk of one chunk. The ground truth goes beside the
blocks folder, never into it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

import httpx
import numpy as np

from exporters import fabric as fabric_exporter
from exporters import node as node_exporter
from twin import layout
from twin import truth as truthmod
from twin.history import (
    CHUNK_S,
    BackfillError,
    HistoryRecorder,
    block_count,
    create_blocks,
    promtool_path,
    write_openmetrics,
)
from twin.scenario import Scenario
from twin.sim import Simulation
from twin.writers import TreeWriter, scenario_info


@dataclass
class BackfillResult:
    samples: int
    series: int
    blocks: int
    start: str
    end: str
    wall_seconds: float
    truth: Path | None = None


@dataclass
class CaptureOptions:
    """What besides dcgm-exporter the backfill runs, and how often (seconds of simulated time)."""

    agents: bool = True  # the node agent of every node and the fabric exporter
    agent_step: float = 30.0  # their scrape interval in the history; a multiple of the tick
    families: frozenset[str] | None = None  # keep only these sample names (and `up`); None: all
    # Which exporters run: the node agent's collectors by name (exporters/node.py COLLECTORS; "lustre"
    # also runs the Lustre servers' agents) and "fabric" for the fabric exporter; None: all. With
    # ``families``, those that write none of them need not run: the early warning's history reads the
    # InfiniBand counters alone, and the other collectors cost ~70 % of the agent's time.
    collectors: tuple[str, ...] | None = None

    def runs(self, name: str) -> bool:
        return self.collectors is None or name in self.collectors


# ------------------------------------------------------------------------------ the exporters

AGENT_INSTANCE = "twin-backfill:node-agent"
# The Lustre servers' agents (job_stats): their own scrape job, so that they never count as compute nodes.
SERVER_JOB = "fleetsight-lustre-server"
FABRIC_INSTANCE = "twin-backfill:fabric"


def scratch_tree_dir() -> str | None:
    """Where the node files of the history's ticks go: memory (/dev/shm) when there is some, since
    thousands of small files are rewritten every step and only the agents read them; else the
    system's temporary folder."""
    shm = Path("/dev/shm")
    try:
        if shm.is_dir() and shutil.disk_usage(shm).free > 1 << 30:
            return str(shm)
    except OSError:
        pass
    return None


TWIN_URL = "http://twin"  # the in-process host the exporters' clients are pointed at


def twin_transport(sim: Simulation) -> httpx.BaseTransport:
    """The twin's BMC (Redfish) and UFM answers without a socket: the same routes and renderers its
    HTTP server serves (twin/api.py), for the exporters' own HTTP clients. No lock: the backfill calls
    between ticks."""
    from twin import api  # FastAPI's import (~0.6 s) only where the exporters run, not for --no-agents

    return api.RouterTransport(api.router(api.Views(sim, contextlib.nullcontext(), TWIN_URL)))


def label_text(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class ExporterCapture:
    """The real node agent of every node and the fabric exporter, run once per step over the twin's
    files and renderers; their samples go to the OpenMetrics stream with the step's timestamp."""

    def __init__(self, sim: Simulation, files: Path, options: CaptureOptions) -> None:
        self.node_mod = node_exporter
        self.fabric_mod = fabric_exporter
        self.sim, self.files, self.options = sim, files, options
        self.writer = TreeWriter(files / "twin", sim, files / "twin.truth.jsonl")
        self.writer.create()
        self.transport = twin_transport(sim)
        # Every BMC and UFM request of every step would be an INFO line: thousands a minute.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        self.agents: dict[int, Any] = {}
        servers = layout.server_names(self.writer.out) if options.runs("lustre") else []
        self.server_agents = [self._server_agent(name) for name in servers]
        self.fabric = (
            self.fabric_mod.FabricExporter(
                f"{TWIN_URL}/ufm", f"{TWIN_URL}/ufm/csv/metrics", transport=self.transport
            )
            if options.runs("fabric")
            else None
        )
        self.cluster = sim.scenario.cluster.name
        self.label_cache: dict[tuple, str] = {}
        self.series: set[str] = set()
        self.samples = 0

    def _agent(self, node: int) -> Any:
        agent = self.agents.get(node)
        if agent is None:
            out, name = self.writer.out, self.sim.nodes[node]
            gpu_map = self.files / "gpus" / f"{name}.json"
            if not gpu_map.exists():
                gpu_map.parent.mkdir(parents=True, exist_ok=True)
                gpu_map.write_text(json.dumps(layout.node_gpus(out).get(name, [])))
            options = self.node_mod.NodeOptions(
                node=name,
                sysfs_root=str(layout.sysfs_root(out, name)),
                procfs_root=str(layout.procfs_root(out, name)),
                kmsg_file=str(layout.kernel_log(out, name)),
                kernel_log_format=layout.KERNEL_LOG_FORMAT,
                redfish_url=layout.bmc_url(TWIN_URL, name),
                pcie_bandwidth_file=str(layout.pcie_bandwidth_file(out, name)),
                pcie_probe="file",
                gpu_map_file=str(gpu_map),
                nvml=False,
                state_dir=str(self.files / "agent-state"),
                bmc_interval_s=0.0,  # every scrape polls, as the local stack's 15 s poll under 15 s scrapes
                bmc_transport=self.transport,
                collectors=tuple(c for c in self.node_mod.COLLECTORS if self.options.runs(c)),
            )
            agent = self.agents[node] = self.node_mod.NodeAgent(options)
        return agent

    def _server_agent(self, name: str) -> Any:
        """The node agent of a Lustre OSS or MDS: the Lustre collector only, with job_stats on."""
        options = self.node_mod.NodeOptions(
            node=name,
            sysfs_root=str(layout.server_root(self.writer.out, name) / "sys"),
            procfs_root=str(layout.server_procfs_root(self.writer.out, name)),
            nvml=False,
            lustre_jobstats=True,
            collectors=("lustre",),
        )
        return self.node_mod.NodeAgent(options)

    def capture(self, stamp: str, handle: IO[str]) -> None:
        """One scrape of every target at this tick (the twin's files are written for it first)."""
        sim = self.sim
        sim.app_lines.clear()  # the jobs' logs are the log pipeline's, not the metrics'
        self.writer.write_state()
        self.writer.flush_logs()
        for node, name in enumerate(sim.nodes):
            target = {"node": name, "cluster": self.cluster}
            if not sim.answers(node, "node_agent"):
                # The agent runs on the host: it dies with it and starts again (from its state) on boot.
                agent = self.agents.pop(node, None)
                if agent is not None:
                    agent.close()
                self._write(
                    handle, "up", {"instance": AGENT_INSTANCE, "job": "fleetsight-node", **target}, 0, stamp
                )
                continue
            extra = {"instance": AGENT_INSTANCE, "job": "fleetsight-node", **target}
            self._write(handle, "up", extra, 1, stamp)
            self._families(handle, self._agent(node).registry.collect(), extra, stamp)
        for agent in self.server_agents:
            target = {
                "instance": AGENT_INSTANCE,
                "job": SERVER_JOB,
                "node": agent.opts.node,
                "cluster": self.cluster,
            }
            self._write(handle, "up", target, 1, stamp)
            self._families(handle, agent.registry.collect(), target, stamp)
        if self.fabric is not None:
            fabric = {"instance": FABRIC_INSTANCE, "job": "fleetsight-fabric", "cluster": self.cluster}
            self._write(handle, "up", fabric, 1, stamp)
            self._families(handle, self.fabric.runner.gather(), fabric, stamp)

    def _families(self, handle: IO[str], families: Iterable[Any], target: dict[str, str], stamp: str) -> None:
        keep = self.options.families
        for family in families:
            for sample in family.samples:
                if keep is not None and sample.name not in keep:
                    continue
                self._write(handle, sample.name, self._labels(sample.labels, target), sample.value, stamp)

    def _labels(self, labels: dict[str, str], target: dict[str, str]) -> dict[str, str]:
        """Prometheus's merge (honor_labels false): a scraped label that a target label overrides is
        kept as exported_<name>."""
        merged = dict(labels)
        for key, value in target.items():
            if key in merged:
                merged[f"exported_{key}"] = merged[key]
            merged[key] = value
        return merged

    def _write(self, handle: IO[str], name: str, labels: dict[str, str], value: float, stamp: str) -> None:
        key = (name, *labels.items())
        text = self.label_cache.get(key)
        if text is None:
            text = self.label_cache[key] = f"{name}{{{label_text(labels)}}}"
            self.series.add(text)
        handle.write(f"{text} {_value(value)} {stamp}\n")
        self.samples += 1

    def unwritten(self) -> list[str]:
        """The exporters' families asked for (``fleetsight_*`` in ``families``) that no sample carried."""
        written = {text.split("{", 1)[0] for text in self.series}
        wanted = self.options.families or frozenset()
        return sorted(name for name in wanted if name.startswith("fleetsight_") and name not in written)

    def close(self) -> None:
        for agent in (*self.agents.values(), *self.server_agents):
            agent.close()
        if self.fabric is not None:
            self.fabric.close()


def _value(value: float) -> str:
    if value != value:
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


@dataclass
class Chunk:
    """The part of the run that becomes one block: its first tick, the dcgm recorder, the stream."""

    first_tick: int
    recorder: HistoryRecorder
    path: Path
    handle: IO[str]
    counts: list[int] = field(default_factory=lambda: [0, 0])


def chunk_ticks(sim: Simulation, first: int, total: int) -> int:
    """How many ticks from ``first`` lie in the same block-aligned chunk."""
    tick = sim.scenario.tick
    t0 = sim.start_unix + first * tick
    boundary = (math.floor(t0 / CHUNK_S) + 1) * CHUNK_S
    return max(1, min(total - first, math.ceil((boundary - t0) / tick)))


def backfill_blocks(
    scenario: Scenario,
    out: Path,
    duration: float | None = None,
    end: dt.datetime | None = None,
    keep_openmetrics: bool = False,
    truth: Path | None = None,
    capture: CaptureOptions | None = None,
    progress: Callable[[int, int], None] = lambda _done, _total: None,
) -> BackfillResult:
    promtool_path()
    capture = capture if capture is not None else CaptureOptions()
    started = time.monotonic()
    seconds = duration if duration is not None else scenario.duration
    ticks = max(1, math.ceil(seconds / scenario.tick))
    end = end or dt.datetime.now(dt.UTC)
    start = end - dt.timedelta(seconds=ticks * scenario.tick)
    scenario = replace(scenario, duration=ticks * scenario.tick)
    truth = truth if truth is not None else truthmod.default_truth_path(out)
    truthmod.check_outside(truth, out)
    out.mkdir(parents=True, exist_ok=True)
    blocks_before = block_count(out)
    sim = Simulation(scenario, start)
    rng = np.random.default_rng(scenario.seed + 1)
    agent_every = max(1, round(capture.agent_step / scenario.tick))
    series = samples = 0
    with (
        tempfile.TemporaryDirectory(prefix=f".{out.name}-backfill-", dir=out.parent) as scratch,
        tempfile.TemporaryDirectory(prefix="fleetsight-backfill-", dir=scratch_tree_dir()) as tree,
    ):
        files = Path(scratch)
        exporters = ExporterCapture(sim, Path(tree), capture) if capture.agents else None
        chunk: Chunk | None = None
        try:
            for index in range(ticks):
                if chunk is None:
                    path = files / f"chunk-{index}.om"
                    size = chunk_ticks(sim, index, ticks)
                    handle = open(path, "w")  # noqa: SIM115 (closed when the chunk is cut, or in finally)
                    chunk = Chunk(index, HistoryRecorder(sim, size, rng), path, handle)
                sim.advance()
                chunk.recorder.record(sim)
                if exporters is not None and index % agent_every == 0:
                    exporters.capture(f"{sim.unix():.3f}", chunk.handle)
                elif exporters is None:
                    sim.kernel_lines.clear()
                    sim.app_lines.clear()
                progress(index + 1, ticks)
                if chunk.recorder.ticks == chunk.recorder.history.present.shape[0] or index == ticks - 1:
                    s, n = write_openmetrics(
                        chunk.handle, sim, chunk.recorder.recorded(), first_tick=chunk.first_tick
                    )
                    series, samples = series + s, samples + n
                    chunk.handle.write("# EOF\n")
                    chunk.handle.close()
                    create_blocks(chunk.path, out)
                    if keep_openmetrics:
                        shutil.copy(chunk.path, out.parent / f"{out.name}-{chunk.path.name}")
                    chunk.path.unlink()
                    chunk = None
        finally:
            if chunk is not None:
                chunk.handle.close()
            if exporters is not None:
                series += len(exporters.series)
                samples += exporters.samples
                exporters.close()
        if exporters is not None and capture.collectors is not None and exporters.unwritten():
            # A collector left out that the rules needed would make the history quietly empty.
            raise BackfillError(
                f"the exporters {', '.join(capture.collectors)} wrote no "
                f"{', '.join(exporters.unwritten())}: run the collector that exports it"
            )
    sim.refresh_truth()
    truthmod.write_lines(truth, sim.truth_lines)
    truthmod.write_scenario(truthmod.scenario_path(truth), scenario_info(sim))
    return BackfillResult(
        samples=samples,
        series=series,
        blocks=block_count(out) - blocks_before,
        start=start.isoformat(timespec="seconds"),
        end=end.isoformat(timespec="seconds"),
        wall_seconds=time.monotonic() - started,
        truth=truth,
    )
