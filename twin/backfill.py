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
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

import httpx
import numpy as np

from . import layout, render
from . import truth as truthmod
from .scenario import Scenario
from .sim import G, Simulation
from .writers import TreeWriter, scenario_info

CHUNK_S = 2 * 3600  # one TSDB block per chunk: Prometheus's own block range, aligned to the epoch
DCGM_INSTANCE = "twin-backfill"
AGENT_INSTANCE = "twin-backfill:node-agent"
# The Lustre servers' agents (job_stats): their own scrape job, so that they never count as compute nodes.
SERVER_JOB = "fleetsight-lustre-server"
FABRIC_INSTANCE = "twin-backfill:fabric"
BACKFILL_FIELDS = (
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "DCGM_FI_DEV_ROW_REMAP_FAILED",
    "DCGM_FI_DEV_FB_USED",
)


class BackfillError(RuntimeError):
    """promtool is missing or refused the data."""


@dataclass
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


@dataclass
class History:
    """Each backfilled field per tick ([tick, node, gpu]), which GPUs reported, each node's job per
    tick (index into sim.jobs, -1: none), and whether its dcgm-exporter answered ([tick, node])."""

    values: dict[str, np.ndarray]
    present: np.ndarray
    node_job: np.ndarray
    answered: np.ndarray


class HistoryRecorder:
    """Keeps what dcgm-exporter would have shown at every tick, for TSDB blocks afterwards (by
    `backfill`, or by `run --history`, so that the blocks and the run's files tell the same story)."""

    def __init__(self, sim: Simulation, ticks: int, rng: np.random.Generator | None = None) -> None:
        n = len(sim.nodes)
        self.fields = {name: field for name, _, _, field, _ in render.DCGM_FIELDS if name in BACKFILL_FIELDS}
        self.history = History(
            {name: np.zeros((ticks, n, G), dtype=np.float32) for name in self.fields},
            np.zeros((ticks, n, G), dtype=bool),
            np.full((ticks, n), -1, dtype=np.int32),
            np.zeros((ticks, n), dtype=bool),
        )
        # The scrapes that fail, drawn from the seed (the live server draws its own the same way).
        self.rng = rng if rng is not None else np.random.default_rng(sim.scenario.seed + 1)
        self.ticks = 0

    def record(self, sim: Simulation) -> None:
        if self.ticks >= self.history.present.shape[0]:
            return
        tick, history = self.ticks, self.history
        answered = sim.alive.copy()
        rate = sim.scenario.scrape_failure_rate
        if rate:
            answered &= self.rng.random(len(sim.nodes)) >= rate
        history.answered[tick] = answered
        history.present[tick] = sim.gpu_present & answered[:, None]
        running = np.array([sim.gpu_job(i) is not None for i in range(len(sim.nodes))])
        history.node_job[tick] = np.where(running, sim.node_job, -1)
        for name, attribute in self.fields.items():
            history.values[name][tick] = render.dcgm_array(sim, attribute)
        self.ticks += 1

    def recorded(self) -> History:
        t = self.ticks
        h = self.history
        return History({k: v[:t] for k, v in h.values.items()}, h.present[:t], h.node_job[:t], h.answered[:t])


def simulate_history(scenario: Scenario, start: dt.datetime, ticks: int) -> tuple[Simulation, History]:
    """Run the physics only (no files) and keep each backfilled field per tick: [tick, node, gpu]."""
    sim = Simulation(scenario, start)
    recorder = HistoryRecorder(sim, ticks)
    for _ in range(ticks):
        sim.advance()
        recorder.record(sim)
        sim.kernel_lines.clear()
        sim.app_lines.clear()
    return sim, recorder.recorded()


def dcgm_target_labels(sim: Simulation, node: int) -> str:
    """The labels the twin's http_sd target list gives each node's dcgm-exporter (render.dcgm_targets),
    plus instance and job as Prometheus adds them."""
    return (
        f'node="{sim.nodes[node]}",cluster="{sim.scenario.cluster.name}",rack="{sim.topology.rack(node)}",'
        f'instance="{DCGM_INSTANCE}",job="dcgm"'
    )


def write_openmetrics(
    path: Path | IO[str], sim: Simulation, history: History, host: str = DCGM_INSTANCE, first_tick: int = 0
) -> tuple[int, int]:
    """dcgm-exporter's series and its `up`, each series' samples in time order (no `# EOF`: the caller
    closes the stream). Returns (series, samples). ``first_tick``: the index of the history's first
    tick in the run (its timestamps).

    A GPU's series changes with its ``hpc_job`` label, as dcgm-exporter's do: one series per job
    that ran on it (and one for its idle time)."""
    if isinstance(path, Path):
        with open(path, "w") as handle:
            counts = write_openmetrics(handle, sim, history, host, first_tick)
            handle.write("# EOF\n")
            return counts
    handle = path
    tick = sim.scenario.tick
    present = history.present
    ticks = present.shape[0]
    stamps = np.array([f"{sim.start_unix + (first_tick + i) * tick:.3f}" for i in range(ticks)])
    series = samples = 0
    for node in range(len(sim.nodes)):
        target = dcgm_target_labels(sim, node).replace(DCGM_INSTANCE, host)
        up = history.answered[:, node].astype(np.int8).astype(str)
        handle.write("".join(f"up{{{target}}} {up[i]} {stamps[i]}\n" for i in range(ticks)))
        series += 1
        samples += ticks
    for name, values in history.values.items():
        integer = name in render.INTEGER_FIELDS
        for node in range(len(sim.nodes)):
            target = dcgm_target_labels(sim, node).replace(DCGM_INSTANCE, host)
            jobs_here = history.node_job[:, node]
            for job_index in np.unique(jobs_here):
                job = sim.jobs[job_index].spec.id if job_index >= 0 else None
                for gpu in range(G):
                    keep = present[:, node, gpu] & (jobs_here == job_index)
                    if not keep.any():
                        continue
                    column = values[:, node, gpu]
                    texts = column.astype(np.int64).astype(str) if integer else np.char.mod("%.6g", column)
                    prefix = f"{name}{{{render.gpu_labels(sim, node, gpu, job)},{target}}} "
                    handle.write("".join(f"{prefix}{texts[i]} {stamps[i]}\n" for i in np.nonzero(keep)[0]))
                    series += 1
                    samples += int(keep.sum())
    return series, samples


# ------------------------------------------------------------------------------ the exporters


TWIN_URL = "http://twin"  # the in-process host the exporters' clients are pointed at


def twin_transport(sim: Simulation) -> httpx.BaseTransport:
    """The twin's BMC (Redfish) and UFM answers without a socket: the same routes and renderers its
    HTTP server serves (twin/api.py), for the exporters' own HTTP clients. No lock: the backfill calls
    between ticks."""
    from . import api  # FastAPI's import (~0.6 s) only where the exporters run, not for --no-agents

    return api.RouterTransport(api.router(api.Views(sim, contextlib.nullcontext(), TWIN_URL)))


def label_text(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class ExporterCapture:
    """The real node agent of every node and the fabric exporter, run once per step over the twin's
    files and renderers; their samples go to the OpenMetrics stream with the step's timestamp."""

    def __init__(self, sim: Simulation, files: Path, options: CaptureOptions) -> None:
        from fleetsight.registry import import_component  # evaluation glue: see registry's rule

        self.node_mod = import_component("exporters", "node")
        self.fabric_mod = import_component("exporters", "fabric")
        self.sim, self.files, self.options = sim, files, options
        self.writer = TreeWriter(files / "twin", sim, files / "twin.truth.jsonl")
        self.writer.create()
        self.transport = twin_transport(sim)
        # Every BMC and UFM request of every step would be an INFO line: thousands a minute.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        self.agents: dict[int, Any] = {}
        self.server_agents = [self._server_agent(name) for name in layout.server_names(self.writer.out)]
        self.fabric = self.fabric_mod.FabricExporter(
            f"{TWIN_URL}/ufm", f"{TWIN_URL}/ufm/csv/metrics", transport=self.transport
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
            if not sim.alive[node]:
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
        fabric_target = {"instance": FABRIC_INSTANCE, "job": "fleetsight-fabric", "cluster": self.cluster}
        self._write(handle, "up", fabric_target, 1, stamp)
        self._families(handle, self.fabric.runner.gather(), fabric_target, stamp)

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

    def close(self) -> None:
        for agent in (*self.agents.values(), *self.server_agents):
            agent.close()
        self.fabric.close()


def _value(value: float) -> str:
    if value != value:
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


# ------------------------------------------------------------------------------------ blocks


def promtool_path() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        raise BackfillError("promtool is not installed (apt-get install prometheus, or `fleetsight setup`)")
    return promtool


def create_blocks(source: Path, out: Path, block_s: int = CHUNK_S) -> None:
    """One OpenMetrics file into TSDB blocks of at most ``block_s`` (read once, not once per 2 h)."""
    result = subprocess.run(
        [
            promtool_path(),
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            f"--max-block-duration={block_s // 3600}h",
            str(source),
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise BackfillError(
            f"promtool failed ({result.returncode}): {(result.stderr or result.stdout).strip()[-2000:]}"
        )


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


def block_count(out: Path) -> int:
    return sum(1 for p in out.iterdir() if (p / "meta.json").exists())


def cut_blocks(
    sim: Simulation, history: History, out: Path, keep_openmetrics: bool = False
) -> tuple[int, int, int]:
    """A recorded dcgm-exporter history (`run --history`) as OpenMetrics, then TSDB blocks in OUT by
    promtool: (series, samples, blocks)."""
    promtool_path()
    out.mkdir(parents=True, exist_ok=True)
    source = out.parent / f".{out.name}-history.om"
    before = block_count(out)
    try:
        series, samples = write_openmetrics(source, sim, history)
        span = history.present.shape[0] * sim.scenario.tick
        create_blocks(source, out, max(CHUNK_S, math.ceil(span / CHUNK_S) * CHUNK_S))
    finally:
        if keep_openmetrics:
            shutil.move(source, out.parent / f"{out.name}-history.om")
        source.unlink(missing_ok=True)
    return series, samples, block_count(out) - before


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
