"""Where a rank's step goes (the optional ``data_ms``, ``compute_ms`` and ``comm_ms`` keys of a job's
``fleetsight-train`` line), and the two faults that slow a job without a GPU signature: ``slow_nic``
(one node's NIC moves data slower: the job's gradient all-reduce takes longer) and ``slow_host`` (one
node's host cannot feed its GPUs: its data loader falls behind and every peer waits for it).

The split follows from what twin/workload.py already decides for the tick (read, never changed here):

- ``compute``: the node's slowest GPU's forward and backward, ``base x share x per_gpu``;
- ``data``: the host-side wait for the next batch, a small share of the step the loader's prefetch
  does not hide, plus the node's data-loader stall (``node_stall``: a hiccup, or a slow host);
- ``comm``: the time in the gradient all-reduce, which no rank leaves before the last one enters:
  ``(latest arrival - own arrival) + transfer``. The transfer is the ring's, paced by its slowest link
  (``comm_slow``), so every rank sees the same one; the rank that arrives last waits for nobody.
- Pipeline stages: a replica's nodes wait on each other's activations, so each arrives when the
  replica's slowest stage does, the wait counted in its compute. Only the last stage logs (it holds the
  loss): a slow host on another stage shows as its replica's compute, not as anyone's data wait.

A rank's ``step_time_ms`` is measured loop to loop, so a step that straddles a checkpoint, an
evaluation or a job-wide stall carries that hold in full while its three parts do not (the publisher in
docs/anomaly.md times the parts inside the step). Ordinary noise: each rank's compute wobbles a little,
and now and then one rank's step is long for one step (a garbage collection, a page-cache miss).
Figures and assumptions: docs/twin.md ("slow_nic, slow_host").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .counters import stable_hash
from .fault_state import ActiveFault
from .scenario_model import FaultSpec

if TYPE_CHECKING:
    from .workload import JobRun

DATA_SHARE = 0.01  # share of a healthy step a rank waits for its next batch (prefetch hides the rest)
DATA_SPREAD = 0.3  # relative sd of that wait, step to step
COMPUTE_SPREAD = 0.004  # relative sd of a rank's compute, step to step (kernels are deterministic-ish)
HICCUPS_PER_RANK_STEP = 1.0 / 3000.0  # one rank's one long step (GC, page-cache miss)
HICCUP_SIZE = (0.05, 0.4)  # its extra compute, as a share of the step
HOLD_FACTOR = 1.5  # a gap between two steps this many step times long held the job (checkpoint, eval)


@dataclass
class PaceSplit:
    """One step's split per position of the job's nodes, in milliseconds, and the step time each rank
    measured loop to loop."""

    data: np.ndarray
    compute: np.ndarray
    comm: np.ndarray
    step: np.ndarray


@dataclass
class _PaceState:
    rng: np.random.Generator
    last_when: float | None = None
    tick: float | None = None  # the tick the node factors below are of: every step it crossed shares them
    per_gpu: np.ndarray | None = None


class PaceFaultsMixin:
    """The Simulation's per-rank step split and its slow_nic/slow_host kinds (a mixin)."""

    # ------------------------------------------------------------------------------- the faults
    def _start_slow_nic(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        self._effect(
            fault,
            "app_log",
            f"the job's gradient all-reduce x{spec.magnitude:g} (the ring is paced by this node's NIC); "
            "every rank's comm_ms grows alike; no GPU, no port-counter signal",
        )

    def _start_slow_host(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        self._effect(
            fault,
            "app_log",
            f"the node's data loader falls behind by {spec.magnitude:g} of a step: its data_ms grows, "
            "its peers wait in the all-reduce",
        )

    def _pace_modify(self, fault: ActiveFault, m: Any) -> None:
        """slow_nic and slow_host's share of the tick's modifiers (twin/injection.py ``_modify``)."""
        node, magnitude = fault.node, fault.spec.magnitude
        if fault.spec.kind == "slow_nic":
            m.comm_slow[node] *= magnitude
        elif fault.spec.kind == "slow_host":
            job = self._job_on(node)  # type: ignore[attr-defined]
            step = job.profile["step_time"] if job is not None else 0.0
            m.node_stall[node] = max(m.node_stall[node], magnitude * step)

    # ------------------------------------------------------------------------------- the split
    def _pace_split(self, job: JobRun, step: int, when: float) -> PaceSplit:
        """The split of ``step`` on every node of the job (positions in ``job.nodes`` order)."""
        states: dict[str, _PaceState] = self.__dict__.setdefault("_pace_states", {})
        state = states.get(job.spec.id)
        if state is None:
            seed = stable_hash(self.scenario.seed, "pace", job.spec.id)  # type: ignore[attr-defined]
            state = states[job.spec.id] = _PaceState(np.random.default_rng(seed))
        rng, size = state.rng, len(job.nodes)
        profile = job.profile
        base, share = profile["step_time"], profile["compute_share"]
        if state.tick != self.t or state.per_gpu is None or len(state.per_gpu) != size:  # type: ignore[attr-defined]
            state.per_gpu, _ = self._node_factor(job)  # type: ignore[attr-defined]
            state.tick = self.t  # type: ignore[attr-defined]
        per_gpu = state.per_gpu
        comm_slow = self.comm_slow[job.nodes]  # type: ignore[attr-defined]
        stall = self.node_stall[job.nodes]  # type: ignore[attr-defined]
        modelled = base * (share * per_gpu.max() + (1 - share) * comm_slow.max())
        jitter = max(1e-6, job.step_time - float(stall.max())) / max(modelled, 1e-9)
        compute = base * share * per_gpu.max(axis=1) * jitter
        compute = compute * (1.0 + rng.normal(0.0, COMPUTE_SPREAD, size))
        hiccup = rng.random(size) < HICCUPS_PER_RANK_STEP
        compute = compute + hiccup * rng.uniform(*HICCUP_SIZE, size) * base
        waits = base * DATA_SHARE * np.exp(rng.normal(0.0, DATA_SPREAD, size) - DATA_SPREAD**2 / 2)
        data = waits + stall
        compute = np.maximum(compute - waits, 0.0)  # the loader's wait was part of the modelled step
        transfer = base * (1 - share) * float(comm_slow.max()) * jitter
        arrive = data + compute
        if len(job.stage) == size and size and int(job.stage.max()) > 0:
            # Pipeline stages: a replica's stages wait on each other's activations inside forward and
            # backward, so each of its nodes reaches the all-reduce when its slowest stage does; the
            # wait shows in the node's compute (a receive inside the step), not in its data wait.
            replicas = max(1, size // (int(job.stage.max()) + 1))
            replica = np.arange(size) % replicas
            slowest = np.array([arrive[replica == r].max() for r in range(replicas)])[replica]
            compute = compute + (slowest - arrive)
            arrive = slowest
        comm = float(arrive.max()) - arrive + transfer
        took = float(arrive.max()) + transfer
        if state.last_when is not None and when - state.last_when > HOLD_FACTOR * job.step_time:
            took = max(took, when - state.last_when)  # loop to loop: the hold is in this step
        state.last_when = when
        ms = 1000.0
        return PaceSplit(data * ms, compute * ms, comm * ms, np.full(size, took * ms))
