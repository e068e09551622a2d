"""Why a node is slow: which hardware signal (power brake, thermal throttle, PCIe, network) explains a
flagged GPU, with its values against its peers' median as evidence; and the per-GPU hardware signals
the detector's small-job paths use."""

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
