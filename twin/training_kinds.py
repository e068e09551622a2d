"""What training itself does to a whole job, kind by kind (twin/fault_kinds.py TRAINING_KINDS): a
checkpoint that every rank waits for and leaves a few seconds apart, an evaluation pass, expert routing
that loads one node more than the others for a few minutes at a time, pipeline stages that idle by
design, a job that restarts on more or fewer nodes. All benign: a healthy cluster does them every day,
and a flag on one of them is a false flag.

Each event names a job, not a node. While it lasts it either holds the job in a phase of its own
(``hold``: checkpoint, evaluation, then the staggered resume), shapes its nodes' share of the work (the
``node_work``, ``expert_work`` and ``bubble`` modifiers, twin/fault_state.py), or moves the job (a
resize). Its own module (a mixin of the Simulation, as the other kinds' handlers): it changes with the
workload model, not with the hardware's faults.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .counters import AppLine, G, stable_hash
from .fault_state import ActiveFault
from .scenario_model import FaultSpec

if TYPE_CHECKING:
    from .workload import JobRun

# The modifiers that are training's own layout, not a fault's: a what-if that takes a node's faults away
# leaves them (twin/fault_truth.py).
TRAINING_MODIFIERS = ("node_work", "expert_work", "bubble")
EVAL_WAIT_SHARE = 0.1  # an evaluation pass's tensor-parallel all-reduces and pipeline sends


class TrainingKindsMixin:
    """The training kinds' handlers and their per-tick parts (a mixin: the state lives on the
    Simulation)."""

    def _training_job(self, fault: ActiveFault) -> JobRun | None:
        """The event's job when it runs now (else None); the event then counts against it."""
        job_id = str(fault.spec.target["job"])
        job = next(j for j in self.jobs if j.spec.id == job_id)
        if job_id not in fault.jobs:
            fault.jobs.append(job_id)
        fault.state.setdefault("nodes", [])
        if job.state != "RUNNING":
            return None
        names = fault.state["nodes"]
        names.extend(n for n in (self.nodes[i] for i in job.nodes) if n not in names)
        names.sort()
        return job

    def _not_running(self, fault: ActiveFault) -> None:
        self._effect(fault, "job", f"job {fault.spec.target['job']} was not running at the onset: nothing")

    # ------------------------------------------------------------------- checkpoint and evaluation
    def _start_checkpoint_stall(self, fault: ActiveFault, spec: FaultSpec, node: None) -> None:
        job = self._training_job(fault)
        if job is None:
            return self._not_running(fault)
        until = spec.onset + spec.duration
        resume = until + self._stagger(spec, len(job.nodes))
        job.hold = {"phase": "checkpoint", "until": until, "resume": resume, "fault": fault}
        fault.state["resumed"] = {
            self.nodes[i]: round(float(self.unix(r)), 3) for i, r in zip(job.nodes, resume, strict=True)
        }
        self._app_log_rank0(
            job, f"saving checkpoint at iteration {int(job.step)} to /lustre/ckpt/{job.spec.name}"
        )
        self._effect(fault, "dcgm", "every GPU of the job idles (power, GPU_UTIL and tensor activity fall)")
        self._effect(fault, "procfs", "Lustre osc write bursts from every node of the job")
        self._effect(
            fault,
            "dcgm",
            f"nodes resume {spec.magnitude:g} s apart: the first wait in NCCL (GPU_UTIL ~100, no tensor)",
        )
        return None

    def _stagger(self, spec: FaultSpec, size: int) -> np.ndarray:
        """Each node's delay after the write: spread over exactly ``magnitude`` seconds, order drawn."""
        rng = np.random.default_rng(stable_hash(self.scenario.seed, spec.id) & 0xFFFFFFFF)
        offsets = rng.uniform(0.0, 1.0, size)
        if size > 1 and np.ptp(offsets) > 0:
            offsets = (offsets - offsets.min()) / np.ptp(offsets)
        return offsets * spec.magnitude

    def _start_eval_pause(self, fault: ActiveFault, spec: FaultSpec, node: None) -> None:
        job = self._training_job(fault)
        if job is None:
            return self._not_running(fault)
        until = spec.onset + spec.duration
        job.hold = {"phase": "eval", "until": until, "resume": np.full(len(job.nodes), until), "fault": fault}
        self._app_log_rank0(job, f"evaluating at iteration {int(job.step)}")
        self._effect(
            fault, "dcgm", f"forward passes only: tensor activity and power x{spec.magnitude:g} on every node"
        )
        self._effect(fault, "app_log", "no iteration lines; a validation loss line at the end")
        return None

    def _held_phase(self, job: JobRun) -> str | None:
        """The job's phase while a checkpoint or an evaluation holds it; None once every node resumed."""
        hold = job.hold
        if hold is None:
            return None
        if self.t < hold["until"]:
            return str(hold["phase"])
        if self.t < float(np.max(hold["resume"])):
            return "resume"
        job.hold = None
        if hold["phase"] == "checkpoint":
            job.last_checkpoint = self.t
            job.checkpoint_until = -1.0
            self._app_log_rank0(job, f"successfully saved checkpoint at iteration {int(job.step)}")
        else:
            self._log_validation(job)
        return None

    def _log_validation(self, job: JobRun) -> None:
        loss = self._loss(job) * 1.02  # held-out data: a little above the training loss
        text = (
            f"validation loss at iteration {int(job.step)} | lm loss value: {loss:.6E} | "
            f"lm loss PPL: {float(np.exp(loss)):.6E} |"
        )
        last = len(job.nodes) - 1
        self.app_lines.append(AppLine(self.t, int(job.nodes[last]), job.spec.id, job.ranks - 1, text))

    def _set_hold_windows(self, job: JobRun) -> None:
        """An evaluation pass (forward only, all nodes alike) or the resume after a checkpoint (the
        nodes that resumed wait in NCCL for the others, which still write)."""
        nodes = job.nodes
        self.intensity[nodes] = 1.0
        if job.phase == "eval":
            share = job.hold["fault"].spec.magnitude * job.profile["compute_share"]
            jitter = 1.0 + self.rng.normal(0.0, 0.02, (len(nodes), G))
            self.f_compute[nodes] = np.clip(share * jitter, 0.0, 1.0)
            self.f_wait[nodes] = EVAL_WAIT_SHARE
            self.wait_share[nodes] = EVAL_WAIT_SHARE
            return
        resumed = self.t >= job.hold["resume"]
        self.f_compute[nodes] = np.where(resumed[:, None], 0.0, 0.03)
        self.f_wait[nodes] = np.where(resumed[:, None], 1.0, 0.0)
        self.wait_share[nodes] = resumed.astype(float)

    def _node_phases(self, job: JobRun) -> Any:
        """Per node of the job, its phase: while resuming, the nodes still writing are checkpointing."""
        if job.phase != "resume" or job.hold is None:
            return job.phase
        return np.where(self.t >= job.hold["resume"], "resume", "checkpoint")

    # ------------------------------------------------------------------- routing and pipeline layout
    def _start_moe_imbalance(self, fault: ActiveFault, spec: FaultSpec, node: None) -> None:
        job = self._training_job(fault)
        fault.state.update(hot=-1, next_move=spec.onset, busiest=[])
        every = spec.target["every"]
        self._effect(
            fault,
            "dcgm",
            f"one node computes ~{spec.magnitude:.0%} more than the others (tensor activity, power); the "
            f"busiest node changes every {every:g} s",
        )
        if job is None:
            self._effect(fault, "job", "acts whenever the job runs while it lasts")

    def _moe_tick(self, fault: ActiveFault) -> None:
        """Expert routing moves: a new busiest node every ``every`` seconds (never the same twice)."""
        job = self._training_job(fault)
        if job is None or self.t < fault.state["next_move"] or len(job.nodes) < 2:
            return
        rng = np.random.default_rng(stable_hash(self.scenario.seed, fault.spec.id, int(self.t)) & 0xFFFFFFFF)
        others = [i for i in range(len(job.nodes)) if i != fault.state["hot"]]
        hot = int(rng.choice(others))
        fault.state.update(hot=hot, next_move=self.t + fault.spec.target["every"])
        fault.state["busiest"].append([round(self.unix(), 3), self.nodes[int(job.nodes[hot])]])

    def _moe_load(self, fault: ActiveFault, job: JobRun) -> np.ndarray:
        """Per node of the job: its work under the routing. Tokens are conserved: what the busiest node
        takes on, the others shed."""
        size = len(job.nodes)
        load = np.ones(size)
        hot = fault.state.get("hot", -1)
        if size > 1 and 0 <= hot < size:
            load[:] = 1.0 - fault.spec.magnitude / (size - 1)
            load[hot] = 1.0 + fault.spec.magnitude
        return load

    def _start_pipeline_bubble(self, fault: ActiveFault, spec: FaultSpec, node: None) -> None:
        self._training_job(fault)
        stages = self._stages_of(spec)
        fault.state["bubble"] = round(self._bubble_share(spec), 4)
        self._effect(
            fault,
            "dcgm",
            f"{stages} stages: the last computes {spec.magnitude:.0%} more than a middle stage, the first "
            f"{spec.magnitude / 2:.0%}; each GPU waits {fault.state['bubble']:.0%} of its step (bubble)",
        )

    def _stages_of(self, spec: FaultSpec) -> int:
        return next(j.spec.pipeline_stages for j in self.jobs if j.spec.id == str(spec.target["job"]))

    def _bubble_share(self, spec: FaultSpec) -> float:
        """1F1B's bubble as a share of the step: (p - 1) / (m + p - 1) (Megatron-LM)."""
        stages = self._stages_of(spec)
        return (stages - 1) / (spec.target["micro_batches"] + stages - 1)

    def _stage_work(self, fault: ActiveFault, job: JobRun) -> np.ndarray:
        """Per node of the job: its stage's work over what the job's layout already gives it."""
        size = len(job.nodes)
        stages = job.spec.pipeline_stages
        stage = np.arange(size) // max(1, size // stages)
        work = np.ones(size)
        work[stage == 0] += fault.spec.magnitude / 2
        work[stage == stages - 1] += fault.spec.magnitude
        return work / job.work

    def _shape_job(self, fault: ActiveFault, m: Any) -> None:
        """A routing or pipeline event's share of the per-tick modifiers (``_modify``)."""
        job = next(j for j in self.jobs if j.spec.id == str(fault.spec.target["job"]))
        if job.state != "RUNNING" or len(job.work) != len(job.nodes):
            return
        if fault.spec.kind == "moe_imbalance":
            load = self._moe_load(fault, job)
            m.node_work[job.nodes] *= load
            m.expert_work[job.nodes] *= load
        else:
            m.node_work[job.nodes] *= self._stage_work(fault, job)
            m.bubble[job.nodes] = np.maximum(m.bubble[job.nodes], fault.state["bubble"])

    # ------------------------------------------------------------------- resize
    def _start_job_resize(self, fault: ActiveFault, spec: FaultSpec, node: None) -> None:
        job = self._training_job(fault)
        if job is None:
            return self._not_running(fault)
        size = int(spec.target["nodes"])
        fault.state.update(from_nodes=[self.nodes[i] for i in job.nodes], to_nodes=[])
        step = int(job.step)
        self._app_log_rank0(job, f"saving checkpoint at iteration {step}; restarting on {size} nodes")
        self._finish(job, "REQUEUED", f"requeued to restart on {size} nodes")
        job.state = "PENDING"
        job.restart_at = spec.onset + spec.duration
        job.resize_to = size
        job.resize_event = fault
        self._effect(fault, "slurm", f"job {job.spec.id} requeued, then runs on {size} nodes (new node list)")
        self._effect(fault, "dcgm", "the old nodes go idle; the new ones start up (Lustre reads) and compute")
        return None

    def _resized(self, job: JobRun) -> None:
        """The resized job started again: its new nodes join the event's truth."""
        fault = job.resize_event
        job.resize_event = None
        if fault is None:
            return
        fault.state["to_nodes"][:] = [self.nodes[i] for i in job.nodes]  # in place: the truth holds it
        self._training_job(fault)
