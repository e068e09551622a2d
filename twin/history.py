"""The twin's dcgm-exporter history as Prometheus TSDB blocks: what a live scrape of the twin's
dcgm-exporter endpoints would have stored, recorded per tick and written as OpenMetrics with past
timestamps, cut into blocks by promtool. `twin run --history` records it beside a run; the evaluation
layer's backfill (evaluation/backfill.py) adds the real exporters' series to the same stream.
"""

from __future__ import annotations

import datetime as dt
import math
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from . import dcgm
from .scenario_model import Scenario
from .sim import G, Simulation

CHUNK_S = 2 * 3600  # one TSDB block per chunk: Prometheus's own block range, aligned to the epoch
DCGM_INSTANCE = "twin-backfill"
# The fields the backfill keeps (names of the shipped counters file; the run's counters file decides the
# names the blocks hold, so a field it lacks is left out, as a live scrape would).
BACKFILL_FIELDS = (
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_FB_USED",
    # The error counters whose trends rules/precursors.yml forecasts failures from.
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
)


def backfill_fields(sim: Simulation) -> dict[str, dcgm.Field]:
    """The backfilled fields the run's counters file publishes, by the name it publishes them under."""
    wanted = {dcgm.field_id(name) for name in BACKFILL_FIELDS}
    return {f.name: f for f in dcgm.metric_fields(sim.scenario.dcgm.counters) if f.id in wanted}


class BackfillError(RuntimeError):
    """promtool is missing or refused the data."""


@dataclass
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
        self.fields = backfill_fields(sim)
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
        answered = sim.alive & (sim.silenced["dcgm-exporter"] == 0)  # down, or silent (telemetry_dropout)
        rate = sim.scenario.scrape_failure_rate
        if rate:
            answered &= self.rng.random(len(sim.nodes)) >= rate
        history.answered[tick] = answered
        history.present[tick] = sim.gpu_present & answered[:, None]
        running = np.array([sim.gpu_job(i) is not None for i in range(len(sim.nodes))])
        history.node_job[tick] = np.where(running, sim.node_job, -1)
        for name, field in self.fields.items():
            history.values[name][tick] = dcgm.values(sim, field.id)
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
    fields = backfill_fields(sim)
    for name, values in history.values.items():
        for node in range(len(sim.nodes)):
            target = dcgm_target_labels(sim, node).replace(DCGM_INSTANCE, host)
            counts = _write_node_field(handle, sim, history, fields[name], values, node, target, stamps)
            series, samples = series + counts[0], samples + counts[1]
    return series, samples


def _write_node_field(
    handle: IO[str],
    sim: Simulation,
    history: History,
    field: dcgm.Field,
    values: np.ndarray,
    node: int,
    target: str,
    stamps: np.ndarray,
) -> tuple[int, int]:
    """One field of one node: a series per GPU and job that ran on it (and its idle time), and under
    dcgm-exporter 4.x one per Xid value too (err_code is a label). Returns (series, samples)."""
    jobs_here = history.node_job[:, node]
    series = samples = 0
    for job_index in np.unique(jobs_here):
        job = sim.jobs[job_index] if job_index >= 0 else None
        for gpu in range(G):
            column = values[:, node, gpu]
            keep = history.present[:, node, gpu] & (jobs_here == job_index)
            groups = np.unique(column[keep]) if dcgm.splits_by_value(sim, field) else [None]
            for value in groups:
                rows = np.nonzero(keep if value is None else keep & (column == value))[0]
                if not len(rows):
                    continue
                first = column[rows[0]]
                texts = [dcgm.format_value(field.id, v) for v in column[rows]]
                labels = dcgm.series_labels(sim, node, gpu, field, first, job)
                prefix = f"{field.name}{{{labels},{target}}} "
                handle.write(
                    "".join(f"{prefix}{text} {stamps[i]}\n" for text, i in zip(texts, rows, strict=True))
                )
                series, samples = series + 1, samples + len(rows)
    return series, samples


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
