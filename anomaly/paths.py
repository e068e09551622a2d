"""The detector's decision paths beyond the one-window z-score: which GPUs of a scored window are
candidates on the slow path (a small slowdown averaged over windows), the step path (a sudden lasting
rise in a small job) and the hardware path (a throttled or link-starved GPU busier than its peers in a
small job); which are large slowdowns its peers wait for (the fast path, flagged in one window); and
whether a window is disturbed (a loud node, or peers scattering as they wait).

The slow path averages the residual over the last ``slow_windows`` windows, for ~10 % stragglers that
hide in one window's noise, with a physical floor (``slow_min_effect``) that benign jitter stays under;
a shorter average (``short_windows``) decides sooner when it is significantly above that floor.
Disturbed windows are left out of the averages. In jobs whose nodes wander by themselves
(mixture-of-experts routing moves load between nodes for minutes), measured by how far the job's
averages wandered lately, the slow path needs a hardware signal too.

Its own module: each path is a rule tuned on its own failure (mild gray nodes, expert routing, throttle
bits); the persistence that turns candidates into flags is the detector's (detector.py).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from .cause import gpu_signals, hardware_signal, nanmedian
from .job_model import remember
from .robust import leave_one_out_median, pooled_spread, row_medians, safe_log
from .state import Candidate, DetectorConfig, JobState
from .window import Window


def slow_path(cfg: DetectorConfig, state: JobState, candidate: Candidate, window: Window) -> np.ndarray:
    """Small slowdowns (~10 %) hide in one window's noise: the mean residual over the last
    ``slow_windows`` counted windows must be a physical effect (``slow_min_effect``) and
    significant (the scale shrinks with the square root of the windows averaged). Benign
    disturbances (a minute of OS jitter, a rank logging slowly by a few per cent) stay below.
    A shorter average (``short_windows``) decides sooner when it is significantly *above* the
    largest benign effect, not just above zero: a 15-20 % straggler in a noisy job."""
    none = np.zeros(candidate.z.shape, dtype=bool)
    state.slow_wait = state.wait_now = None
    # The peers' wait is kept only where the slow path asks for it (never in smaller jobs, nor when off)
    asks = cfg.slow_wait is not None and len(candidate.window_nodes) >= cfg.fast_min_nodes
    if disturbed(cfg, state, candidate):
        # A loud straggler's peers wait, and waiting activity is too noisy to average: the window
        # enters the averages empty (the one-window test handles loud stragglers), so that time still
        # passes and no average is made of windows from before a long episode.
        state.recent_resid.append(np.full(candidate.resid.shape, np.nan))
        if asks:
            state.waits.append(np.full(len(candidate.window_nodes), np.nan))
        return none
    state.recent_resid.append(candidate.resid)
    if asks:
        state.wait_now = peers_wait(state, candidate, window)
        state.waits.append(state.wait_now)
    if len(state.recent_resid) < cfg.short_windows:
        return none
    stack = np.stack(list(state.recent_resid)[-cfg.slow_windows :])
    drift = pooled_spread(state.drift)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        short = np.nanmean(stack[-cfg.short_windows :], axis=0)
        mean = np.nanmean(stack, axis=0)
    short_scale = np.maximum(candidate.scale / math.sqrt(cfg.short_windows), drift)
    slow = short - cfg.slow_min_effect >= cfg.z_threshold * short_scale
    if len(stack) >= cfg.slow_windows:
        state.slow_mean = mean
        scale = _slow_scale(cfg, candidate, mean, drift)
        remember(state.drift, mean, state)
        slow |= (mean >= cfg.slow_min_effect) & (mean / scale >= cfg.z_threshold)
    if note_wander(cfg, state, drift):
        # The job's nodes wander by themselves (expert routing): a mild straggler cannot be told
        # from the job's own imbalance unless the hardware says so (or it stepped in: step path).
        slow &= hardware_signal(cfg, window, candidate.window_nodes)[:, None]
    if slow.any() and asks:
        slow &= _peers_waited(cfg, state)[:, None]
    slow &= candidate.kept_pace
    return np.where(np.isfinite(short), slow, False)


def _peers_waited(cfg: DetectorConfig, state: JobState) -> np.ndarray:
    """Per node: did its peers wait for it over the slow path's windows (the median of their wait above
    ``slow_wait``)? Kept in ``state.slow_wait`` for the flag's evidence. Unknown (no peer has a usual
    level yet) is not a wait."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        state.slow_wait = np.nanmedian(np.stack(list(state.waits)), axis=0)
    return np.nan_to_num(state.slow_wait, nan=-np.inf) > cfg.slow_wait


def long_path(
    cfg: DetectorConfig, state: JobState, candidate: Candidate, window: Window
) -> tuple[np.ndarray, np.ndarray]:
    """Per GPU: a 5 % straggler, too small for the slow path's floor (``slow_min_effect``) over 8
    windows, shows over ``long_windows``: a mean residual of at least ``long_min_effect`` that is
    significant against the mean's own scale (as the slow path's: a window's scale over the square root
    of the windows averaged, the spread of the node means, the job's drift). Reads the residuals the
    slow path kept (call it after slow_path). Also the mean, so that a node above the floor does not
    learn the straggler as its normal while it builds up."""
    none = np.zeros(candidate.z.shape, dtype=bool)
    unsettled = state.since_flag < cfg.long_windows  # a straggler's episode is in the mean
    if len(state.recent_resid) < cfg.long_windows or len(candidate.window_nodes) < 2 or unsettled:
        return none, np.full(candidate.z.shape, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(np.stack(list(state.recent_resid)[-cfg.long_windows :]), axis=0)
    drift = pooled_spread(state.drift)
    scale = np.maximum(candidate.scale / math.sqrt(cfg.long_windows), drift)
    if len(candidate.window_nodes) >= 4:
        spread = 1.4826 * nanmedian(np.abs(mean - nanmedian(mean)))
        if math.isfinite(spread):
            scale = np.maximum(scale, spread)
    hit = (np.nan_to_num(mean) >= cfg.long_min_effect) & (np.nan_to_num(mean) / scale >= cfg.z_threshold)
    if wanders(cfg, state, drift):
        hit &= hardware_signal(cfg, window, candidate.window_nodes)[:, None]
    return hit & candidate.kept_pace, mean


def wanders(cfg: DetectorConfig, state: JobState, gauge: float | None = None) -> bool:
    """Do the job's nodes wander by themselves (expert routing): its drift gauge now (``gauge``, where
    the caller has just measured it), or within the last ``wander_memory`` counted windows (a lull in
    the routing is not a new kind of job)?"""
    if state.wander_left > 0 or presumed_wandering(cfg, state):
        return True
    return (pooled_spread(state.drift) if gauge is None else gauge) > cfg.wander_drift


def declared_wandering(cfg: DetectorConfig, state: JobState) -> bool:
    """The job declares its expert routing and is small enough for that to count
    (``declared_routing_below``)."""
    return state.declared_routing and len(state.nodes) < cfg.declared_routing_below


def fast_path_runs(cfg: DetectorConfig) -> bool:
    """The fast path is on and each sample averages long enough for it (``fast_min_sample_s``)."""
    return cfg.fast_windows > 0 and cfg.sample_average_s >= cfg.fast_min_sample_s


def presumed_wandering(cfg: DetectorConfig, state: JobState) -> bool:
    """A job of a few nodes that declares its expert routing wanders, always (``declared_wandering``).
    Otherwise, until a layout's drift gauge has its full pool (``noise_windows`` means) it cannot say
    that the job is calm: the job counts as wandering meanwhile where an earlier layout of it wandered
    (or every job, with ``wander_until_learnt``)."""
    if declared_wandering(cfg, state):
        return True
    return len(state.drift) < cfg.noise_windows and (state.carried_wander or cfg.wander_until_learnt)


def note_wander(cfg: DetectorConfig, state: JobState, drift: float) -> bool:
    """The slow path's reading of the gauge, once per counted window: remembers a wander for
    ``wander_memory`` windows and counts the memory down."""
    if drift > cfg.wander_drift:
        state.wandered = True
        state.wander_left = cfg.wander_memory
        return True
    state.wander_left = max(0, state.wander_left - 1)
    return state.wander_left > 0 or presumed_wandering(cfg, state)


def _slow_scale(cfg: DetectorConfig, candidate: Candidate, mean: np.ndarray, drift: float) -> np.ndarray:
    """The scale of the slow path's long average: a window's scale over the windows averaged, widened
    by how far the averages wander across nodes and over time."""
    scale = candidate.scale / math.sqrt(cfg.slow_windows)  # independent windows
    if len(candidate.window_nodes) >= 4:
        # Peers whose load drifts for minutes (mixture-of-experts routing) are not
        # independent from window to window: the spread of the averages says how far they
        # wander.
        spread = 1.4826 * nanmedian(np.abs(mean - nanmedian(mean)))
        if math.isfinite(spread):
            scale = np.maximum(scale, spread)
    # The same over time, which also works for two or three nodes: how far this job's
    # averages wandered in the last minutes (expert routing drifts ~5 % with ~10 min memory).
    return np.maximum(scale, drift)


def step_path(cfg: DetectorConfig, state: JobState, candidate: Candidate, window: Window) -> np.ndarray:
    """Per GPU of a job under ``few_nodes`` nodes: a sudden rise that lasts. Mixture-of-experts
    routing moves load between a small job's nodes by 15-25 %, but slowly (minutes of memory), so
    the slow path there needs a hardware signal. A gray node breaks in from one window to the
    next: the mean residual of the last ``step_after`` windows is above the mean of the
    ``step_before`` before them by ``strong_effect`` (twice the largest benign effect), each of
    them by ``slow_min_effect``, and by ``z_threshold`` times the spread of the rises this job
    showed lately (routing drift and sampling noise included). And the node itself got busier:
    in two nodes a residual also rises when the *peer's* samples fall (a DCGM sampler that keeps
    landing in the communication phase for a minute), but a straggler does more of each step
    itself. Disturbed windows count here: in a few nodes a loud straggler is what disturbs them."""
    none = np.zeros(candidate.z.shape, dtype=bool)
    if len(candidate.window_nodes) >= cfg.few_nodes:  # big jobs keep no step history at all
        return none
    state.steps.append((candidate.resid, safe_log(window.tensor[candidate.window_nodes])))
    if len(state.steps) < (state.steps.maxlen or 0):
        return none
    resid = np.stack([r for r, _ in state.steps])
    own = np.stack([t for _, t in state.steps])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        # From the node's usual level at the lowest: a node whose peer stops straggling rises
        # back from below it (it waited), and that is a recovery, not a step.
        before = np.maximum(np.nanmean(resid[: -cfg.step_after], axis=0), 0.0)
        rises = resid[-cfg.step_after :] - before
        rise = np.nanmean(rises, axis=0)
        lowest = np.nanmin(rises, axis=0)
        own_rise = np.nanmean(own[-cfg.step_after :], axis=0) - np.nanmean(own[: -cfg.step_after], axis=0)
    noise = pooled_spread(state.rises) if len(state.rises) >= cfg.step_before else math.inf
    remember(state.rises, rise, state)
    hit = (
        (rise >= cfg.strong_effect)
        & (lowest >= cfg.slow_min_effect)
        & (rise >= cfg.z_threshold * noise)
        & (own_rise >= cfg.own_drop)
    )
    finite = np.isfinite(rise) & np.isfinite(lowest) & np.isfinite(own_rise)
    return np.where(finite, hit, False) & candidate.kept_pace


def hardware_path(cfg: DetectorConfig, candidate: Candidate, window: Window) -> np.ndarray:
    """Per GPU of a job under ``few_nodes`` nodes, busier than usual against its peers: a throttle
    bit while its power or SM clock is below theirs, or a downgraded PCIe link on that GPU.

    A small job's scale is as wide as its own imbalance (mixture-of-experts routing swings the
    load between two nodes by ~25 %), which can hide even a loud straggler from the z-score.
    But a busier node draws *more* power than its peer at the same clock; one that does more
    work with less power or a lower clock, and says it is throttled, is the slow one."""
    node_idx = candidate.window_nodes
    shape = candidate.z.shape
    if not 2 <= len(node_idx) < cfg.few_nodes:
        return np.zeros(shape, dtype=bool)
    throttled, link = gpu_signals(cfg, window, node_idx)
    power_ratio = candidate.features[:, 1].reshape(shape)
    clock_ratio = candidate.features[:, 2].reshape(shape)
    lower = (np.nan_to_num(power_ratio) <= -cfg.hw_lower) | (np.nan_to_num(clock_ratio) <= -cfg.hw_lower)
    # A throttled GPU does its work at a lower clock or power. A starved link does not lower either:
    # the GPU stays busy longer at its clock (power 14-22 % *above* its peers', gen_3026's Gen2 GPU
    # in a 3-node MoE job), and the downgrade names that very GPU, which no healthy one shows
    # (unlike the software power-cap bit of busy H100s).
    signal = (throttled & lower) | link
    busier = np.nan_to_num(candidate.resid, nan=-np.inf) >= cfg.slow_min_effect
    return signal & busier & candidate.kept_pace


def peers_wait(state: JobState, candidate: Candidate, window: Window) -> np.ndarray:
    """Per node, how far (log) its peers' activity sits below their own usual level: the median over
    the other nodes of each node's median GPU change (NaN where no peer has learnt its level).

    Physics: when one node computes x f longer per step, every peer waits for it, and their activity
    falls by the job's slowdown, while the slow node keeps its own. A node whose samples jump by
    themselves (the sampler landing in another phase) leaves its peers where they were."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        change = row_medians(safe_log(window.tensor[candidate.window_nodes]) - state.own)
        return -leave_one_out_median(change)


def fast_path(
    cfg: DetectorConfig, state: JobState, candidate: Candidate, window: Window, looking: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per GPU: a slowdown too large for one window's noise plus any benign effect, that its peers
    wait for (issue 42: a 20 % straggler is plain in one window; a mild one needs the slow path's
    averages). Also each node's peers' wait, for the evidence.

    The residual must clear the largest benign effect (``slow_min_effect``) by ``fast_z`` scales of
    one window's noise (the scale z divides by: the job's usual spread, its recent residuals in small
    jobs), and be at least ``strong_effect``; and the node's peers (``fast_min_nodes`` nodes in the
    job at least) must have fallen at least ``fast_wait`` below their own usual activity, busy waiting
    (``peers_running``). Only the nodes ``looking`` (per node: the detector asks where the one-window
    test holds, in a job without a flagged node, and flags only a strong candidate so)."""
    # The slow path runs first each window and, in the jobs it asks, took this window's wait already.
    wait = state.wait_now if state.wait_now is not None else peers_wait(state, candidate, window)
    if len(candidate.window_nodes) < cfg.fast_min_nodes:
        return np.zeros(candidate.z.shape, dtype=bool), wait
    margin = (np.nan_to_num(candidate.resid, nan=-np.inf) - cfg.slow_min_effect) / candidate.scale
    large = (margin >= cfg.fast_z) & (np.nan_to_num(candidate.resid) >= cfg.strong_effect)
    waited = np.nan_to_num(wait, nan=-np.inf) >= cfg.fast_wait
    fast = large & (waited & looking)[:, None] & candidate.kept_pace
    if fast.any():
        fast &= peers_running(cfg, candidate, window)[:, None]
    return fast, wait


def peers_running(cfg: DetectorConfig, candidate: Candidate, window: Window) -> np.ndarray:
    """Per node: do its peers still run kernels (the median of the other nodes' GPU utilisation at
    least ``fast_util``)? Peers waiting for a straggler spin in NCCL kernels (~100 %); peers caught
    idle in at least half of the window's samples read 50 % or less. Live, each node's samples come
    from its own scrape times, so the window where a checkpoint (or a job-wide stall) starts or ends
    can catch some nodes computing while the others are already (or still) idle: those look busier
    than their peers, which look as if they waited, and only their utilisation tells. Utilisation is
    an evidence field (read on demand, ``Window.load_evidence``: the cause of any candidate reads it
    too); where it cannot be read, the fast path does not decide."""
    node_idx = candidate.window_nodes
    window.load_evidence(node_idx)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        util = np.nanmedian(window.util[node_idx], axis=1)
        return np.nan_to_num(leave_one_out_median(util), nan=-np.inf) >= cfg.fast_util


def disturbed(cfg: DetectorConfig, state: JobState, candidate: Candidate) -> bool:
    """A window where some node is loud, or the peers scatter far more than usual (they wait for
    a straggler, or the job is unsettled)."""
    if np.nan_to_num(candidate.z).max() >= cfg.z_strong:
        return True
    if len(candidate.window_nodes) < cfg.few_nodes:  # a few nodes' spread swings by itself
        return False
    usual = state.spread
    return math.isfinite(candidate.spread) and math.isfinite(usual) and candidate.spread > 2 * usual
