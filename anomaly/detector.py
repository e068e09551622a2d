"""The straggler detector: physics of a synchronous job, robust statistics, a robust-covariance model
and persistence.

Physics. In a synchronous data-parallel job every step waits for the slowest rank. The slow node is
therefore the *busy* one: its tensor pipes stay active for its whole (longer) compute time, while its
peers finish early and wait in NCCL, their tensor activity and power falling. So the straggler is the
GPU whose tensor activity is *above* its peers' by about the job's slowdown, and the signal is a ratio:
a 10 % slower node shows ~10 % more tensor activity than the peers' median.

Robust statistics. Per job and window, every GPU's window-median tensor activity is compared (in logs)
with the median of the *other* nodes of its job. Healthy peers differ systematically (pipeline
stages, silicon, cooling), so each GPU keeps an exponentially weighted history of that deviation (its
own offset and spread), capped at ``max_offset`` so that a fault present from the start is not learnt
as normal. The residual is divided by a robust scale: the job's cross-sectional MAD (four or more
nodes), the robust spread of the job's last ``noise_windows`` residuals (under ``few_nodes``
nodes; under four also the GPU's own history), and a floor (``min_scale``), whichever is largest.
Small jobs also have a hardware path: a throttled GPU busier than its peers at a lower power or clock.

Model. A Minimum Covariance Determinant fit (scikit-learn) over all GPUs of the cycle, on the features
(tensor residual z, power ratio, SM-clock ratio, all relative to peers), gives each GPU a robust
Mahalanobis distance: a candidate must be an outlier in that joint space too, not only in one column.

Two paths. The fast path takes a GPU whose z passes the threshold in one window (and the model
agrees, and its activity kept its own usual level: waiting peers fall below theirs). The slow path
averages the residual over the last ``slow_windows`` windows, for ~10 % stragglers that hide in one
window's noise, with a physical floor (``slow_min_effect``) that benign jitter stays under; a shorter
average (``short_windows``) decides sooner when it is significantly above that floor. Windows where
the job is disturbed (a loud node, or peers scattering as they wait for one) are left out of the
averages. In jobs whose nodes wander by themselves (mixture-of-experts routing moves load between
nodes for minutes), measured by how far the job's averages wandered lately, the slow path needs a
hardware signal too: a mild straggler there cannot be told from the job's own imbalance.

Persistence. Windows where the whole job moves together (checkpoints, data-loader stalls, start-up,
end) do not count: the job's busiest node is itself far below its usual level. A node is flagged when
it is a candidate in ``k`` of the last ``n`` counted windows (or in two in a row with a strong score,
or at once with a strong score and a hardware signal), and cleared after ``clear_after`` quiet ones.
Histories learn per node, never from a node that is a candidate, flagged or past the threshold, nor
in a disturbed window, so that an episode is never learnt; the first windows of a job are learnt
whatever they show (capped), so that its layout becomes its normal at once.

Jobs of one node have no peers: the node is compared with the fleet baseline for the same GPU model
(busy GPUs' SM clock and power) and flagged only on a hardware signal. The service never imports the
twin; the evaluation feeds the same :class:`~anomaly.window.Window` from it.

Blind nodes. A node whose profiling fields read 0 while its power says it computes (DCGM's profiling
module held by another client), that publishes power but no tensor activity, or that has no sample at
all (a member of the job in earlier windows whose dcgm-exporter fell silent) cannot be scored: its
tensor activity is taken out of the window before anything is computed (it sets no peer's median), it is
neither a candidate nor quiet (a flag it had is held, not cleared), and it is reported as a
:class:`~anomaly.state.Blind` with its reason. A silent member keeps its row (NaN), so that the job's
learnt state and flags survive the exporter's outage.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections import deque

import numpy as np
from scipy.stats import chi2
from sklearn.covariance import MinCovDet

from .cause import cause_of, gpu_signals, hardware_signal, nanmedian, round_or_none
from .state import (
    BLIND_REASONS,
    CAUSES,
    Blind,
    Candidate,
    CycleResult,
    DetectorConfig,
    Event,
    JobState,
    NodeState,
    Straggler,
    Unseen,
)
from .window import Window

__all__ = [
    "BLIND_REASONS",
    "CAUSES",
    "Blind",
    "CycleResult",
    "Detector",
    "DetectorConfig",
    "Event",
    "Straggler",
]

# A node's blind reason as a code per window row (0: seen), in BLIND_REASONS' order.
DROPOUT, ABSENT, SILENT = 1, 2, 3


def leave_one_out_median(values: np.ndarray) -> np.ndarray:
    """For each element, the median of all the others (NaN-aware). From one sort: without the element
    of rank r, the others' middle positions p are the sorted array's p, or p + 1 from r on (the same
    values as a median per element, bit for bit, ~12x cheaper: at 12,500 nodes the per-element medians
    were a third of the detector's cycle)."""
    m = len(values)
    if m > 16:  # one node barely moves the median of many; the plain median is cheaper
        return np.full(m, np.nanmedian(values))
    out = np.full(m, np.nan)
    finite = np.flatnonzero(np.isfinite(values))
    if not finite.size:
        return out
    order = finite[np.argsort(values[finite], kind="stable")]
    ranked = values[order]
    out[~np.isfinite(values)] = np.median(ranked)  # without a NaN element: every finite one
    if ranked.size > 1:
        rank = np.arange(ranked.size)
        low, high = (ranked.size - 2) // 2, (ranked.size - 1) // 2
        out[order] = (ranked[low + (low >= rank)] + ranked[high + (high >= rank)]) / 2
    return out


def row_medians(values: np.ndarray) -> np.ndarray:
    """np.nanmedian(values, axis=1), ~8x cheaper on the usual window without a NaN (the same values:
    numpy's NaN-aware path on small arrays goes through masked arrays)."""
    return np.median(values, axis=1) if np.isfinite(values).all() else np.nanmedian(values, axis=1)


def _safe_log(values: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(np.where(values > 0, values, np.nan))


class Detector:
    """Stateful: feed it one :class:`Window` per cycle with :meth:`step`."""

    def __init__(self, config: DetectorConfig | None = None) -> None:
        self.config = config or DetectorConfig()
        self.jobs: dict[str, JobState] = {}
        self.rng = np.random.default_rng(self.config.seed)
        self.md_threshold = float(chi2.ppf(self.config.md_quantile, df=3))
        self.calm_rows = np.zeros((0, 3))
        self.model: tuple[np.ndarray, np.ndarray] | None = None
        self.cycles = 0
        self.unseen: dict[str, Unseen] = {}  # the nodes reported blind last cycle, by name

    # ------------------------------------------------------------------------------- public
    def flagged(self) -> list[Straggler]:
        return [
            state.flag
            for job in self.jobs.values()
            for state in job.node_state.values()
            if state.flag is not None
        ]

    def step(self, window: Window) -> CycleResult:
        events: list[Event] = []
        scores: list[tuple[str, str, int, float]] = []
        candidates: list[Candidate] = []
        blind: list[Blind] = []
        unseen: dict[str, Unseen] = {}
        counted = quiet = 0
        window = self._with_silent_members(window)
        models = np.array([window.gpu_model.get(i, "") for i in range(len(window.nodes))])
        fleet = self._fleet_baseline(window, models)
        window, reasons, blind_gpus = self._blind_view(window, fleet, models)
        for job_id, node_idx in window.jobs.items():
            if not node_idx:
                continue
            state = self._job_state(job_id, [window.nodes[i] for i in node_idx], window.gpus)
            job_blind = reasons[node_idx] if reasons is not None else None
            if job_blind is not None and job_blind.any():
                self._report_blind(job_id, window, node_idx, job_blind, blind_gpus, blind, unseen)
            else:
                job_blind = None
            if len(node_idx) == 1:
                self._peerless(job_id, state, window, node_idx[0], fleet, scores, events)
                continue
            scored = self._score_job(job_id, state, window, node_idx)
            if scored is None:
                quiet += 1
                continue
            if job_blind is not None:
                scored.blind = job_blind > 0
            counted += 1
            candidates.append(scored)
        self.unseen = unseen
        confirmed = self._confirm_with_model(candidates)
        for candidate, outlier in zip(candidates, confirmed, strict=True):
            self._persist(candidate, outlier, window, scores, events)
        # Jobs that ended or vanished: clear their flags.
        for job_id in list(self.jobs):
            if job_id not in window.jobs:
                for node_state in self.jobs[job_id].node_state.values():
                    if node_state.flag is not None:
                        events.append(Event("clear", window.end, node_state.flag))
                del self.jobs[job_id]
        return CycleResult(scores=scores, events=events, counted_jobs=counted, quiet_jobs=quiet, blind=blind)

    # ------------------------------------------------------------------------------- blind nodes
    def _with_silent_members(self, window: Window) -> Window:
        """The window with a row of NaN for every node that a job had in its earlier windows and that
        has no sample at all now (its dcgm-exporter is silent), in the job's order: the job keeps its
        learnt state and flags (a change of nodes starts a job afresh), and the node is seen as
        ``no_samples``. A node that left the job (it answers, idle or in another job), or a job that
        also gained a node, is a new layout as before. Nothing is copied when no job lost a node."""
        jobs: dict[str, list[int]] | None = None
        index: dict[str, int] | None = None
        extra: list[str] = []
        for job_id, node_idx in window.jobs.items():
            state = self.jobs.get(job_id)
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
            jobs = dict(window.jobs) if jobs is None else jobs
            jobs[job_id] = [index[name] for name in state.nodes]
        if jobs is None:
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
            jobs=jobs,
        )

    def _blind_view(
        self, window: Window, fleet: dict[str, tuple[float, float]], models: np.ndarray
    ) -> tuple[Window, np.ndarray | None, np.ndarray | None]:
        """Which nodes the detector cannot see, fleet-wide and vectorised: per row a reason code
        (DROPOUT, ABSENT, SILENT; None when every node is seen), the per-GPU mask that gave it, and the
        window to score, whose tensor activity is NaN on those rows (nothing else changes: their power
        and clocks are NVML's and stay true).

        A GPU drops out when its tensor activity reads 0 (``blind_tensor``) while it draws at least
        ``blind_busy_ratio`` of the median power of the cycle's computing GPUs of its model and at least
        ``blind_busy_w``, and it stays so, whatever its power, until it reads tensor activity again:
        in a checkpoint or a stall nothing tells the module's silence from an idle GPU. One such GPU
        takes its whole node out (a profiler on the node may also slow it a little)."""
        cfg = self.config
        tensor, power = window.tensor, window.power
        busy_w = np.full(len(window.nodes), cfg.blind_busy_w)
        for model, (_, watts) in fleet.items():
            if math.isfinite(watts) and cfg.blind_busy_ratio * watts > cfg.blind_busy_w:
                busy_w[models == model] = cfg.blind_busy_ratio * watts
        dropout = (tensor <= cfg.blind_tensor) & (power >= busy_w[:, None])  # NaN compares False
        if self.unseen:
            alive = tensor > cfg.blind_tensor
            index = {name: i for i, name in enumerate(window.nodes)}
            for name, unseen in self.unseen.items():
                row = index.get(name)
                if row is not None and unseen.held is not None and unseen.held.shape == alive[row].shape:
                    dropout[row] |= unseen.held & ~alive[row]
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

    def _report_blind(
        self,
        job_id: str,
        window: Window,
        node_idx: list[int],
        job_blind: np.ndarray,
        blind_gpus: np.ndarray | None,
        blind: list[Blind],
        unseen: dict[str, Unseen],
    ) -> None:
        """The job's blind nodes as reports, and what the next cycle keeps of them."""
        cluster = ""
        for pos in np.flatnonzero(job_blind).tolist():
            row = node_idx[pos]
            name, code = window.nodes[row], int(job_blind[pos])
            reason = BLIND_REASONS[code - 1]
            before = self.unseen.get(name) or unseen.get(name)
            since = before.since if before is not None else window.end
            mask = blind_gpus[row].copy() if blind_gpus is not None and code != SILENT else None
            gpus = np.flatnonzero(mask).tolist() if mask is not None else []
            unseen[name] = Unseen(reason, since, mask if code == DROPOUT else None)
            if row not in window.node_cluster and not cluster:  # a silent node: its peers' cluster
                cluster = next((window.node_cluster[i] for i in node_idx if i in window.node_cluster), "")
            blind.append(Blind(job_id, name, reason, gpus, since, window.node_cluster.get(row, cluster)))

    # ------------------------------------------------------------------------------- per job
    def _job_state(self, job_id: str, names: list[str], gpus: int) -> JobState:
        state = self.jobs.get(job_id)
        if state is None or state.nodes != tuple(names) or state.mu.shape[1] != gpus:
            shape = (len(names), gpus)
            state = JobState(
                nodes=tuple(names),
                mu=np.zeros(shape),
                var=np.zeros(shape),
                count=np.zeros(shape, dtype=np.int64),
                own=np.full(shape, np.nan),
                recent_resid=deque(maxlen=self.config.slow_windows),
                steps=deque(maxlen=self.config.step_before + self.config.step_after),
                rises=deque(maxlen=self.config.noise_windows),
                noise=deque(maxlen=self.config.noise_windows),
                drift=deque(maxlen=self.config.noise_windows),
                node_state={n: NodeState(recent=deque(maxlen=self.config.n)) for n in names},
            )
            self.jobs[job_id] = state
        return state

    def _score_job(
        self, job_id: str, state: JobState, window: Window, node_idx: list[int]
    ) -> Candidate | None:
        """Robust z of every GPU's tensor activity against its peers and its own history; None when
        the whole job moves together (the window does not count)."""
        cfg = self.config
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
        dev = _safe_log(tensor) - _safe_log(ref)[:, None]
        resid = dev - state.mu
        # The scale comes from calm windows: while a node straggles its peers wait, and waiting makes
        # their activity noisy, which would inflate this window's own spread and hide the straggler.
        scale = np.full(resid.shape, cfg.min_scale)
        spread = math.nan
        if len(node_idx) >= 4:
            centre = nanmedian(resid)
            spread = 1.4826 * nanmedian(np.abs(resid - centre))
            usual = state.spread if math.isfinite(state.spread) else spread
            if math.isfinite(usual):
                scale = np.maximum(scale, usual)
        if len(node_idx) < cfg.few_nodes:
            # No cross-section to speak of: the GPU's own spread, and the job's recent windows (its
            # own spread needs calm windows to learn from; these do not). A 4-node mixture-of-experts
            # job learnt a cross-sectional spread of 2 % in its first calm windows, and routing then
            # swung its nodes by 15-25 %: z 7-11 on healthy nodes (gen_7209, 6 wrong flags).
            own = np.where(state.count >= cfg.min_history, np.sqrt(state.var), 0.0)
            if len(node_idx) >= 4:
                # Not from four nodes on: a GPU's own history also learns while a peer straggles (its
                # waiting scatters), and a 4-node job's next straggler came 2 minutes late behind it.
                own = np.zeros_like(own)
            scale = np.maximum(np.maximum(scale, own), _pooled_spread(state.noise))
            if not any(node.flag is not None for node in state.node_state.values()):
                # While a node is flagged its peers wait, and waiting scatters their activity: an
                # hour-long PCIe straggler in a 4-node job widened the pool so much that the next
                # straggler, a x1.2 gray node, was flagged 150 s later than with the job's own spread.
                self._remember(state.noise, resid, state)
        z = resid / scale
        power = _safe_log(window.power[node_idx])
        clock = _safe_log(window.sm_clock[node_idx])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            power_ref = leave_one_out_median(row_medians(power))
            clock_ref = leave_one_out_median(row_medians(clock))
        features = np.stack([z, power - power_ref[:, None], clock - clock_ref[:, None]], axis=-1).reshape(
            -1, 3
        )
        log_tensor = _safe_log(tensor)
        fallen = log_tensor - state.own < -cfg.own_drop
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

    @staticmethod
    def _remember(pool: deque[np.ndarray], values: np.ndarray, state: JobState) -> None:
        """Keep a window's per-GPU values for the job's noise, without its flagged nodes (an episode
        must not widen the noise that hides it)."""
        flagged = np.array([state.node_state[name].flag is not None for name in state.nodes])
        pool.append(np.where(flagged[:, None], np.nan, values))

    def _keep_calm_rows(self, rows: np.ndarray) -> None:
        rows = rows[np.isfinite(rows).all(axis=1)]
        if len(rows):
            self.calm_rows = np.concatenate([self.calm_rows, rows])[-self.config.mcd_rows :]

    def _confirm_with_model(self, candidates: list[Candidate]) -> list[np.ndarray]:
        """Per candidate job, per GPU: is the GPU an outlier of the robust covariance model?

        The model (Minimum Covariance Determinant) is fitted on rows of calm windows only (a reservoir
        over recent cycles and all jobs), so that it describes how healthy GPUs deviate from their
        peers jointly in tensor activity, power and clock; an episode's own noise never widens it.
        Until it has enough rows the z-score decides alone."""
        cfg = self.config
        self.cycles += 1
        due = self.model is None or self.cycles % cfg.mcd_refit_every == 0
        if due and len(self.calm_rows) >= cfg.mcd_min_rows:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = MinCovDet(random_state=cfg.seed, support_fraction=0.75).fit(self.calm_rows)
            # Ridge: a feature that is constant (clocks pinned at max) must not make every tiny
            # difference an outlier.
            covariance = model.covariance_ + np.diag([1e-2, 1e-4, 1e-4])
            self.model = (model.location_, np.linalg.inv(covariance))
        out = []
        for candidate in candidates:
            if self.model is None:
                out.append(np.ones(candidate.z.shape, dtype=bool))
                continue
            location, inverse = self.model
            centred = candidate.features - location
            distances = np.einsum("ij,jk,ik->i", centred, inverse, centred)
            # A row with a missing feature cannot be placed: the z-score decides for it.
            distances = np.where(np.isfinite(distances), distances, np.inf)
            out.append((distances >= self.md_threshold).reshape(candidate.z.shape))
        return out

    def _persist(
        self,
        candidate: Candidate,
        outlier: np.ndarray,
        window: Window,
        scores: list[tuple[str, str, int, float]],
        events: list[Event],
    ) -> None:
        cfg = self.config
        state = self.jobs[candidate.job]
        z = candidate.z
        z_clean = np.where(np.isfinite(z), z, 0.0)
        hit = (z_clean >= cfg.z_threshold) & outlier & candidate.kept_pace
        slow = self._slow_path(state, candidate, window) | self._step_path(state, candidate, window)
        hw_path = self._hardware_path(candidate, window)
        # While the job is disturbed (a loud straggler's peers wait, and waiting activity scatters),
        # a peer can reach a strong z by chance; only the job's top node counts as strong then.
        top = int(np.argmax(z_clean.max(axis=1))) if self._disturbed(state, candidate) else -1
        busy = np.zeros(len(candidate.window_nodes), dtype=bool)  # nodes that must not learn now
        # The job's first windows: every node learns what it shows (capped at max_offset), so that
        # pipeline stages and silicon become the job's normal at once; only hardware flags meanwhile.
        warm = state.windows <= cfg.min_history
        # Each GPU's score, max(0, z) where z is finite, as lists: one numpy call per job, not per GPU.
        scored, score = np.isfinite(z).tolist(), (np.maximum(z, 0.0) + 0.0).tolist()
        blind = candidate.blind.tolist() if candidate.blind is not None else None
        for pos, node_index in enumerate(candidate.window_nodes):
            if blind is not None and blind[pos]:
                # Unseen: neither a candidate nor quiet (a flag it had holds), and it learns nothing (its
                # activity is NaN). A slow-path average of its earlier windows must not flag it now.
                continue
            name = window.nodes[node_index]
            node_state = state.node_state[name]
            gpu = int(np.argmax(z_clean[pos]))
            node_z = float(z_clean[pos, gpu])
            scores.extend(
                (candidate.job, name, g, value)
                for g, (finite, value) in enumerate(zip(scored[pos], score[pos], strict=True))
                if finite
            )
            threshold = cfg.z_threshold / 2 if node_state.flag is not None else cfg.z_threshold
            slow_hit = bool(slow[pos].any())
            node_state.slow_run = node_state.slow_run + 1 if slow_hit else 0
            hw_hit = bool(hw_path[pos].any())
            node_state.hw_run = node_state.hw_run + 1 if hw_hit else 0
            if hw_hit and not bool(hit[pos].any()):
                gpu = int(np.argmax(np.where(hw_path[pos], z_clean[pos], -np.inf)))
                node_z = float(z_clean[pos, gpu])
            is_candidate = (
                bool(hit[pos].any())
                or slow_hit
                or hw_hit
                or (node_state.flag is not None and node_z >= threshold)
            )
            strong = (
                is_candidate
                and node_z >= cfg.z_strong
                and float(candidate.resid[pos, gpu]) >= cfg.strong_effect
                and top in (-1, pos)
            )
            node_state.recent.append(is_candidate)
            node_state.strong_run = node_state.strong_run + 1 if strong else 0
            node_state.quiet_run = 0 if is_candidate else node_state.quiet_run + 1
            past = bool((z_clean[pos] >= cfg.z_threshold).any())
            busy[pos] = node_state.flag is not None or (not warm and (is_candidate or past))
            if node_state.flag is None:
                if is_candidate:  # evidence only for candidates: comparing with peers costs O(job)
                    args = (pos, gpu, node_z, strong, warm)
                    self._maybe_flag(candidate, window, node_state, *args, events)
            elif node_state.quiet_run >= cfg.clear_after:
                events.append(Event("clear", window.end, node_state.flag))
                node_state.flag = None
                node_state.recent.clear()
            else:
                flag = node_state.flag
                flag.score = node_z
                flag.updated = window.end
                if flag.cause == "unknown":
                    # A hardware signal can lag the slowdown (a GPU heats up before it throttles).
                    cause, evidence = cause_of(self.config, window, candidate.window_nodes, pos, gpu, node_z)
                    if cause != "unknown":
                        flag.cause, flag.evidence = cause, evidence
                        events.append(Event("cause", window.end, flag))
        # Learn per node, never from a node that is a candidate, flagged or past the threshold, nor in
        # a disturbed window (waiting peers scatter), so that an episode never becomes a GPU's normal.
        # Per node, not per job: in a job of hundreds of GPUs some GPU is always past the threshold
        # before the offsets are learnt, and a job-wide freeze would then never learn them.
        if top < 0:
            self._learn(state, candidate, window, busy)

    def _maybe_flag(
        self,
        candidate: Candidate,
        window: Window,
        node_state: NodeState,
        pos: int,
        gpu: int,
        node_z: float,
        strong: bool,
        warm: bool,
        events: list[Event],
    ) -> None:
        cfg = self.config
        cause, evidence = cause_of(self.config, window, candidate.window_nodes, pos, gpu, node_z)
        hardware = cause in ("power_brake", "thermal", "pcie")
        if warm and not hardware:
            return
        due = (
            sum(node_state.recent) >= cfg.k
            or node_state.strong_run >= 2
            or (strong and hardware)
            or node_state.slow_run >= cfg.slow_k
            or (hardware and node_state.hw_run >= cfg.slow_k)
        )
        if due:
            name = window.nodes[candidate.window_nodes[pos]]
            node_state.flag = Straggler(
                candidate.job, name, cause, gpu, node_z, window.end, evidence, window.end
            )
            events.append(Event("flag", window.end, node_state.flag))

    def _slow_path(self, state: JobState, candidate: Candidate, window: Window) -> np.ndarray:
        """Small slowdowns (~10 %) hide in one window's noise: the mean residual over the last
        ``slow_windows`` counted windows must be a physical effect (``slow_min_effect``) and
        significant (the scale shrinks with the square root of the windows averaged). Benign
        disturbances (a minute of OS jitter, a rank logging slowly by a few per cent) stay below.
        A shorter average (``short_windows``) decides sooner when it is significantly *above* the
        largest benign effect, not just above zero: a 15-20 % straggler in a noisy job."""
        cfg = self.config
        none = np.zeros(candidate.z.shape, dtype=bool)
        if self._disturbed(state, candidate):
            # A loud straggler's peers wait, and waiting activity is too noisy to average: the window
            # enters the averages empty (the fast path handles loud stragglers), so that time still
            # passes and no average is made of windows from before a long episode.
            state.recent_resid.append(np.full(candidate.resid.shape, np.nan))
            return none
        state.recent_resid.append(candidate.resid)
        if len(state.recent_resid) < cfg.short_windows:
            return none
        stack = np.stack(state.recent_resid)
        drift = _pooled_spread(state.drift)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            short = np.nanmean(stack[-cfg.short_windows :], axis=0)
            mean = np.nanmean(stack, axis=0)
        short_scale = np.maximum(candidate.scale / math.sqrt(cfg.short_windows), drift)
        slow = short - cfg.slow_min_effect >= cfg.z_threshold * short_scale
        if len(state.recent_resid) >= cfg.slow_windows:
            state.slow_mean = mean
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
            scale = np.maximum(scale, drift)
            self._remember(state.drift, mean, state)
            slow |= (mean >= cfg.slow_min_effect) & (mean / scale >= cfg.z_threshold)
        if drift > cfg.wander_drift:
            # The job's nodes wander by themselves (expert routing): a mild straggler cannot be told
            # from the job's own imbalance unless the hardware says so (or it stepped in: step path).
            slow &= hardware_signal(self.config, window, candidate.window_nodes)[:, None]
        slow &= candidate.kept_pace
        return np.where(np.isfinite(short), slow, False)

    def _step_path(self, state: JobState, candidate: Candidate, window: Window) -> np.ndarray:
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
        cfg = self.config
        none = np.zeros(candidate.z.shape, dtype=bool)
        if len(candidate.window_nodes) >= cfg.few_nodes:  # big jobs keep no step history at all
            return none
        state.steps.append((candidate.resid, _safe_log(window.tensor[candidate.window_nodes])))
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
        noise = _pooled_spread(state.rises) if len(state.rises) >= cfg.step_before else math.inf
        self._remember(state.rises, rise, state)
        hit = (
            (rise >= cfg.strong_effect)
            & (lowest >= cfg.slow_min_effect)
            & (rise >= cfg.z_threshold * noise)
            & (own_rise >= cfg.own_drop)
        )
        finite = np.isfinite(rise) & np.isfinite(lowest) & np.isfinite(own_rise)
        return np.where(finite, hit, False) & candidate.kept_pace

    def _hardware_path(self, candidate: Candidate, window: Window) -> np.ndarray:
        """Per GPU of a job under ``few_nodes`` nodes, busier than usual against its peers: a throttle
        bit while its power or SM clock is below theirs, or a downgraded PCIe link on that GPU.

        A small job's scale is as wide as its own imbalance (mixture-of-experts routing swings the
        load between two nodes by ~25 %), which can hide even a loud straggler from the z-score.
        But a busier node draws *more* power than its peer at the same clock; one that does more
        work with less power or a lower clock, and says it is throttled, is the slow one."""
        cfg = self.config
        node_idx = candidate.window_nodes
        shape = candidate.z.shape
        if not 2 <= len(node_idx) < cfg.few_nodes:
            return np.zeros(shape, dtype=bool)
        throttled, link = gpu_signals(self.config, window, node_idx)
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

    def _disturbed(self, state: JobState, candidate: Candidate) -> bool:
        """A window where some node is loud, or the peers scatter far more than usual (they wait for
        a straggler, or the job is unsettled)."""
        cfg = self.config
        if np.nan_to_num(candidate.z).max() >= cfg.z_strong:
            return True
        if len(candidate.window_nodes) < cfg.few_nodes:  # a few nodes' spread swings by itself
            return False
        usual = state.spread
        return math.isfinite(candidate.spread) and math.isfinite(usual) and candidate.spread > 2 * usual

    def _learn(self, state: JobState, candidate: Candidate, window: Window, busy: np.ndarray) -> None:
        """Update the history of every GPU of the nodes that are not ``busy``."""
        cfg = self.config
        node_idx = candidate.window_nodes
        tensor = window.tensor[node_idx]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ref = leave_one_out_median(row_medians(tensor))
        dev = _safe_log(tensor) - _safe_log(ref)[:, None]
        ok = np.isfinite(dev) & ~busy[:, None]
        # A GPU's first windows average with equal weights, so one window of a (re)start that is still
        # uneven would set an offset no layout has (demo: after job 4101 restarted, n0007 learnt -5 %
        # from a window at -69 % while it loaded, then ran +5 % above that for 40 minutes, never
        # learnt as it counted as drifting, and was flagged). Layout offsets stay within max_offset:
        # a first window twice as far from the peers teaches nothing.
        ok &= ~((state.count < cfg.min_history) & (np.abs(dev) > 2 * cfg.max_offset))
        if state.slow_mean is not None:
            # A GPU drifting away for minutes may be a mild fault setting in: do not learn it, once
            # its first windows gave it an offset (a fault there from the start is capped instead).
            drifting = np.nan_to_num(state.slow_mean) >= cfg.slow_min_effect / 2
            ok &= ~(drifting & (state.count >= cfg.min_history))
        alpha = np.maximum(cfg.history_alpha, 1.0 / (state.count + 1))
        # Later, one window moves the offset by at most alpha x max_offset: at a checkpoint's start a
        # live window can catch one node already idle while its peers still compute (each node's
        # samples come from its own scrape times), and -270 % x 0.03 took the live demo's n0004 to the
        # -8 % cap in one window; it then ran at its real offset, 10 % above that, and was flagged.
        delta = np.where(ok, np.clip(dev - state.mu, -cfg.max_offset, cfg.max_offset), 0.0)
        state.mu = np.clip(state.mu + alpha * delta, -cfg.max_offset, cfg.max_offset)
        state.var = np.where(ok, (1 - alpha) * (state.var + alpha * delta**2), state.var)
        state.count += ok
        log_tensor = _safe_log(tensor)
        seen = np.isfinite(log_tensor)
        seen &= ok
        state.own = np.where(
            seen & np.isfinite(state.own),
            state.own + alpha * (log_tensor - state.own),
            np.where(seen, log_tensor, state.own),
        )
        calm_rows = np.repeat(~busy, window.gpus)
        self._keep_calm_rows(candidate.features[calm_rows])
        if math.isfinite(candidate.spread) and not busy.any():  # job-wide: only when all are calm
            state.spread = (
                candidate.spread
                if not math.isfinite(state.spread)
                else state.spread + cfg.history_alpha * (candidate.spread - state.spread)
            )

    # ------------------------------------------------------------------------------- one node
    def _fleet_baseline(self, window: Window, models: np.ndarray) -> dict[str, tuple[float, float]]:
        """Per GPU model (``models``: each row's): the median SM clock and power of busy GPUs of
        multi-node jobs (a GPU whose profiling reads 0 is not busy here)."""
        busy = np.zeros(window.tensor.shape, dtype=bool)
        for node_idx in window.jobs.values():
            if len(node_idx) > 1:
                busy[node_idx] = window.tensor[node_idx] >= self.config.min_activity
        out: dict[str, tuple[float, float]] = {}
        for model in set(models.tolist()):
            mask = busy & (models == model)[:, None]
            if mask.any():
                out[model] = (nanmedian(window.sm_clock[mask]), nanmedian(window.power[mask]))
        return out

    def _peerless(
        self,
        job_id: str,
        state: JobState,
        window: Window,
        node: int,
        fleet: dict[str, tuple[float, float]],
        scores: list[tuple[str, str, int, float]],
        events: list[Event],
    ) -> None:
        """A one-node job: its SM clock against the fleet's busy GPUs of the same model, and its
        throttle bits. Without a hardware signal a lone slow node cannot be told from a slow model."""
        cfg = self.config
        name = window.nodes[node]
        node_state = state.node_state[name]
        tensor = window.tensor[node]
        if not np.isfinite(tensor).any() or np.nanmax(tensor) < cfg.min_activity:
            return
        clock_ref, power_ref = fleet.get(window.gpu_model.get(node, ""), (math.nan, math.nan))
        if math.isfinite(clock_ref):
            deficit = _safe_log(np.full(window.gpus, clock_ref)) - _safe_log(window.sm_clock[node])
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
            cause, evidence = cause_of(self.config, window, [node], 0, gpu, float(z[gpu]))
            evidence["fleet_sm_clock_mhz_median"] = round_or_none(clock_ref)
            evidence["fleet_power_w_median"] = round_or_none(power_ref)
            node_state.flag = Straggler(
                job_id, name, cause, gpu, float(z[gpu]), window.end, evidence, window.end
            )
            events.append(Event("flag", window.end, node_state.flag))
        elif node_state.flag is not None and node_state.quiet_run >= cfg.clear_after:
            events.append(Event("clear", window.end, node_state.flag))
            node_state.flag = None
            node_state.recent.clear()


def _pooled_spread(pool: deque[np.ndarray]) -> float:
    """Robust spread (1.4826 MAD) of all values in the pool around 0, the usual deviation; 0 when
    empty. Around 0, not the pool's median: a residual is already relative to the GPU's own offset."""
    if not pool:
        return 0.0
    values = np.concatenate([v.ravel() for v in pool])
    values = values[np.isfinite(values)]
    return 1.4826 * float(np.median(np.abs(values))) if values.size else 0.0
