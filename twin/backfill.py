"""History for Prometheus without waiting: simulate a scenario at max speed, write its dcgm-exporter
series as OpenMetrics (one sample per tick, timestamps in the past), then let promtool cut TSDB blocks.

The series carry the labels a live scrape of the twin gets (dcgm-exporter's, ``hpc_job`` while a job
runs on the GPU, plus node, cluster, instance and job="dcgm"), so rules and dashboards see backfilled
and live data alike. The ground truth goes beside the blocks folder, never into it.
"""

from __future__ import annotations

import datetime as dt
import math
import shutil
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from . import render
from . import truth as truthmod
from .scenario import Scenario
from .sim import G, Simulation
from .writers import scenario_info

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
    "DCGM_FI_DEV_FB_USED",
)


class BackfillError(RuntimeError):
    """promtool is missing or refused the data."""


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
class History:
    """Each backfilled field per tick ([tick, node, gpu]), which GPUs reported, and each node's
    job per tick (index into sim.jobs, -1: none)."""

    values: dict[str, np.ndarray]
    present: np.ndarray
    node_job: np.ndarray


class HistoryRecorder:
    """Keeps what dcgm-exporter would have shown at every tick, for TSDB blocks afterwards (by
    `backfill`, or by `run --history`, so that the blocks and the run's files tell the same story)."""

    def __init__(self, sim: Simulation, ticks: int) -> None:
        n = len(sim.nodes)
        self.fields = {name: field for name, _, _, field, _ in render.DCGM_FIELDS if name in BACKFILL_FIELDS}
        self.history = History(
            {name: np.zeros((ticks, n, G), dtype=np.float32) for name in self.fields},
            np.zeros((ticks, n, G), dtype=bool),
            np.full((ticks, n), -1, dtype=np.int32),
        )
        self.ticks = 0

    def record(self, sim: Simulation) -> None:
        if self.ticks >= self.history.present.shape[0]:
            return
        tick, history = self.ticks, self.history
        history.present[tick] = sim.gpu_present & sim.alive[:, None]
        running = np.array([sim.gpu_job(i) is not None for i in range(len(sim.nodes))])
        history.node_job[tick] = np.where(running, sim.node_job, -1)
        for name, attribute in self.fields.items():
            history.values[name][tick] = render.dcgm_array(sim, attribute)
        self.ticks += 1

    def recorded(self) -> History:
        t = self.ticks
        h = self.history
        return History({k: v[:t] for k, v in h.values.items()}, h.present[:t], h.node_job[:t])


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


def write_openmetrics(path: Path, sim: Simulation, history: History, host: str) -> tuple[int, int]:
    """Each family once, each series' samples in time order, then `# EOF`. Returns (series, samples).

    A GPU's series changes with its ``hpc_job`` label, as dcgm-exporter's do: one series per job
    that ran on it (and one for its idle time)."""
    tick = sim.scenario.tick
    present = history.present
    ticks = present.shape[0]
    stamps = [f"{sim.start_unix + i * tick:.3f}" for i in range(ticks)]
    series = samples = 0
    cluster = sim.scenario.cluster.name
    with open(path, "w") as handle:
        for name, values in history.values.items():
            handle.write(f"# TYPE {name} gauge\n")
            integer = name in render.INTEGER_FIELDS
            for node in range(len(sim.nodes)):
                jobs_here = history.node_job[:, node]
                for job_index in np.unique(jobs_here):
                    job = sim.jobs[job_index].spec.id if job_index >= 0 else None
                    for gpu in range(G):
                        labels = render.gpu_labels(sim, node, gpu, job)
                        labels += (
                            f',node="{sim.nodes[node]}",cluster="{cluster}",instance="{host}",job="dcgm"'
                        )
                        keep = present[:, node, gpu] & (jobs_here == job_index)
                        if not keep.any():
                            continue
                        column = values[:, node, gpu]
                        texts = (
                            column.astype(np.int64).astype(str) if integer else np.char.mod("%.6g", column)
                        )
                        prefix = f"{name}{{{labels}}} "
                        handle.write(
                            "".join(f"{prefix}{texts[i]} {stamps[i]}\n" for i in np.nonzero(keep)[0])
                        )
                        series += 1
                        samples += int(keep.sum())
        handle.write("# EOF\n")
    return series, samples


def cut_blocks(
    sim: Simulation, history: History, out: Path, keep_openmetrics: bool = False
) -> tuple[int, int, int]:
    """The history as OpenMetrics, then TSDB blocks in OUT by promtool: (series, samples, blocks)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        raise BackfillError("promtool is not installed (apt-get install prometheus, or `fleetsight setup`)")
    out.mkdir(parents=True, exist_ok=True)
    source = out / "twin-history.om"
    series, samples = write_openmetrics(source, sim, history, "twin-backfill")
    before = {p.name for p in out.iterdir() if p.is_dir()}
    result = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    if not keep_openmetrics:
        source.unlink(missing_ok=True)
    if result.returncode != 0:
        raise BackfillError(
            f"promtool failed ({result.returncode}): {(result.stderr or result.stdout).strip()[-2000:]}"
        )
    return series, samples, len({p.name for p in out.iterdir() if p.is_dir()} - before)


def backfill_blocks(
    scenario: Scenario,
    out: Path,
    duration: float | None = None,
    end: dt.datetime | None = None,
    keep_openmetrics: bool = False,
    truth: Path | None = None,
) -> BackfillResult:
    promtool = shutil.which("promtool")
    if promtool is None:
        raise BackfillError("promtool is not installed (apt-get install prometheus, or `fleetsight setup`)")
    started = time.monotonic()
    seconds = duration if duration is not None else scenario.duration
    ticks = max(1, math.ceil(seconds / scenario.tick))
    end = end or dt.datetime.now(dt.UTC)
    start = end - dt.timedelta(seconds=ticks * scenario.tick)
    scenario = replace(scenario, duration=ticks * scenario.tick)
    truth = truth if truth is not None else truthmod.default_truth_path(out)
    truthmod.check_outside(truth, out)
    sim, history = simulate_history(scenario, start, ticks)
    sim.refresh_truth()
    truthmod.write_lines(truth, sim.truth_lines)
    truthmod.write_scenario(truthmod.scenario_path(truth), scenario_info(sim))
    series, samples, blocks = cut_blocks(sim, history, out, keep_openmetrics)
    return BackfillResult(
        samples=samples,
        series=series,
        blocks=blocks,
        start=start.isoformat(timespec="seconds"),
        end=end.isoformat(timespec="seconds"),
        wall_seconds=time.monotonic() - started,
        truth=truth,
    )
