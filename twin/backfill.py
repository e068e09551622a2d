"""History for Prometheus without waiting: simulate a scenario at max speed, write its dcgm-exporter
series as OpenMetrics (one sample per tick, timestamps in the past), then let promtool cut TSDB blocks.

The series carry the labels a live scrape of the twin gets (dcgm-exporter's, plus node, cluster,
instance and job="dcgm"), so rules and dashboards see backfilled and live data alike.
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

from twin import render
from twin.scenario import Scenario
from twin.sim import G, Simulation

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


def simulate_history(
    scenario: Scenario, start: dt.datetime, ticks: int
) -> tuple[Simulation, dict[str, np.ndarray], np.ndarray]:
    """Run the physics only (no files) and keep each backfilled field per tick: [tick, node, gpu]."""
    sim = Simulation(scenario, start)
    fields = {name: field for name, _, _, field, _ in render.DCGM_FIELDS if name in BACKFILL_FIELDS}
    n = len(sim.nodes)
    history = {name: np.zeros((ticks, n, G), dtype=np.float32) for name in fields}
    present = np.zeros((ticks, n, G), dtype=bool)
    for tick in range(ticks):
        sim.advance()
        present[tick] = sim.gpu_present & sim.alive[:, None]
        for name, attribute in fields.items():
            history[name][tick] = render.dcgm_array(sim, attribute)
        sim.kernel_lines.clear()
        sim.app_lines.clear()
    return sim, history, present


def write_openmetrics(
    path: Path, sim: Simulation, history: dict[str, np.ndarray], present: np.ndarray, host: str
) -> tuple[int, int]:
    """Each family once, each series' samples in time order, then `# EOF`. Returns (series, samples)."""
    tick = sim.scenario.tick
    ticks = present.shape[0]
    stamps = [f"{sim.start_unix + i * tick:.3f}" for i in range(ticks)]
    series = samples = 0
    cluster = sim.scenario.cluster.name
    with open(path, "w") as handle:
        for name, values in history.items():
            handle.write(f"# TYPE {name} gauge\n")
            integer = name in render.INTEGER_FIELDS
            for node in range(len(sim.nodes)):
                for gpu in range(G):
                    labels = render.gpu_labels(sim, node, gpu, None)
                    labels += f',node="{sim.nodes[node]}",cluster="{cluster}",instance="{host}",job="dcgm"'
                    keep = present[:, node, gpu]
                    column = values[:, node, gpu]
                    texts = column.astype(np.int64).astype(str) if integer else np.char.mod("%.6g", column)
                    prefix = f"{name}{{{labels}}} "
                    handle.write(
                        "".join(f"{prefix}{texts[i]} {stamps[i]}\n" for i in range(ticks) if keep[i])
                    )
                    series += 1
                    samples += int(keep.sum())
        handle.write("# EOF\n")
    return series, samples


def backfill_blocks(
    scenario: Scenario,
    out: Path,
    duration: float | None = None,
    end: dt.datetime | None = None,
    keep_openmetrics: bool = False,
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
    sim, history, present = simulate_history(scenario, start, ticks)
    out.mkdir(parents=True, exist_ok=True)
    source = out / "twin-history.om"
    series, samples = write_openmetrics(source, sim, history, present, "twin-backfill")
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
    blocks = len({p.name for p in out.iterdir() if p.is_dir()} - before)
    return BackfillResult(
        samples=samples,
        series=series,
        blocks=blocks,
        start=start.isoformat(timespec="seconds"),
        end=end.isoformat(timespec="seconds"),
        wall_seconds=time.monotonic() - started,
    )
