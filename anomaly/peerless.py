"""Jobs of one node: no peers to compare with, so the node is compared with the fleet baseline for the
same GPU model (busy GPUs' SM clock and power in multi-node jobs) and flagged only on a hardware signal.

Its own module: the one-node rule shares none of the peer statistics of the multi-node paths, only the
fleet baseline (also what the blind-node check measures power against) and the flag bookkeeping.
"""

from __future__ import annotations

import math

import numpy as np

from .cause import cause_of, nanmedian, round_or_none
from .robust import safe_log
from .state import DetectorConfig, Event, JobState, Straggler
from .window import Window


def fleet_baseline(cfg: DetectorConfig, window: Window, models: np.ndarray) -> dict[str, tuple[float, float]]:
    """Per GPU model (``models``: each row's): the median SM clock and power of busy GPUs of
    multi-node jobs (a GPU whose profiling reads 0 is not busy here)."""
    busy = np.zeros(window.tensor.shape, dtype=bool)
    for node_idx in window.jobs.values():
        if len(node_idx) > 1:
            busy[node_idx] = window.tensor[node_idx] >= cfg.min_activity
    out: dict[str, tuple[float, float]] = {}
    for model in set(models.tolist()):
        mask = busy & (models == model)[:, None]
        if mask.any():
            out[model] = (nanmedian(window.sm_clock[mask]), nanmedian(window.power[mask]))
    return out


def score_peerless(
    cfg: DetectorConfig,
    job_id: str,
    state: JobState,
    window: Window,
    node: int,
    fleet: dict[str, tuple[float, float]],
    scores: list[tuple[str, str, int, float]],
    events: list[Event],
) -> None:
    """A one-node job: its SM clock against the fleet's busy GPUs of the same model, and its
    throttle bits. Without a hardware signal a lone slow node cannot be told from a slow model.
    Its GPUs' scores go to ``scores``, a flag or a clear to ``events``."""
    name = window.nodes[node]
    node_state = state.node_state[name]
    tensor = window.tensor[node]
    if not np.isfinite(tensor).any() or np.nanmax(tensor) < cfg.min_activity:
        return
    clock_ref, power_ref = fleet.get(window.gpu_model.get(node, ""), (math.nan, math.nan))
    if math.isfinite(clock_ref):
        deficit = safe_log(np.full(window.gpus, clock_ref)) - safe_log(window.sm_clock[node])
    else:
        deficit = np.zeros(window.gpus)
    z = np.where(np.isfinite(deficit), deficit / cfg.min_scale, 0.0)
    hardware = (window.brake[node] >= cfg.hardware_share) | (window.thermal[node] >= cfg.hardware_share)
    gpu = int(np.argmax(np.where(hardware, z, -np.inf))) if hardware.any() else int(np.argmax(z))
    for g in range(window.gpus):
        scores.append((job_id, name, g, max(0.0, float(z[g]))))
    is_candidate = bool((hardware & (z >= cfg.z_threshold)).any())
    node_state.recent.append(is_candidate)
    node_state.quiet_run = 0 if is_candidate else node_state.quiet_run + 1
    if node_state.flag is None and is_candidate and sum(node_state.recent) >= 2:
        cause, evidence = cause_of(cfg, window, [node], 0, gpu, float(z[gpu]))
        evidence["fleet_sm_clock_mhz_median"] = round_or_none(clock_ref)
        evidence["fleet_power_w_median"] = round_or_none(power_ref)
        evidence["path"] = "peerless"
        node_state.flag = Straggler(job_id, name, cause, gpu, float(z[gpu]), window.end, evidence, window.end)
        events.append(Event("flag", window.end, node_state.flag))
    elif node_state.flag is not None and node_state.quiet_run >= cfg.clear_after:
        events.append(Event("clear", window.end, node_state.flag))
        node_state.flag = None
        node_state.recent.clear()
