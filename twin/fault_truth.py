"""Each event's truth line, and the measure it carries of the event's part in its jobs' pace: how much
slower each job it touched ran (``job_slowdown``), the event's own share (``fault_slowdown``) and the
spans where it set the job's pace or was masked by a slower node (``pacing``, ``masked``).

Its own module (a mixin of the Simulation, as the rest of the injection) because it changes with what
the truth says (docs/twin.md, "Ground truth"), not with what a fault kind does to the hardware. It
asks the physics what a job would do without an event by re-running ``_node_factor`` on copies of
the modifiers (``_modify``, twin/injection.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np

from . import hardware as hw
from .counters import G
from .fault_kinds import FABRIC_NOT_HARDWARE_KINDS, NOT_HARDWARE_KINDS
from .fault_state import NODE_MODIFIERS, ActiveFault
from .training_kinds import TRAINING_MODIFIERS

if TYPE_CHECKING:
    from .workload import JobRun

MAX_SLOWDOWN = 100.0  # reported when the job made (almost) no progress during the event
# An event acts on its node when removing it makes the node's compute, communication or stall term
# longer by more than PACE_EPS. It sets the job's pace when that term is within PACE_TIE of the job's
# slowest node: healthy nodes' slowest GPUs differ by up to ~5 % (silicon, pipeline stage), so of two
# stragglers that close, fixing one alone leaves the job about as slow: both set the pace. Further
# behind, a slower node masks it (its peers and it wait for that one). Spans closer than PACE_GAP_S
# are written as one.
PACE_EPS = 1e-3
PACE_TIE = 0.05
PACE_GAP_S = 30.0
TRAINING_TRUTH_KEYS = ("resumed", "busiest", "from_nodes", "to_nodes", "bubble")


class FaultTruthMixin:
    """The Simulation's truth lines for its events (a mixin: the state lives on the Simulation)."""

    def _record_truth(self, fault: ActiveFault) -> None:
        spec = fault.spec
        fault.truth = {
            "id": spec.id,
            "kind": spec.kind,
            "benign": spec.benign,
            "target": spec.target,
            "onset": self.iso(spec.onset),
            "end": self.iso(spec.onset + spec.duration),
            "onset_unix": round(self.unix(spec.onset), 3),
            "end_unix": round(self.unix(spec.onset + spec.duration), 3),
            "magnitude": fault.state.get("magnitude", spec.magnitude),
            "jobs": fault.jobs,
            "effects": fault.effects,
        }
        # A switch or job fault: the hosts it touched, which its target does not name.
        if "nodes" in fault.state:
            fault.truth["nodes"] = fault.state["nodes"]
        # What a training kind did, as it happens (the lists grow in place): when each node resumed after
        # a checkpoint, which node was the busiest under expert routing, a resized job's node lists, a
        # pipeline's bubble share.
        for key in TRAINING_TRUTH_KEYS:
            if key in fault.state:
                fault.truth[key] = fault.state[key]
        if spec.kind in (*NOT_HARDWARE_KINDS, *FABRIC_NOT_HARDWARE_KINDS):  # a drain: a wrong one (truth.py)
            fault.truth["hardware"] = False
        self.truth_lines.append(fault.truth)
        self._fault_with_truth.append(fault)
        self.refresh_truth()

    def refresh_truth(self) -> None:
        """Bring each truth line's job, job_slowdown and job_failed up to date."""
        for fault in self._fault_with_truth:
            if fault.truth is None or (fault.ended and fault.truth.get("final")):
                continue
            ratios = {job: _ratio(expected, made) for job, (expected, made) in fault.progress.items()}
            job = max(ratios, key=lambda j: (ratios[j], j)) if ratios else None
            if job is None and fault.jobs:
                job = fault.jobs[0]
            own = fault.own.get(job) if job is not None else None
            fault.truth.update(
                job=job,
                job_slowdown=ratios.get(job, 1.0) if job is not None else 1.0,
                job_failed=job in fault.failed_jobs,
                fault_slowdown=_ratio(*own) if own else 1.0,
                pacing=self._unix_spans(fault.pacing.get(job, []), fault),
                masked=self._unix_spans(fault.masked.get(job, []), fault),
            )

    def _unix_spans(self, spans: list[list[float]], fault: ActiveFault) -> list[list[float]]:
        """Sim-time spans as [from, to] unix seconds, cut at the event's end."""
        end = fault.spec.onset + fault.spec.duration
        return [[round(self.unix(a), 3), round(self.unix(min(b, end)), 3)] for a, b in spans if a < end]

    def _account_progress(self, job: JobRun) -> None:
        """What the active events cost this job this tick, in steps; and each event's own part."""
        tick = self.scenario.tick
        pace: _JobPace | None = None
        for fault in self.active_faults:
            progress = fault.progress.get(job.spec.id)
            if progress is None or job.spec.id in fault.failed_jobs:
                continue
            if job.phase == "compute":
                progress[0] += tick / job.nominal_step_time
                progress[1] += tick / job.step_time
                if fault.node is not None and fault.node in job.nodes:
                    pace = pace or self._job_pace(job)
                    fault.pace_state[job.spec.id] = self._pace(fault, job, pace)
            elif job.phase == "stall" and fault.spec.kind == "lustre_ost_slow":
                # A slow OST starves the data loaders: those stalls are its doing (others are not).
                progress[0] += tick / max(job.nominal_step_time, 1e-3)
            # Checkpoints and stalls hold the state of the last compute tick: the event is still there.
            state = fault.pace_state.get(job.spec.id, "")
            if state:
                spans = (fault.pacing if state == "pacing" else fault.masked).setdefault(job.spec.id, [])
                _extend(spans, self.t, self.t + tick)

    def _job_pace(self, job: JobRun) -> _JobPace:
        """The job's per-GPU compute times, comm and stall terms this tick, and its step jitter."""
        per_gpu, nominal = self._node_factor(job)  # the same inputs as _step_job: the same values
        profile = job.profile
        share = profile["compute_share"]
        jitter = job.nominal_step_time / (profile["step_time"] * (share * nominal.max() + (1 - share)))
        return _JobPace(per_gpu, self.comm_slow[job.nodes].copy(), self.node_stall[job.nodes].copy(), jitter)

    def _pace(self, fault: ActiveFault, job: JobRun, pace: _JobPace) -> str:
        """Does the event set the job's pace this tick ("pacing"), act on its node under a slower
        node's pace ("masked"), or not act at all ("")? While it paces, its own cost is what the
        job's step would be with this event alone against the step without any event."""
        i = int(np.nonzero(job.nodes == fault.node)[0][0])
        others = [f for f in self.active_faults if f is not fault and f.node == fault.node]
        without = self._what_if(job, [fault.node], others, fault)
        terms = (
            (pace.per_gpu[i].max(), without.per_gpu[i].max(), pace.per_gpu.max(axis=1)),
            (pace.comm[i], without.comm[i], pace.comm),
            (1.0 + pace.stall[i], 1.0 + without.stall[i], 1.0 + pace.stall),
        )
        acts = [(mine, peers) for mine, bare, peers in terms if mine > bare * (1.0 + PACE_EPS)]
        if not acts:
            return ""
        if not any(mine * (1.0 + PACE_TIE) >= peers.max() for mine, peers in acts):
            return "masked"
        alone = self._what_if(job, list(job.nodes), [fault], None)
        own = fault.own.setdefault(job.spec.id, [0.0, 0.0])
        tick = self.scenario.tick
        own[0] += tick / job.nominal_step_time
        own[1] += tick / alone.step_time(job, pace.jitter)
        return "pacing"

    def _what_if(
        self, job: JobRun, rows: list[int], faults: list[ActiveFault], removed: ActiveFault | None
    ) -> _JobPace:
        """The job's terms if the nodes ``rows`` had only the events ``faults`` (the others keep
        theirs; ``removed``: the one event taken away, whose PCIe link then reads healthy; None: every
        link of ``rows`` healthy but those of ``faults``), computed by the physics' own _node_factor
        on copies of the modifier arrays."""
        m = SimpleNamespace(
            **{name: getattr(self, name).copy() for name in NODE_MODIFIERS},
            ost_slow=self.ost_slow.copy(),
            loss_mult=dict(self.loss_mult),
        )
        for name, value in NODE_MODIFIERS.items():
            if removed is not None and name in TRAINING_MODIFIERS:
                continue  # taking a node's fault away leaves its job's routing and pipeline layout
            getattr(m, name)[rows] = value
        for fault in faults:
            self._modify(fault, m)
        h2d = self.h2d_bandwidth.copy()
        healthy = self._healthy_h2d
        if removed is None:
            h2d[rows] = healthy[rows]
            for fault in faults:
                if fault.spec.kind == "pcie_downgrade":
                    gpu = fault.state["gpu"]
                    h2d[fault.node, gpu] = self.h2d_bandwidth[fault.node, gpu]
        elif removed.spec.kind == "pcie_downgrade":
            gpu = removed.state["gpu"]
            h2d[removed.node, gpu] = healthy[removed.node, gpu]
        m.h2d_bandwidth = h2d
        per_gpu, _ = self._node_factor(job, what_if=m)
        return _JobPace(per_gpu, m.comm_slow[job.nodes], m.node_stall[job.nodes], 1.0)

    @functools.cached_property
    def _healthy_h2d(self) -> np.ndarray:
        """What each GPU's host-to-device probe would read at its link's max speed and width (the
        links' maxima never change: computed once)."""
        per_lane = np.vectorize(hw.PCIE_GEN_LANE_BYTES.get)(self.pci_max_gen[:, :G])
        return (per_lane * self.pci_max_width[:, :G]).astype(float)


@dataclass
class _JobPace:
    """A job's step-time terms in one tick: per node x GPU compute, per node comm and stall."""

    per_gpu: np.ndarray
    comm: np.ndarray
    stall: np.ndarray
    jitter: float

    def step_time(self, job: JobRun, jitter: float) -> float:
        """The step time these terms give, as _step_job computes it."""
        profile = job.profile
        share = profile["compute_share"]
        base = profile["step_time"]
        return base * (share * self.per_gpu.max() + (1 - share) * self.comm.max()) * jitter + self.stall.max()


def _extend(spans: list[list[float]], start: float, end: float) -> None:
    """Add [start, end) to time-ordered spans, joining it to the last one across a gap <= PACE_GAP_S."""
    if spans and start - spans[-1][1] <= PACE_GAP_S:
        spans[-1][1] = max(spans[-1][1], end)
    else:
        spans.append([start, end])


def _ratio(expected: float, made: float) -> float:
    """The job's step-time ratio over the event: steps it would have made over steps it made."""
    if expected <= 0:
        return 1.0
    if made <= expected / MAX_SLOWDOWN:
        return MAX_SLOWDOWN
    return round(float(expected / made), 4)
