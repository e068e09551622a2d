"""Silent data corruption in training (kind ``sdc_training``) and the per-replica training log that can
show it (a job's ``replica_log: true``).

A GPU that computes wrong without an error makes its data-parallel replica's local gradient wrong; the
all-reduce averages the error into every replica's update, so the job's loss drifts upward slowly and no
NaN appears (NaN/Inf is ~1 % of SDC outcomes, issue #43). Only the replica that holds the bad GPU
disagrees with its peers, step after step, in its local gradient norm and loss.

A job with ``replica_log`` prints, per step and replica, one dependency-free key=value line from the
replica's last pipeline stage (where the loss is computed), the form docs/anomaly.md gives jobs:

    fleetsight-train step=1200 replica=3 node=n0007 loss=2.412330 grad_norm=0.8123 step_time_ms=2503.1
        data_ms=24.0 compute_ms=2101.7 comm_ms=377.4

(one line; the last three keys, where the rank's step went, are twin/pace_faults.py's).

Healthy training is not quiet: a bad batch lands on one replica and spikes its loss for a step, then
every replica's loss is up for a few steps while the update it caused washes out (an ordinary spike, it
recovers); replicas see different data, so their local loss and gradient norm differ step to step. The
figures and assumptions are in docs/twin.md ("sdc_training").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .counters import AppLine, G, stable_hash
from .fault_state import ActiveFault
from .scenario_model import FaultSpec

if TYPE_CHECKING:
    from .workload import JobRun

# Healthy training, per step (assumptions, docs/twin.md): the job's loss noise and gradient-norm noise
# are the global Megatron line's (twin/workload.py); one replica's local values spread around the job's.
LOSS_NOISE = 0.01
GRAD_NOISE = 0.05
GRAD_NORM = 0.8
REPLICA_LOSS_SPREAD = 0.01  # relative sd of a replica's local loss around the job's mean
REPLICA_GRAD_SPREAD = 0.04  # relative sd of a replica's local gradient norm around the job's mean
# Ordinary loss spikes (bad batches): how often, how high (loss multiplier at the peak, log-uniform), how
# long (half-life in steps), and how much more the gradient norm jumps than the loss.
SPIKES_PER_STEP = 1.0 / 2000.0
SPIKE_PEAK = (1.05, 2.0)
SPIKE_HALF_LIFE = (1.0, 6.0)
SPIKE_GRAD_GAIN = (2.0, 8.0)
# Silent corruption: the share of the corrupt replica's gradient error that shows in its local loss,
# and the job's loss drift per step for each unit of (error / replicas) that the all-reduce spreads.
SDC_LOSS_SHARE = 0.25
SDC_DRIFT_PER_STEP = 0.002


@dataclass
class ReplicaLog:
    """One job's per-step training model: its own random stream (the simulation's stays as it was),
    the ordinary spike in progress, the last step it logged and that step's job-wide values."""

    rng: np.random.Generator
    last_step: int = -1
    excess: float = 0.0  # log loss excess of the spike in progress (0: none)
    grad_excess: float = 0.0
    decay: float = 1.0
    loss: float | None = None
    grad: float | None = None
    spikes: list[int] = field(default_factory=list)  # the steps ordinary spikes started at


def replica_layout(job: JobRun) -> tuple[int, int]:
    """(data-parallel replicas, pipeline stages) of a running job: Megatron's rank order puts replicas
    next to each other, so a node's replica is its position modulo the replica count."""
    size = len(job.nodes)
    stages = int(job.stage.max()) + 1 if len(job.stage) == size and size else 1
    return max(1, size // stages), stages


class SdcFaultsMixin:
    """The Simulation's silent corruption and per-replica logs (a mixin: the state lives on it)."""

    # ------------------------------------------------------------------------------- the fault
    def _start_sdc_training(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        job = self._job_on(node)
        wanted = spec.target.get("job")
        if job is None or job.state != "RUNNING" or (wanted is not None and str(wanted) != job.spec.id):
            fault.state.update(job=None)
            self._effect(fault, "none", "no job of the target's on the node: nothing to corrupt")
            return
        replicas, _ = replica_layout(job)
        position = int(np.nonzero(job.nodes == node)[0][0])
        fault.state.update(
            job=job.spec.id,
            node=node,
            replica=position % replicas,
            replicas=replicas,
            onset_step=int(job.step) + 1,
            nodes=[self.nodes[node]],
        )
        self._effect(
            fault,
            "app_log",
            f"replica {position % replicas}'s local gradient norm x{1 + spec.magnitude:g} and loss "
            f"x{1 + SDC_LOSS_SHARE * spec.magnitude:g}; the job's loss drifts up; no NaN",
        )

    def _sdc_tick(self, fault: ActiveFault) -> None:
        """The truth names the corrupt replica and the first corrupt step (what an evaluation scores)."""
        if fault.truth is not None and fault.state.get("job") and "replica" not in fault.truth:
            fault.truth.update(replica=fault.state["replica"], onset_step=fault.state["onset_step"])

    def _sdc_effects(self, job: JobRun, step: int) -> tuple[float, float, int, float]:
        """At a step of a job: (job loss factor, job grad-norm factor, corrupt replica or -1, its local
        gradient error). The replica is the bad node's where the job runs now (a requeue may move it)."""
        loss_f, grad_f, replica, error = 1.0, 1.0, -1, 0.0
        for fault in self.active_faults:
            if fault.spec.kind != "sdc_training" or fault.state.get("job") != job.spec.id:
                continue
            where = np.nonzero(job.nodes == fault.state["node"])[0]
            if not len(where) or step < fault.state["onset_step"]:
                continue
            replicas, _ = replica_layout(job)
            share = fault.spec.magnitude / replicas
            loss_f *= 1.0 + SDC_DRIFT_PER_STEP * share * (step - fault.state["onset_step"])
            grad_f *= 1.0 + share
            replica, error = int(where[0]) % replicas, fault.spec.magnitude
        return loss_f, grad_f, replica, error

    def _sdc_global(self, job: JobRun, loss: float, grad_norm: float) -> tuple[float, float]:
        """The global (Megatron) line's values: the per-step model's where the job logs replicas, else the
        line's own values with the corruption's share on them."""
        model = getattr(self, "_replica_logs", {}).get(job.spec.id)
        if job.spec.replica_log and model is not None and model.loss is not None:
            return model.loss, model.grad or grad_norm
        loss_f, grad_f, _, _ = self._sdc_effects(job, int(job.step))
        return loss * loss_f, grad_norm * grad_f

    # ------------------------------------------------------------------------------- replica lines
    def _train_steps(self, job: JobRun, before: float) -> None:
        """Per-step training values for each step the job crossed this tick; lines only where it logs
        replicas (other jobs keep their one global line every ~30 s)."""
        if not job.spec.replica_log or not len(job.nodes):
            return
        logs: dict[str, ReplicaLog] = self.__dict__.setdefault("_replica_logs", {})
        model = logs.get(job.spec.id)
        if model is None:
            seed = stable_hash(self.scenario.seed, "replica_log", job.spec.id)
            model = logs[job.spec.id] = ReplicaLog(np.random.default_rng(seed))
        model.last_step = min(model.last_step, int(before))  # a requeued job resumes from its checkpoint
        first, last = model.last_step + 1, int(job.step)
        for step in range(max(first, 1), last + 1):
            when = self.t - (job.step - step) * job.step_time
            self._replica_step(job, model, step, when)
        model.last_step = max(model.last_step, last)

    def _replica_step(self, job: JobRun, model: ReplicaLog, step: int, when: float) -> None:
        replicas, stages = replica_layout(job)
        rng = model.rng
        base = 1.9 + (job.profile["loss0"] - 1.9) * step**-0.35
        shared_loss = 1.0 + rng.normal(0.0, LOSS_NOISE)
        shared_grad = 1.0 + rng.normal(0.0, GRAD_NOISE)
        local_loss = rng.normal(0.0, REPLICA_LOSS_SPREAD, replicas)
        local_grad = rng.normal(0.0, REPLICA_GRAD_SPREAD, replicas)
        spike_loss, spike_grad = self._ordinary_spike(model, step, replicas)
        mult = self.loss_mult.get(job.spec.id, 1.0)  # a scenario's loss_spike event
        loss_f, _, bad, error = self._sdc_effects(job, step)  # the job's grad: the replicas' mean
        loss = base * shared_loss * (1.0 + local_loss - local_loss.mean()) * spike_loss * mult * loss_f
        grad = GRAD_NORM * shared_grad * (1.0 + local_grad - local_grad.mean()) * spike_grad
        grad *= mult**2 if mult > 1 else 1.0
        if bad >= 0:
            loss[bad] *= 1.0 + SDC_LOSS_SHARE * error
            grad[bad] *= 1.0 + error
        model.loss, model.grad = float(loss.mean()), float(grad.mean())
        pace = self._pace_split(job, step, when)  # where each rank's step went: twin/pace_faults.py
        for replica in range(replicas):
            position = (stages - 1) * replicas + replica  # the replica's last stage computes the loss
            node = int(job.nodes[position])
            text = (
                f"fleetsight-train step={step} replica={replica} node={self.nodes[node]} "
                f"loss={loss[replica]:.6f} grad_norm={grad[replica]:.4f} "
                f"step_time_ms={pace.step[position]:.1f} data_ms={pace.data[position]:.1f} "
                f"compute_ms={pace.compute[position]:.1f} comm_ms={pace.comm[position]:.1f}"
            )
            self.app_lines.append(AppLine(when, node, job.spec.id, position * G, text))

    def _ordinary_spike(self, model: ReplicaLog, step: int, replicas: int) -> tuple[np.ndarray, np.ndarray]:
        """Per replica, this step's loss and grad-norm multipliers from an ordinary spike: on its first
        step the replica that drew the bad batch carries it twice over, then every replica alike while
        the update it caused washes out."""
        rng = model.rng
        loss, grad = np.ones(replicas), np.ones(replicas)
        if rng.random() < SPIKES_PER_STEP:
            peak = math.exp(rng.uniform(*(math.log(p) for p in SPIKE_PEAK)))
            model.excess = math.log(peak)
            model.grad_excess = math.log(1.0 + (peak - 1.0) * rng.uniform(*SPIKE_GRAD_GAIN))
            model.decay = 0.5 ** (1.0 / rng.uniform(*SPIKE_HALF_LIFE))
            model.spikes.append(step)
            bad = int(rng.integers(replicas))
            loss[:], grad[:] = math.exp(model.excess), math.exp(model.grad_excess)
            loss[bad], grad[bad] = loss[bad] ** 2, grad[bad] ** 2
        elif model.excess > 1e-4:
            model.excess *= model.decay
            model.grad_excess *= model.decay
            loss[:], grad[:] = math.exp(model.excess), math.exp(model.grad_excess)
        return loss, grad
