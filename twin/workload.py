"""Workload: scheduler jobs on sets of nodes, their phases (start-up, compute, checkpoints, stalls),
their parallel layout and step times, and the ranks' Megatron-style logs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import hardware as hw
from .counters import STARTUP_S, AppLine, G
from .scenario_model import MODEL_PROFILES, JobSpec


@dataclass
class JobRun:
    spec: JobSpec
    index: int
    nodes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    state: str = "PENDING"
    run_start: float = 0.0
    started_at: float | None = None
    ended_at: float | None = None
    step: float = 0.0
    attempt: int = 0
    last_checkpoint: float = 0.0
    checkpoint_until: float = -1.0
    stall_until: float = -1.0
    restart_at: float | None = None
    next_log_step: int = 0
    step_time: float = 0.0
    phase: str = "pending"
    exit_reason: str = ""
    nominal_step_time: float = 0.0  # the step time this tick without faults or disturbances
    work: np.ndarray = field(default_factory=lambda: np.ones(0))  # per node: its pipeline stage's work
    stage: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    expert_load: np.ndarray = field(default_factory=lambda: np.zeros(0))  # MoE: drifting imbalance
    allocations: list[dict] = field(default_factory=list)  # node lists over time, for meta.json
    # A checkpoint or an evaluation holding the whole job (twin/training_kinds.py): its phase, when it
    # ends, when each node resumes, and its event.
    hold: dict[str, Any] | None = None
    resize_to: int | None = None  # the node count a job_resize restarts it on
    resize_event: Any = None  # that job_resize, until the job runs again

    @property
    def profile(self) -> dict[str, float]:
        return MODEL_PROFILES[self.spec.profile]

    @property
    def ranks(self) -> int:
        return len(self.nodes) * G


MICRO_BATCHES = 8  # segments of compute a step's wait is spread between
END_WAIT_SHARE = 0.15  # share of a step's wait in one block at its end (gradient all-reduce, optimizer)


class WorkloadMixin:
    """The Simulation's jobs (a mixin: the state lives on the Simulation)."""

    def _update_jobs(self) -> None:
        for job in self.jobs:
            if job.state == "PENDING" and self._may_start(job):
                self._try_start(job)
            if job.state == "RUNNING":
                if self.t >= job.spec.end:
                    self._finish(job, "COMPLETED", "end of allocation")
                else:
                    self._step_job(job)
                    self._account_progress(job)

    def _may_start(self, job: JobRun) -> bool:
        if self.t < job.spec.start or self.t >= job.spec.end:
            return False
        return job.restart_at is None or self.t >= job.restart_at

    def _try_start(self, job: JobRun) -> None:
        wanted = job.spec.nodes
        count = job.resize_to or (wanted if isinstance(wanted, int) else len(wanted))
        preferred = (
            list(job.nodes)
            if len(job.nodes)
            else ([] if isinstance(wanted, int) else [self.node_index[n] for n in wanted])
        )
        free = [i for i in range(len(self.nodes)) if self.node_job[i] < 0 and self.healthy(i)]
        chosen = [i for i in preferred if i in free]
        for i in free:
            if len(chosen) >= count:
                break
            if i not in chosen:
                chosen.append(i)
        if len(chosen) < count:
            return
        job.nodes = np.array(sorted(chosen[:count]), dtype=np.int64)
        job.state = "RUNNING"
        job.attempt += 1
        job.run_start = self.t
        job.started_at = job.started_at if job.started_at is not None else self.t
        job.last_checkpoint = self.t
        job.checkpoint_until = -1.0
        job.restart_at = None
        job.hold = None
        job.phase = "startup"
        self.node_job[job.nodes] = job.index
        self._lay_out(job)
        job.allocations.append(
            {"nodes": [self.nodes[i] for i in job.nodes], "start": self.iso(), "start_unix": self.unix()}
        )
        self._resized(job)
        self._app_log_all(
            job,
            f"starting training (attempt {job.attempt}) on {len(job.nodes)} nodes, resuming from "
            f"iteration {int(job.step)}",
        )

    def _finish(self, job: JobRun, state: str, reason: str) -> None:
        job.state = state
        job.ended_at = self.t
        job.exit_reason = reason
        job.phase = "done"
        self.node_job[job.nodes] = -1
        if job.allocations and "end" not in job.allocations[-1]:
            job.allocations[-1].update(end=self.iso(), end_unix=self.unix(), state=state)

    def _kill_job(
        self,
        job: JobRun,
        reason: str,
        node: int,
        when: float,
        gpu: int | None = None,
        silent_node: int | None = None,
    ) -> None:
        """The job dies: error lines in the ranks' logs, FAILED, and requeued if its policy says so."""
        self._app_failure_lines(job, reason, node, when, gpu, silent_node)
        self._finish(job, "FAILED", reason)
        # Work since the last checkpoint is lost.
        job.step = (
            job.step - (self.t - job.last_checkpoint) / max(job.step_time, 1e-3)
            if job.step_time
            else job.step
        )
        job.step = max(0.0, job.step)
        if job.spec.restart == "requeue":
            job.state = "PENDING"
            job.restart_at = self.t + job.spec.restart_delay

    def _phase(self, job: JobRun) -> str:
        since = self.t - job.run_start
        if since < STARTUP_S:
            return "startup"
        held = self._held_phase(job)
        if held is not None:
            return held
        if self.t < job.checkpoint_until:
            return "checkpoint"
        if job.checkpoint_until >= 0 and self.t >= job.checkpoint_until:
            job.checkpoint_until = -1.0
            job.last_checkpoint = self.t
            self._app_log_rank0(job, f"successfully saved checkpoint at iteration {int(job.step)}")
        if self.t - job.last_checkpoint >= job.spec.checkpoint_interval:
            slow = float(np.max(self.ost_slow))
            job.checkpoint_until = self.t + job.spec.checkpoint_duration * (1.0 + (slow - 1.0) * 0.2)
            self._app_log_rank0(
                job, f"saving checkpoint at iteration {int(job.step)} to /lustre/ckpt/{job.spec.name}"
            )
            return "checkpoint"
        if self.t < job.stall_until:
            return "stall"
        stall_p = 0.004 + (0.08 if float(np.max(self.ost_slow)) > 1.0 else 0.0)
        if self.prng.random() < stall_p:
            job.stall_until = self.t + self.scenario.tick * (1 + self.prng.randrange(3))
            return "stall"
        return "compute"

    def _lay_out(self, job: JobRun) -> None:
        """Pipeline stages across the job's nodes (tensor parallel fills each node; Megatron's rank
        order puts data-parallel replicas next to each other, so stage = position // replicas). The
        first stage also embeds the tokens and the last computes the LM head and the loss: both carry
        more work than the middle stages, whose GPUs wait in pipeline bubbles instead."""
        size = len(job.nodes)
        stages = job.spec.pipeline_stages if self.scenario.realism.layout else 1
        replicas = max(1, size // stages)
        job.stage = np.arange(size) // replicas
        work = np.ones(size)
        if stages > 1:
            work[job.stage == 0] += 0.02
            work[job.stage == stages - 1] += 0.04
        job.work = work
        job.expert_load = np.zeros(size)

    def _drift_experts(self, job: JobRun) -> None:
        """MoE: the experts' load per node wanders (an Ornstein-Uhlenbeck walk, ~10 min memory)."""
        sigma = job.profile.get("expert_imbalance", 0.0)
        if not sigma or not self.scenario.realism.layout:
            return
        tau, dt_ = 600.0, self.scenario.tick
        job.expert_load += -job.expert_load * dt_ / tau + sigma * np.sqrt(2 * dt_ / tau) * self.rng.normal(
            0.0, 1.0, len(job.nodes)
        )

    def _cap_clock(self, job: JobRun, cap: np.ndarray) -> np.ndarray:
        """Per GPU of the job: the clock ratio its power limit allows while computing."""
        nodes = job.nodes
        demand = job.profile["power"] * hw.GPU_TDP_W * self.gpu_power_scale[nodes]
        self.power_demand[nodes] = demand
        if not self.scenario.realism.power_cap:
            self.power_demand[nodes] = np.minimum(demand, 640.0 * self.gpu_power_scale[nodes])
            return np.ones(demand.shape)
        return np.minimum(1.0, (cap / demand) ** 0.4)

    def _node_factor(self, job: JobRun, what_if: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """Per GPU compute-time multipliers of the job's nodes: with what faults and disturbances do
        to them, and nominal (the same job on the same silicon without them). ``what_if``: other
        modifier arrays (``cap_w``, ``clock_ratio``, ``node_slow``, ``h2d_bandwidth``) to compute with
        instead of the simulation's, which it then leaves as they are (the truth's what-if questions)."""
        nodes = job.nodes
        state = self if what_if is None else what_if
        layout = (job.work * (1.0 + job.expert_load) * self.node_speed[nodes])[:, None]
        trained = layout * state.node_work[nodes, None]  # training's own load: routing, stages
        nominal_clock = self._cap_clock(job, np.full((len(nodes), G), hw.GPU_TDP_W))
        cap_clock = self._cap_clock(job, state.cap_w[nodes])
        if what_if is None:
            self.cap_clock[nodes] = cap_clock
        clock = np.minimum(state.clock_ratio[nodes], cap_clock)
        h2d_ratio = state.h2d_bandwidth[nodes] / (hw.PCIE_GEN_LANE_BYTES[5] * 16)
        h2d = 1.0 + 0.25 * np.clip(1.0 - h2d_ratio, 0.0, 1.0)
        per_gpu = trained * state.node_slow[nodes, None] * h2d / (clock * self.gpu_eff[nodes])
        nominal = layout / (nominal_clock * self.gpu_eff[nodes])
        return per_gpu, nominal

    def _step_job(self, job: JobRun) -> None:
        job.phase = self._phase(job)
        profile = job.profile
        if job.phase != "compute":
            job.step_time = job.step_time or profile["step_time"]
            job.nominal_step_time = job.nominal_step_time or profile["step_time"]
            self._set_idle_windows(job)
            return
        self._drift_experts(job)
        per_gpu, nominal = self._node_factor(job)
        share = profile["compute_share"]
        base = profile["step_time"]
        jitter = 1.0 + abs(self.rng.normal(0.0, 0.01))
        stall = float(self.node_stall[job.nodes].max())  # a node's data loader hiccups: all wait
        job.step_time = (
            base * (share * per_gpu.max() + (1 - share) * self.comm_slow[job.nodes].max()) * jitter
        )
        job.step_time += stall
        job.nominal_step_time = base * (share * nominal.max() + (1 - share)) * jitter
        # A pipeline's bubble: part of each GPU's step waits for the neighbouring stages by design.
        busy = 1.0 - self.bubble[job.nodes, None]
        self._sample_windows(job, base * share * per_gpu * busy, stall)
        before = job.step
        job.step += self.scenario.tick / job.step_time
        self._train_steps(job, before)  # per-replica lines, silent corruption: twin/sdc_faults.py
        if int(job.step) >= job.next_log_step:
            self._log_progress(job)
            interval = max(1, round(30.0 / job.step_time))
            job.next_log_step = (int(job.step) // interval + 1) * interval

    def _set_idle_windows(self, job: JobRun) -> None:
        """Start-up, checkpoints and stalls: the GPUs are mostly idle (no kernel resident). An evaluation
        pass and the staggered resume after a checkpoint are twin/training_kinds.py's."""
        if job.phase in ("eval", "resume"):
            self._set_hold_windows(job)
            return
        nodes = job.nodes
        self.f_compute[nodes] = 0.04 if job.phase == "startup" else 0.03
        self.f_wait[nodes] = 0.0
        self.wait_share[nodes] = 0.0
        self.intensity[nodes] = 1.0

    def _sample_windows(self, job: JobRun, compute_s: np.ndarray, stall: float) -> None:
        """What each GPU did in the window its DCGM sample averaged.

        A step of ``T`` seconds holds the GPU's compute (``compute_s``) and the time it waits in
        collectives with the NCCL kernel resident (``T - compute_s``: exposed communication,
        pipeline bubbles, slower peers). Part of the wait falls between the step's micro-batches
        (pipeline sends and receives, tensor-parallel all-reduces), the rest in one block at the
        step's end (the data-parallel gradient all-reduce and the optimizer). Each node's sampler is
        not synchronised with the step: its window starts at a random phase. Without phase sampling
        the window is the whole tick (the step's average)."""
        nodes = job.nodes
        period = job.step_time
        compute_s = np.minimum(compute_s, period)
        realism = self.scenario.realism
        if realism.phase_sampling:
            window = min(realism.sample_window, self.scenario.tick)
            phase = self.rng.uniform(0.0, period, (len(nodes), 1))
            until = _compute_until(phase + window, compute_s, period) - _compute_until(
                phase, compute_s, period
            )
            f_c = until / window
        else:
            f_c = compute_s / period
            f_c = f_c * (1.0 + self.rng.normal(0.0, 0.015, f_c.shape))
        f_c = np.clip(f_c, 0.0, 1.0)
        f_w = 1.0 - f_c
        if stall > 0:
            # The hiccuping node's GPUs idle (no kernel), its peers wait for it in NCCL.
            stalled = self.node_stall[nodes] > 0
            waiting_for_it = min(1.0, stall / period)
            f_c = f_c * (1.0 - waiting_for_it)
            f_w = np.where(stalled[:, None], 0.0, 1.0 - f_c)
        self.f_compute[nodes] = f_c
        self.f_wait[nodes] = f_w
        self.wait_share[nodes] = 1.0 - (compute_s / period).mean(axis=1)
        sigma = self.intensity_sigma
        if sigma:
            # Attention, MLP and optimizer kernels differ in tensor-core use: the window sees a mix.
            per_node = self.rng.normal(0.0, sigma, (len(nodes), 1))
            self.intensity[nodes] = np.clip(
                1.0 + per_node + self.rng.normal(0.0, sigma * 0.6, f_c.shape), 0.5, 1.5
            )
        else:
            self.intensity[nodes] = np.clip(1.0 + self.rng.normal(0.0, 0.03, f_c.shape), 0.5, 1.5)

    def _sample_jobs(self) -> None:
        """Per node: the job's phase, tensor ratio and memory; idle nodes compute nothing."""
        n = len(self.nodes)
        self._phase_of_node = np.full(n, "idle", dtype=object)
        self._tensor_ratio = np.zeros(n)
        self._fb_target = np.full(n, 512.0)
        idle = self.node_job < 0
        self.f_compute[idle] = 0.0
        self.f_wait[idle] = 0.0
        self.wait_share[idle] = 0.0
        self.power_demand[idle] = hw.GPU_IDLE_W
        self.cap_clock[idle] = 1.0
        for job in self.jobs:
            if job.state != "RUNNING":
                continue
            nodes = job.nodes
            self._phase_of_node[nodes] = self._node_phases(job)
            self._tensor_ratio[nodes] = job.profile["tensor"]
            self._fb_target[nodes] = job.profile["fb_used_gib"] * 1024

    # ----------------------------------------------------------------------------------- app logs
    def _loss(self, job: JobRun) -> float:
        step = max(job.step, 1.0)
        base = 1.9 + (job.profile["loss0"] - 1.9) * step**-0.35
        return base * (1 + self.rng.normal(0.0, 0.01)) * self.loss_mult.get(job.spec.id, 1.0)

    def _log_progress(self, job: JobRun) -> None:
        loss = self._loss(job)
        spike = self.loss_mult.get(job.spec.id, 1.0)
        grad_norm = 0.8 * (1 + self.rng.normal(0.0, 0.05)) * (spike**2 if spike > 1 else 1.0)
        loss, grad_norm = self._sdc_global(job, loss, grad_norm)
        iteration = int(job.step)
        batch = 4 * job.ranks
        text = (
            f"iteration {iteration:>8d}/ 2000000 | consumed samples: {iteration * batch:>12d} | "
            f"elapsed time per iteration (ms): {job.step_time * 1000:.1f} | learning rate: 2.994E-04 | "
            f"global batch size: {batch:>5d} | lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: "
            f"{grad_norm:.3f} | "
            "number of skipped iterations:   0 | number of nan iterations:   0 |"
        )
        self._app_log_all(job, text)

    def _app_log_all(self, job: JobRun, text: str) -> None:
        for position, node in enumerate(job.nodes):
            for local in range(G):
                self.app_lines.append(AppLine(self.t, int(node), job.spec.id, position * G + local, text))

    def _app_log_rank0(self, job: JobRun, text: str) -> None:
        if len(job.nodes):
            self.app_lines.append(AppLine(self.t, int(job.nodes[0]), job.spec.id, 0, text))

    def _app_failure_lines(
        self, job: JobRun, reason: str, node: int, when: float, gpu: int | None, silent_node: int | None
    ) -> None:
        position = int(np.where(job.nodes == node)[0][0]) if node in job.nodes else 0
        culprit = position * G + (gpu or 0)
        seq = int(job.step) * 3 + 7
        for pos, n in enumerate(job.nodes):
            if silent_node is not None and n == silent_node:
                continue
            for local in range(G):
                rank = pos * G + local
                if rank == culprit and reason.startswith("xid"):
                    detail = (
                        "unspecified launch failure"
                        if reason in ("xid79", "xid74", "xid119")
                        else "an illegal memory access was encountered"
                    )
                    text = (
                        f"RuntimeError: CUDA error: {detail}\n"
                        "CUDA kernel errors might be asynchronously reported at some other API call, so the "
                        "stacktrace below might be incorrect."
                    )
                elif reason == "job_crash":  # the job's own code: every rank faults at once
                    text = (
                        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
                        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."
                    )
                elif reason == "fabric_manager" and n == node:  # no NVLink fabric to register with
                    text = (
                        "RuntimeError: CUDA error: system not yet initialized\n"
                        "CUDA kernel errors might be asynchronously reported at some other API call, so the "
                        "stacktrace below might be incorrect."
                    )
                elif reason == "nccl_ib" and n == node:
                    text = (
                        f"{self.nodes[n]}:{4000 + rank}:{4100 + rank} [{local}] "
                        "transport/net_ib.cc:1696 NCCL WARN NET/IB : "
                        f"Got completion from peer 10.1.{n // 256}.{n % 256}<{50000 + rank}> with "
                        "status=12 opcode=0 len=0 "
                        "vendor err 129 (Recv) localGid ::ffff:10.1.0.1 remoteGids::ffff:10.1.0.2\n"
                        f"{self.nodes[n]}:{4000 + rank}:{4100 + rank} [{local}] NCCL INFO "
                        "transport/net.cc:1298 -> 6"
                    )
                elif reason == "nvswitch" and n == node:
                    text = (
                        f"{self.nodes[n]}:{4000 + rank}:{4100 + rank} [{local}] NCCL WARN Cuda failure "
                        "'uncorrectable NVLink error was detected during the execution'"
                    )
                else:
                    text = (
                        f"[rank{rank}]:[E ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught "
                        "collective operation timeout: "
                        f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=67108864, "
                        "NumelOut=67108864, Timeout(ms)=600000) "
                        "ran for 600061 milliseconds before timing out."
                    )
                self.app_lines.append(AppLine(max(self.t, when), int(n), job.spec.id, rank, text))


def _compute_until(x: np.ndarray, compute_s: np.ndarray, period: float) -> np.ndarray:
    """Seconds of compute in [0, x) when each step of `period` s is MICRO_BATCHES segments of
    compute then wait, followed by a block of wait (END_WAIT_SHARE of the step's wait)."""
    whole = np.floor(x / period)
    into = x - whole * period
    wait = period - compute_s
    segment = (compute_s + wait * (1.0 - END_WAIT_SHARE)) / MICRO_BATCHES
    per_segment = compute_s / MICRO_BATCHES
    done = np.minimum(np.floor(into / segment), MICRO_BATCHES)
    partial = np.where(done < MICRO_BATCHES, np.minimum(into - done * segment, per_segment), 0.0)
    return whole * compute_s + done * per_segment + partial
