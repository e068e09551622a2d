"""The detector's per-job model: each GPU's tensor activity in a window against its job's other nodes
and its own learnt offset, as a robust z (a :class:`~anomaly.state.Candidate`), and what a job learns
from a window.

Per job and window, every GPU's window-median tensor activity is compared (in logs) with the median of
the *other* nodes of its job. Healthy peers differ systematically (pipeline stages, silicon, cooling), so
each GPU keeps an exponentially weighted history of that deviation (its own offset and spread), capped
at ``max_offset`` so that a fault present from the start is not learnt as normal. The residual is
divided by a robust scale: the job's cross-sectional MAD (four or more nodes), the robust spread of the
job's last ``noise_windows`` residuals (under ``few_nodes`` nodes; under four also the GPU's own
history), and a floor (``min_scale``), whichever is largest.

Its own module: how a window is scored and learnt is the statistics; which scores make a flag is the
decision (paths.py, detector.py).
"""

from __future__ import annotations

import math
import warnings
from collections import deque

import numpy as np

from .cause import nanmedian
from .covariance import OutlierModel
from .robust import leave_one_out_median, pooled_spread, row_medians, safe_log
from .state import Candidate, DetectorConfig, JobState, NodeState
from .window import Window


def new_job_state(cfg: DetectorConfig, names: list[str], gpus: int) -> JobState:
    """A job's state before its first window: nothing learnt."""
    shape = (len(names), gpus)
    return JobState(
        nodes=tuple(names),
        mu=np.zeros(shape),
        var=np.zeros(shape),
        count=np.zeros(shape, dtype=np.int64),
        own=np.full(shape, np.nan),
        recent_resid=deque(maxlen=max(cfg.slow_windows, cfg.long_windows)),
        steps=deque(maxlen=cfg.step_before + cfg.step_after),
        waits=deque(maxlen=cfg.slow_windows),
        rises=deque(maxlen=cfg.noise_windows),
        noise=deque(maxlen=cfg.noise_windows),
        drift=deque(maxlen=cfg.noise_windows),
        node_state={n: NodeState(recent=deque(maxlen=cfg.n)) for n in names},
    )


def remember(pool: deque[np.ndarray], values: np.ndarray, state: JobState) -> None:
    """Keep a window's per-GPU values for the job's noise, without its flagged nodes (an episode
    must not widen the noise that hides it)."""
    flagged = np.array([state.node_state[name].flag is not None for name in state.nodes])
    pool.append(np.where(flagged[:, None], np.nan, values))


def score_job(
    cfg: DetectorConfig, job_id: str, state: JobState, window: Window, node_idx: list[int]
) -> Candidate | None:
    """Robust z of every GPU's tensor activity against its peers and its own history; None when
    the whole job moves together (the window does not count)."""
    tensor = window.tensor[node_idx]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        node_level = row_medians(tensor)
    top = float(np.nanmax(node_level)) if np.isfinite(node_level).any() else math.nan
    if not math.isfinite(top) or top < cfg.min_activity:
        return None
    if not math.isfinite(state.level):
        # The job's first busy window straddles its start-up: some samples still idle, others
        # computing, unevenly per node. Learnt as the job's first offsets, it would stick (a
        # disturbed window teaches no one): it only sets the level, and counts for nothing.
        state.level = top
        return None
    if top < cfg.quiet_ratio * state.level:
        return None
    state.level = state.level + 0.1 * (top - state.level)
    state.windows += 1
    ref = leave_one_out_median(node_level)
    resid = safe_log(tensor) - safe_log(ref)[:, None] - state.mu
    scale, spread = _scale(cfg, state, resid, len(node_idx))
    z = resid / scale
    power = safe_log(window.power[node_idx])
    clock = safe_log(window.sm_clock[node_idx])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        power_ref = leave_one_out_median(row_medians(power))
        clock_ref = leave_one_out_median(row_medians(clock))
    features = np.stack([z, power - power_ref[:, None], clock - clock_ref[:, None]], axis=-1).reshape(-1, 3)
    fallen = safe_log(tensor) - state.own < -cfg.own_drop
    kept_pace = ~np.where(np.isfinite(state.own), fallen, False)
    return Candidate(
        job=job_id,
        z=z,
        features=features,
        window_nodes=node_idx,
        spread=spread,
        kept_pace=kept_pace,
        resid=resid,
        scale=scale,
    )


def _scale(cfg: DetectorConfig, state: JobState, resid: np.ndarray, nodes: int) -> tuple[np.ndarray, float]:
    """Per GPU, the scale its residual divides by; and this window's cross-sectional spread (NaN under
    four nodes). Small jobs also add this window's residuals to their noise pool."""
    # The scale comes from calm windows: while a node straggles its peers wait, and waiting makes
    # their activity noisy, which would inflate this window's own spread and hide the straggler.
    scale = np.full(resid.shape, cfg.min_scale)
    spread = math.nan
    if nodes >= 4:
        centre = nanmedian(resid)
        spread = 1.4826 * nanmedian(np.abs(resid - centre))
        usual = state.spread if math.isfinite(state.spread) else spread
        if math.isfinite(usual):
            scale = np.maximum(scale, usual)
    if nodes < cfg.few_nodes:
        # No cross-section to speak of: the GPU's own spread, and the job's recent windows (its
        # own spread needs calm windows to learn from; these do not). A 4-node mixture-of-experts
        # job learnt a cross-sectional spread of 2 % in its first calm windows, and routing then
        # swung its nodes by 15-25 %: z 7-11 on healthy nodes (gen_7209, 6 wrong flags).
        own = np.where(state.count >= cfg.min_history, np.sqrt(state.var), 0.0)
        if nodes >= 4:
            # Not from four nodes on: a GPU's own history also learns while a peer straggles (its
            # waiting scatters), and a 4-node job's next straggler came 2 minutes late behind it.
            own = np.zeros_like(own)
        scale = np.maximum(np.maximum(scale, own), pooled_spread(state.noise))
        if not any(node.flag is not None for node in state.node_state.values()):
            # While a node is flagged its peers wait, and waiting scatters their activity: an
            # hour-long PCIe straggler in a 4-node job widened the pool so much that the next
            # straggler, a x1.2 gray node, was flagged 150 s later than with the job's own spread.
            remember(state.noise, resid, state)
    return scale, spread


def drifting(cfg: DetectorConfig, state: JobState) -> np.ndarray:
    """Per GPU: its slow-path mean runs at least half ``slow_min_effect`` above its offset (drifting
    away, maybe a mild fault setting in); all False before the slow path has a mean."""
    if state.slow_mean is None:
        return np.zeros(state.mu.shape, dtype=bool)
    return np.nan_to_num(state.slow_mean) >= cfg.slow_min_effect / 2


def learn(
    cfg: DetectorConfig,
    state: JobState,
    candidate: Candidate,
    window: Window,
    busy: np.ndarray,
    model: OutlierModel,
    wandering: bool,
) -> None:
    """Update the history of every GPU of the nodes that are not ``busy``; their feature rows go to
    the covariance ``model``'s calm reservoir. ``wandering``: the job routes experts now
    (paths.wanders), where ``DetectorConfig.wander_thaw`` lets a drifting GPU learn back up to 0."""
    node_idx = candidate.window_nodes
    tensor = window.tensor[node_idx]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ref = leave_one_out_median(row_medians(tensor))
    dev = safe_log(tensor) - safe_log(ref)[:, None]
    ok = np.isfinite(dev) & ~busy[:, None]
    # A GPU's first windows average with equal weights, so one window of a (re)start that is still
    # uneven would set an offset no layout has (demo: after job 4101 restarted, n0007 learnt -5 %
    # from a window at -69 % while it loaded, then ran +5 % above that for 40 minutes, never
    # learnt as it counted as drifting, and was flagged). A first window further from the peers than
    # offset_first_limit (16 %: twice the layout offsets the demo showed) teaches nothing.
    ok &= ~((state.count < cfg.min_history) & (np.abs(dev) > cfg.offset_first_limit))
    thawed = np.zeros_like(ok)
    if state.slow_mean is not None:
        # A GPU drifting away for minutes may be a mild fault setting in: do not learn it, once
        # its first windows gave it an offset (a fault there from the start is capped instead).
        frozen = drifting(cfg, state) & (state.count >= cfg.min_history)
        if wandering and cfg.wander_thaw:  # an offset learnt in a low spell of the routing
            thawed = frozen & (state.mu < 0) & ok
        ok &= ~frozen | thawed
    alpha = np.maximum(cfg.history_alpha, 1.0 / (state.count + 1))
    # Later, one window moves the offset by at most alpha x max_offset: at a checkpoint's start a
    # live window can catch one node already idle while its peers still compute (each node's
    # samples come from its own scrape times), and -270 % x 0.03 took the live demo's n0004 to the
    # -8 % cap in one window; it then ran at its real offset, 10 % above that, and was flagged.
    delta = np.where(ok, np.clip(dev - state.mu, -cfg.offset_step, cfg.offset_step), 0.0)
    state.mu = np.clip(state.mu + alpha * delta, -cfg.max_offset, cfg.max_offset)
    if thawed.any():
        state.mu = np.where(thawed, np.minimum(state.mu, 0.0), state.mu)  # a thaw stops at 0
    state.var = np.where(ok, (1 - alpha) * (state.var + alpha * delta**2), state.var)
    state.count += ok
    log_tensor = safe_log(tensor)
    seen = np.isfinite(log_tensor)
    seen &= ok
    state.own = np.where(
        seen & np.isfinite(state.own),
        state.own + alpha * (log_tensor - state.own),
        np.where(seen, log_tensor, state.own),
    )
    model.keep_calm_rows(candidate.features[np.repeat(~busy, window.gpus)])
    if math.isfinite(candidate.spread) and not busy.any():  # job-wide: only when all are calm
        state.spread = (
            candidate.spread
            if not math.isfinite(state.spread)
            else state.spread + cfg.history_alpha * (candidate.spread - state.spread)
        )
