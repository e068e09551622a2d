"""Blind nodes: the members of a job the straggler detector cannot see this cycle, found before anything
is scored, and reported with their reason.

A node whose profiling fields read 0 while its power says it computes (DCGM's profiling module held by
another client), that publishes power but no tensor activity, or that has no sample at all (a member of
the job in earlier windows whose dcgm-exporter fell silent) cannot be scored: its tensor activity is
taken out of the window before anything is computed (it sets no peer's median), it is neither a
candidate nor quiet (a flag it had is held, not cleared), and it is reported as a
:class:`~anomaly.state.Blind` with its reason. A silent member keeps its row (NaN), so that the job's
learnt state and flags survive the exporter's outage.

Its own module: what counts as blind changes with DCGM's and the exporters' failure modes, not with the
statistics that score the nodes that are seen.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from .state import BLIND_REASONS, Blind, DetectorConfig, JobState, Unseen
from .window import Window

# A node's blind reason as a code per window row (0: seen), in BLIND_REASONS' order.
DROPOUT, ABSENT, SILENT = 1, 2, 3


def with_silent_members(window: Window, jobs: Mapping[str, JobState]) -> Window:
    """The window with a row of NaN for every node that a job had in its earlier windows and that
    has no sample at all now (its dcgm-exporter is silent), in the job's order: the job keeps its
    learnt state and flags (a change of nodes starts a job afresh), and the node is seen as
    ``no_samples``. A node that left the job (it answers, idle or in another job), or a job that
    also gained a node, is a new layout as before. Nothing is copied when no job lost a node."""
    grown_jobs: dict[str, list[int]] | None = None
    index: dict[str, int] | None = None
    extra: list[str] = []
    for job_id, node_idx in window.jobs.items():
        state = jobs.get(job_id)
        if state is None or not 0 < len(node_idx) < len(state.nodes):
            continue
        if index is None:
            index = {name: i for i, name in enumerate(window.nodes)}
        names = {window.nodes[i] for i in node_idx}
        if not names <= set(state.nodes):
            continue
        missing = [name for name in state.nodes if name not in names]
        if any(index.get(name, len(window.nodes)) < len(window.nodes) for name in missing):
            continue  # it answers (idle, or in another job): it left the job
        for name in missing:
            if name not in index:
                index[name] = len(window.nodes) + len(extra)
                extra.append(name)
        grown_jobs = dict(window.jobs) if grown_jobs is None else grown_jobs
        grown_jobs[job_id] = [index[name] for name in state.nodes]
    if grown_jobs is None:
        return window

    def grown(array: np.ndarray, fill: float) -> np.ndarray:
        return np.concatenate([array, np.full((len(extra), *array.shape[1:]), fill)])

    nan = {key: grown(getattr(window, key), np.nan) for key in ("tensor", "power", "sm_clock", "util")}
    zero = {key: grown(getattr(window, key), 0.0) for key in ("brake", "thermal", "pcie_downgraded")}
    return dataclasses.replace(
        window,
        nodes=[*window.nodes, *extra],
        **nan,
        **zero,
        h2d_bandwidth=grown(window.h2d_bandwidth, np.nan),
        ib_errors=grown(window.ib_errors, 0.0),
        ib_xmit_wait=grown(window.ib_xmit_wait, 0.0),
        ib_rcv_rate=grown(window.ib_rcv_rate, np.nan),
        jobs=grown_jobs,
    )


def blind_view(
    cfg: DetectorConfig,
    window: Window,
    fleet: dict[str, tuple[float, float]],
    models: np.ndarray,
    unseen: Mapping[str, Unseen],
) -> tuple[Window, np.ndarray | None, np.ndarray | None]:
    """Which nodes the detector cannot see, fleet-wide and vectorised: per row a reason code
    (DROPOUT, ABSENT, SILENT; None when every node is seen), the per-GPU mask that gave it, and the
    window to score, whose tensor activity is NaN on those rows (nothing else changes: their power
    and clocks are NVML's and stay true). ``unseen`` is what the last cycle reported blind.

    A GPU drops out when its tensor activity reads 0 (``blind_tensor``) while it draws at least
    ``blind_busy_ratio`` of the median power of the cycle's computing GPUs of its model and at least
    ``blind_busy_w``, and it stays so, whatever its power, until it reads tensor activity again:
    in a checkpoint or a stall nothing tells the module's silence from an idle GPU. One such GPU
    takes its whole node out (a profiler on the node may also slow it a little)."""
    tensor, power = window.tensor, window.power
    busy_w = np.full(len(window.nodes), cfg.blind_busy_w)
    for model, (_, watts) in fleet.items():
        if math.isfinite(watts) and cfg.blind_busy_ratio * watts > cfg.blind_busy_w:
            busy_w[models == model] = cfg.blind_busy_ratio * watts
    dropout = (tensor <= cfg.blind_tensor) & (power >= busy_w[:, None])  # NaN compares False
    if unseen:
        alive = tensor > cfg.blind_tensor
        index = {name: i for i, name in enumerate(window.nodes)}
        for name, before in unseen.items():
            row = index.get(name)
            if row is not None and before.held is not None and before.held.shape == alive[row].shape:
                dropout[row] |= before.held & ~alive[row]
    measured = np.isfinite(tensor)
    absent = ~measured & np.isfinite(power)
    silent = ~(measured | np.isfinite(power)).any(axis=1)
    dropped, missing = dropout.any(axis=1), absent.any(axis=1)
    if not (dropped.any() or missing.any() or silent.any()):
        return window, None, None
    reasons = np.where(dropped, DROPOUT, np.where(missing, ABSENT, np.where(silent, SILENT, 0)))
    gpus = np.where(dropped[:, None], dropout, absent)
    masked = tensor.copy()
    masked[reasons > 0] = np.nan
    return dataclasses.replace(window, tensor=masked), reasons, gpus


def report_blind(
    job_id: str,
    window: Window,
    node_idx: list[int],
    job_blind: np.ndarray,
    blind_gpus: np.ndarray | None,
    previous: Mapping[str, Unseen],
    blind: list[Blind],
    unseen: dict[str, Unseen],
) -> None:
    """The job's blind nodes as reports (appended to ``blind``), and what the next cycle keeps of them
    (into ``unseen``); ``previous`` is what the last cycle kept, for the time each node went blind."""
    cluster = ""
    for pos in np.flatnonzero(job_blind).tolist():
        row = node_idx[pos]
        name, code = window.nodes[row], int(job_blind[pos])
        reason = BLIND_REASONS[code - 1]
        before = previous.get(name) or unseen.get(name)
        since = before.since if before is not None else window.end
        mask = blind_gpus[row].copy() if blind_gpus is not None and code != SILENT else None
        gpus = np.flatnonzero(mask).tolist() if mask is not None else []
        unseen[name] = Unseen(reason, since, mask if code == DROPOUT else None)
        if row not in window.node_cluster and not cluster:  # a silent node: its peers' cluster
            cluster = next((window.node_cluster[i] for i in node_idx if i in window.node_cluster), "")
        blind.append(Blind(job_id, name, reason, gpus, since, window.node_cluster.get(row, cluster)))
