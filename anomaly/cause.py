"""Why a node is slow: which hardware signal (power brake, thermal throttle, PCIe, clocks, network)
explains a flagged GPU, with its values against its peers' median as evidence; whether one GPU or the
whole node is slow; what the slowdown costs the job; and the per-GPU hardware signals the detector's
small-job paths use."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .state import DetectorConfig
from .window import Window


def gpu_signals(cfg: DetectorConfig, window: Window, node_idx: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per GPU: a throttle bit (brake or thermal) in most of the window's samples; a downgraded
    PCIe link."""
    share = cfg.hardware_share
    throttled = (np.nan_to_num(window.brake[node_idx]) >= share) | (
        np.nan_to_num(window.thermal[node_idx]) >= share
    )
    return throttled, np.nan_to_num(window.pcie_downgraded[node_idx]) > 0


def hardware_signal(cfg: DetectorConfig, window: Window, node_idx: list[int]) -> np.ndarray:
    """Per node: a throttle bit in most of the window's samples or a downgraded PCIe link."""
    throttled, link = gpu_signals(cfg, window, node_idx)
    return (throttled | link).any(axis=1)


def cause_of(
    cfg: DetectorConfig, window: Window, node_idx: list[int], pos: int, gpu: int, z: float
) -> tuple[str, dict[str, Any]]:
    """Which hardware signal explains the slow node, and its values against the peers' median."""
    node = node_idx[pos]
    peers = [i for i in node_idx if i != node]
    window.load_evidence(node_idx)

    def node_vs_peers(array: np.ndarray, per_gpu: bool = True) -> tuple[float, float]:
        value = array[node, gpu] if per_gpu else nanmedian(array[node])
        peer = nanmedian(array[peers]) if peers else math.nan
        return float(value), peer

    evidence: dict[str, Any] = {"gpu": gpu, "z": round(z, 2)}
    for key, array in (
        ("tensor_active", window.tensor),
        ("power_w", window.power),
        ("sm_clock_mhz", window.sm_clock),
        ("gpu_util_pct", window.util),
    ):
        value, peer = node_vs_peers(array)
        evidence[key] = round_or_none(value)
        evidence[f"{key}_peers_median"] = round_or_none(peer)
    brake = float(np.nanmax(window.brake[node]))
    thermal = float(np.nanmax(window.thermal[node]))
    downgraded = bool(np.nanmax(window.pcie_downgraded[node]) > 0)
    h2d, h2d_peers = node_vs_peers(window.h2d_bandwidth)
    ib_errors = float(window.ib_errors[node])
    ib_errors_peers = nanmedian(window.ib_errors[peers]) if peers else 0.0
    wait = float(window.ib_xmit_wait[node])
    wait_peers = nanmedian(window.ib_xmit_wait[peers]) if peers else 0.0
    evidence.update(
        power_brake_share=round(brake, 2),
        thermal_share=round(thermal, 2),
        pcie_downgraded=downgraded,
        h2d_bandwidth_bytes_per_second=round_or_none(h2d),
        h2d_bandwidth_peers_median=round_or_none(h2d_peers),
        ib_errors=round_or_none(ib_errors),
        ib_errors_peers_median=round_or_none(ib_errors_peers),
        ib_xmit_wait_per_second=round_or_none(wait),
        ib_xmit_wait_peers_median=round_or_none(wait_peers),
    )
    if brake >= cfg.hardware_share:
        return "power_brake", evidence
    if thermal >= cfg.hardware_share:
        return "thermal", evidence
    slow_link = math.isfinite(h2d) and math.isfinite(h2d_peers) and h2d < 0.5 * h2d_peers
    if downgraded or slow_link:
        return "pcie", evidence
    clock, clock_peers = evidence["sm_clock_mhz"], evidence["sm_clock_mhz_peers_median"]
    if clock is not None and clock_peers and clock < (1.0 - cfg.clock_drop) * clock_peers:
        # Slower clocks: a throttle bit in a few samples is their reason already (a GPU heating up
        # throttles on and off before it throttles for good); with none, a power limit or clocks set
        # lower on this GPU (nvidia-smi -pl / -lgc), or a slowdown DCGM gives no reason for.
        if brake > 0:
            return "power_brake", evidence
        if thermal > 0:
            return "thermal", evidence
        return "clocks", evidence
    peer_errors = ib_errors_peers if math.isfinite(ib_errors_peers) else 0.0
    peer_wait = wait_peers if math.isfinite(wait_peers) else 0.0
    if ib_errors >= max(5.0, 10.0 * peer_errors) or wait > 3.0 * peer_wait + 1e5:
        return "network", evidence
    return "unknown", evidence


def nanmedian(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if finite.size else math.nan


def round_or_none(value: float) -> float | None:
    return round(float(value), 4) if math.isfinite(value) else None


def gpu_scope(resid: np.ndarray) -> tuple[str, list[int]]:
    """Whether one GPU or the whole node is slow, and which GPUs: those whose residual (log activity
    above the job's peers) is at least half the node's largest. In a data-parallel job one slow GPU
    makes its node-mates wait as its other peers do, so they show no residual; a slow host slows them
    all alike. More than half the node's GPUs slow is the node ("node"), else those GPUs ("gpu")."""
    finite = np.isfinite(resid)
    top = float(np.max(resid[finite])) if finite.any() else math.nan
    if not math.isfinite(top) or top <= 0:
        return "node", []
    slow = [int(g) for g in np.flatnonzero(finite & (resid >= 0.5 * top))]
    return ("gpu" if len(slow) <= int(finite.sum()) // 2 else "node"), slow


def job_impact(fallen: float, job_gpus: int, elapsed_s: float, lost_before: float = 0.0) -> dict[str, float]:
    """What the straggler costs its job, estimated from the GPU activity: in a synchronous job every
    step waits for the slowest rank, so its peers' activity falls below their own usual level by the
    job's slowdown (``fallen``, log); each GPU of the job idles that share of the time. GPU-hours lost
    so far add this window's share (``elapsed_s`` since the last estimate) to those counted before."""
    slowdown = math.expm1(max(0.0, fallen))
    idle_share = slowdown / (1.0 + slowdown)
    lost = lost_before + idle_share * job_gpus * max(0.0, elapsed_s) / 3600.0
    return {
        "job_slowdown_pct": round(100.0 * slowdown, 1),
        "job_gpus": job_gpus,
        "gpu_hours_lost": round(lost, 3),
    }
