"""The straggler detector: physics of a synchronous job, robust statistics, a robust-covariance model
and persistence. This module holds the cycle (:meth:`Detector.step`) and the persistence that turns
candidates into flags; the parts it runs live beside it:

- job_model.py: each GPU against its peers and its own learnt offset (the robust z), and learning;
- covariance.py: the robust covariance model a candidate must also be an outlier of;
- paths.py: the slow, step and hardware paths, and disturbed windows;
- peerless.py: jobs of one node, against the fleet baseline;
- blind.py: nodes the detector cannot see, taken out before anything is scored;
- cause.py: the cause of a flag and its evidence; state.py: configuration, per-job state, results.

Physics. In a synchronous data-parallel job every step waits for the slowest rank. The slow node is
therefore the *busy* one: its tensor pipes stay active for its whole (longer) compute time, while its
peers finish early and wait in NCCL, their tensor activity and power falling. So the straggler is the
GPU whose tensor activity is *above* its peers' by about the job's slowdown, and the signal is a ratio:
a 10 % slower node shows ~10 % more tensor activity than the peers' median.

Robust statistics (job_model.py). Per job and window, every GPU's window-median tensor activity is
compared (in logs) with the median of the *other* nodes of its job, less the GPU's own learnt offset,
and divided by a robust scale. Small jobs also have a hardware path: a throttled GPU busier than its
peers at a lower power or clock.

Model (covariance.py). A Minimum Covariance Determinant fit over all GPUs of the cycle, on the features
(tensor residual z, power ratio, SM-clock ratio, all relative to peers), gives each GPU a robust
Mahalanobis distance: a candidate must be an outlier in that joint space too, not only in one column.

Candidates. The one-window test takes a GPU whose z passes the threshold (and the model agrees, and
its activity kept its own usual level: waiting peers fall below theirs). The slow path (paths.py)
averages the residual over the last windows, for ~10 % stragglers that hide in one window's noise.
The fast path (paths.py, issue 42) flags a large slowdown (20 % and more) in the first window that
shows it, when that one window already says so beyond noise and benign effects and its peers wait.

Persistence. Windows where the whole job moves together (checkpoints, data-loader stalls, start-up,
end) do not count: the job's busiest node is itself far below its usual level. A node is flagged when
it is a candidate in ``k`` of the last ``n`` counted windows (or in two in a row with a strong score,
or at once with a strong score and a hardware signal, or in ``fast_windows`` in a row on the fast
path), and cleared after ``clear_after`` quiet ones. The flag's evidence names the rule (``path``).
Histories learn per node, never from a node that is a candidate, flagged or past the threshold, nor
in a disturbed window, so that an episode is never learnt; the first windows of a job are learnt
whatever they show (capped), so that its layout becomes its normal at once.

Jobs of one node have no peers (peerless.py); blind nodes are neither candidates nor quiet (blind.py).
The service never imports the twin; the evaluation feeds the same :class:`~anomaly.window.Window` from
it. This module is the detector's public face: the service and the evaluation import the detector and
its result types from here (``__all__``).
"""

from __future__ import annotations

import math

import numpy as np

from .blind import blind_view, report_blind, with_silent_members
from .cause import cause_of, gpu_scope, job_impact
from .covariance import OutlierModel
from .job_model import learn, new_job_state, score_job
from .paths import (
    declared_wandering,
    disturbed,
    fast_path,
    fast_path_runs,
    hardware_path,
    long_path,
    presumed_wandering,
    slow_path,
    step_path,
    wanders,
)
from .peerless import fleet_baseline, score_peerless
from .robust import safe_log
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
from .traffic import routed
from .window import Window

# Evidence keys that say how a flag was raised: kept when a later cycle names its hardware cause.
FLAG_KEYS = ("path", "peers_wait", "scope", "gpus", "impact")

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


class Detector:
    """Stateful: feed it one :class:`Window` per cycle with :meth:`step`."""

    def __init__(self, config: DetectorConfig | None = None) -> None:
        self.config = config or DetectorConfig()
        self.jobs: dict[str, JobState] = {}
        # Jobs whose last layout wandered (expert routing), by the window end it was last seen: a new
        # layout of the job is presumed to wander until its own gauge has learnt (wander_carry).
        self.routing_jobs: dict[str, float] = {}
        self.rng = np.random.default_rng(self.config.seed)
        self.outliers = OutlierModel(self.config)
        self.unseen: dict[str, Unseen] = {}  # the nodes reported blind last cycle, by name

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
        cfg = self.config
        window = with_silent_members(window, self.jobs)
        models = np.array([window.gpu_model.get(i, "") for i in range(len(window.nodes))])
        fleet = fleet_baseline(cfg, window, models)
        window, reasons, blind_gpus = blind_view(cfg, window, fleet, models, self.unseen)
        for job_id, node_idx in window.jobs.items():
            if not node_idx:
                continue
            state = self._job_state(job_id, [window.nodes[i] for i in node_idx], window.gpus, window.end)
            ref = window.job_refs.get(job_id)
            if ref is not None and ref.declared_routing:
                # Kept for the layout: a cycle without slurmrestd (jobs from hpc_job labels alone)
                # must not make a job that said it routes look calm.
                state.declared_routing = True
            job_blind = reasons[node_idx] if reasons is not None else None
            if job_blind is not None and job_blind.any():
                report_blind(job_id, window, node_idx, job_blind, blind_gpus, self.unseen, blind, unseen)
            else:
                job_blind = None
            if len(node_idx) == 1:
                score_peerless(cfg, job_id, state, window, node_idx[0], fleet, scores, events)
                continue
            scored = score_job(cfg, job_id, state, window, node_idx)
            if scored is None:
                quiet += 1
                state.after_pause = True
                continue
            if job_blind is not None:
                scored.blind = job_blind > 0
            counted += 1
            candidates.append(scored)
        self.unseen = unseen
        confirmed = self.outliers.confirm(candidates)
        for candidate, outlier in zip(candidates, confirmed, strict=True):
            self._persist(candidate, outlier, window, scores, events)
        # Jobs that ended or vanished: clear their flags.
        for job_id in list(self.jobs):
            if job_id not in window.jobs:
                for node_state in self.jobs[job_id].node_state.values():
                    if node_state.flag is not None:
                        events.append(Event("clear", window.end, node_state.flag))
                self._note_routing(job_id, self.jobs.pop(job_id), window.end)
        return CycleResult(scores=scores, events=events, counted_jobs=counted, quiet_jobs=quiet, blind=blind)

    def _job_state(self, job_id: str, names: list[str], gpus: int, now: float) -> JobState:
        """The job's state, afresh when its nodes or GPU count changed (a new layout); a new layout of
        a job that wandered is presumed to wander (``wander_carry``)."""
        state = self.jobs.get(job_id)
        if state is None or state.nodes != tuple(names) or state.mu.shape[1] != gpus:
            if state is not None:
                self._note_routing(job_id, state, now)
            state = new_job_state(self.config, names, gpus)
            state.carried_wander = self.config.wander_carry and job_id in self.routing_jobs
            self.jobs[job_id] = state
        return state

    def _note_routing(self, job_id: str, state: JobState, now: float) -> None:
        """A layout of the job ends: remember the job if it wandered (or was still presumed to), and
        forget jobs not seen for ``wander_carry_s``."""
        if state.wandered or presumed_wandering(self.config, state):
            self.routing_jobs[job_id] = now
        else:
            self.routing_jobs.pop(job_id, None)
        horizon = now - self.config.wander_carry_s
        for old in [job for job, seen in self.routing_jobs.items() if seen < horizon]:
            del self.routing_jobs[old]

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
        flagged_now = any(node.flag is not None for node in state.node_state.values())
        state.since_flag = 0 if flagged_now else state.since_flag + 1
        stepped = step_path(cfg, state, candidate, window)
        slow = slow_path(cfg, state, candidate, window) | stepped
        long, long_mean = long_path(cfg, state, candidate, window)
        # A node building up to the long path's floor does not learn its residual as normal meanwhile;
        # where the job wanders (expert routing) the long path needs hardware and nothing is held back.
        building = np.nan_to_num(long_mean).max(axis=1) >= cfg.long_min_effect
        wandering = wanders(cfg, state)
        building &= not wandering
        hw_path = hardware_path(cfg, candidate, window)
        # The fast path (large slowdowns, one window) looks only where the one-window test holds, in a
        # job without a flagged node: its peers wait for that one, and waiting peers scatter (mixed_day:
        # while a gray node was flagged, two of its waiting peers each topped the job once at z 24-25).
        # Their utilisation is an evidence field, read on demand: only then.
        # Nor in the first window after the job paused as a whole (see JobState.after_pause).
        looking = hit.any(axis=1)
        off = not fast_path_runs(cfg) or state.after_pause
        if off or any(node.flag is not None for node in state.node_state.values()):
            looking[:] = False
        state.after_pause = False
        wait = None
        fast = np.zeros_like(hit)
        if looking.any():
            fast, wait = fast_path(cfg, state, candidate, window, looking)
            fast &= hit
        # While the job is disturbed (a loud straggler's peers wait, and waiting activity scatters),
        # a peer can reach a strong z by chance; only the job's top node counts as strong then.
        top = int(np.argmax(z_clean.max(axis=1))) if disturbed(cfg, state, candidate) else -1
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
            node_state.stepped = bool(stepped[pos].any())
            node_state.slow_run = node_state.slow_run + 1 if slow_hit else 0
            long_hit = bool(long[pos].any())
            node_state.long_run = node_state.long_run + 1 if long_hit else 0
            hw_hit = bool(hw_path[pos].any())
            node_state.hw_run = node_state.hw_run + 1 if hw_hit else 0
            if hw_hit and not bool(hit[pos].any()):
                gpu = int(np.argmax(np.where(hw_path[pos], z_clean[pos], -np.inf)))
                node_z = float(z_clean[pos, gpu])
            is_candidate = (
                bool(hit[pos].any())
                or slow_hit
                or long_hit
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
            node_state.fast_run = node_state.fast_run + 1 if strong and bool(fast[pos].any()) else 0
            node_state.quiet_run = 0 if is_candidate else node_state.quiet_run + 1
            quiet = node_state.quiet_run >= cfg.clear_after
            node_state.candidacy = 0 if quiet else node_state.candidacy + 1
            past = bool((z_clean[pos] >= cfg.z_threshold).any())
            busy[pos] = node_state.flag is not None or (not warm and (is_candidate or past or building[pos]))
            if node_state.flag is None:
                if is_candidate:  # evidence only for candidates: comparing with peers costs O(job)
                    peers = float(wait[pos]) if wait is not None else None
                    if peers is None and slow_hit and state.slow_wait is not None:
                        peers = float(state.slow_wait[pos])  # the slow path's median wait
                    args = (pos, gpu, node_z, strong, warm, peers)
                    self._maybe_flag(candidate, window, node_state, *args, events)
            elif node_state.quiet_run >= cfg.clear_after:
                events.append(Event("clear", window.end, node_state.flag))
                node_state.flag = None
                node_state.recent.clear()
            else:
                flag = node_state.flag
                flag.evidence["impact"] = _impact(state, candidate, window, pos, flag)
                flag.score = node_z
                flag.updated = window.end
                if flag.cause in ("unknown", "clocks"):
                    # A hardware signal can lag the slowdown (a GPU heats up before it throttles).
                    cause, evidence = cause_of(self.config, window, candidate.window_nodes, pos, gpu, node_z)
                    if cause not in ("unknown", flag.cause):
                        evidence.update({k: v for k, v in flag.evidence.items() if k in FLAG_KEYS})
                        flag.cause, flag.evidence = cause, evidence
                        events.append(Event("cause", window.end, flag))
        # Learn per node, never from a node that is a candidate, flagged or past the threshold, nor in
        # a disturbed window (waiting peers scatter), so that an episode never becomes a GPU's normal.
        # Per node, not per job: in a job of hundreds of GPUs some GPU is always past the threshold
        # before the offsets are learnt, and a job-wide freeze would then never learn them.
        if top < 0:
            learn(cfg, state, candidate, window, busy, self.outliers, wandering)

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
        peers_wait: float | None,
        events: list[Event],
    ) -> None:
        cfg = self.config
        cause, evidence = cause_of(self.config, window, candidate.window_nodes, pos, gpu, node_z)
        hardware = cause in ("power_brake", "thermal", "pcie")
        if warm and not hardware:
            return
        # Why the flag is due, first rule that holds: said in the evidence (``path``).
        rules = (
            ("strong_hardware", strong and hardware),
            ("fast", cfg.fast_windows > 0 and node_state.fast_run >= cfg.fast_windows),  # 0 where off
            ("strong", node_state.strong_run >= 2),
            ("slow", node_state.slow_run >= cfg.slow_k),
            ("long", node_state.long_run >= cfg.long_k),
            ("hardware", hardware and node_state.hw_run >= cfg.slow_k),
            ("persistent", sum(node_state.recent) >= cfg.k),
        )
        path = next((rule for rule, due in rules if due), None)
        job = self.jobs[candidate.job]
        traffic = None  # asked only of a flag that is due: the bytes may be read for it on demand
        if path is not None and not hardware:
            traffic = routed(cfg, window, candidate, pos, gpu, float(job.mu[pos, gpu]))
        if traffic:
            return  # its node is sent more of the job's tokens (expert routing): busier, not slower
        # A sudden lasting rise (the step path) is held too: routing that moves at once makes one
        # (DetectorConfig.step_exempt_below, 0: no job is exempt).
        exempt = node_state.stepped and len(job.nodes) < cfg.step_exempt_below
        unrouted = cfg.traffic_unholds and traffic is False  # the bytes were read and say not routing
        held = not hardware and not exempt and not unrouted and wanders(cfg, job)
        if path is not None and held:
            if node_state.candidacy < _hold(cfg, path):
                return  # expert routing keeps a node busiest for minutes: wait longer than that
            evidence["wander_windows"] = node_state.candidacy
            if declared_wandering(cfg, job):
                evidence["routing"] = "declared"  # why it was held: the job says it routes experts
        if path is not None:
            evidence["path"] = path
            if peers_wait is not None and math.isfinite(peers_wait):
                evidence["peers_wait"] = round(peers_wait, 4)
            name = window.nodes[candidate.window_nodes[pos]]
            scope, slow_gpus = gpu_scope(candidate.resid[pos])
            impact = _impact(self.jobs[candidate.job], candidate, window, pos)
            evidence.update(scope=scope, gpus=slow_gpus, impact=impact)
            named = gpu if scope == "gpu" else None
            node_state.flag = Straggler(
                candidate.job, name, cause, named, node_z, window.end, evidence, window.end
            )
            events.append(Event("flag", window.end, node_state.flag))


def _hold(cfg: DetectorConfig, path: str) -> int:
    """Counted windows a candidate of a wandering job must last before a flag without a hardware cause
    (DetectorConfig.wander_hold_persistent). The mild path waits longer only where the fast path runs:
    without it (1-s samples, or off) loud gray nodes come through the mild path too (moe_gray_x14_8n's
    x1.4 node at 1-s samples: flagged at 1,110 s of its 1,200-s fault after 12 windows)."""
    mild = path == "persistent" and fast_path_runs(cfg)
    return cfg.wander_hold_persistent if mild else cfg.wander_hold


def _impact(
    state: JobState, candidate: Candidate, window: Window, pos: int, before: Straggler | None = None
) -> dict[str, float]:
    """The flag's cost to its job so far (anomaly/cause.py job_impact): how far the peers' activity fell
    below their own usual level (they wait for the straggler; the straggler itself stays busy), added up
    over the windows since the flag (``before``: the flag as the last cycle left it)."""
    drop = safe_log(window.tensor[candidate.window_nodes]) - state.own
    peers = np.delete(drop, pos, axis=0)
    finite = peers[np.isfinite(peers)]
    fallen = -float(np.median(finite)) if finite.size else 0.0
    gpus = int(np.isfinite(candidate.resid).sum())
    if before is None:
        return job_impact(fallen, gpus, 0.0)
    lost = float(before.evidence.get("impact", {}).get("gpu_hours_lost", 0.0))
    return job_impact(fallen, gpus, window.end - before.updated, lost)
