"""What goes wrong that is not the node's hardware, kind by kind: FleetSight's sources going silent or
blind, an application's Xids (one GPU's storm, a whole job's crash), a check's tool missing, Fabric
Manager stopped. The truth says "hardware": false for each (a drain for one is a wrong drain).

Its own module (a mixin of the Simulation): these kinds test FleetSight's blind spots and change with
its sources and checks, not with the physics; none of them changes the modifiers.
"""

from __future__ import annotations

import random
from typing import Any

from . import faults as fc
from . import hardware as hw
from .checks import BINARIES as TOOL_BINARIES
from .counters import FABRIC_NOT_STARTED, G, LogLine, stable_hash
from .fault_state import ActiveFault
from .scenario_model import FaultSpec

# An Xid storm's lines come within its first minute (or the whole fault, if shorter).
XID_STORM_SPAN_S = 60.0


class BlindSpotFaultsMixin:
    """The not-hardware kinds' handlers (a mixin: the state lives on the Simulation)."""

    # FleetSight's sources going silent or blind, the operator's mistakes, an application's errors: the
    # truth says "hardware": false (a drain for one of them is a wrong drain). None changes the physics.
    def _start_telemetry_dropout(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        source = spec.target["source"]  # canonical: the scenario loader named it
        self.silenced[source][node] += 1
        fault.state.update(source=source)
        name = self.nodes[node]
        if source == "dcgm-exporter":
            self._effect(fault, "dcgm", f'/dcgm/{name}/metrics answers 503: up{{job="dcgm"}} = 0 for {name}')
        elif source == "node_agent":
            self._effect(
                fault,
                "node_agent",
                f'the node agent of {name} does not answer: up{{job="fleetsight-node"}} = 0',
            )
        else:
            self._effect(
                fault,
                "redfish",
                f"every Redfish resource of {name}'s BMC answers 503: the node agent's bmc collector fails "
                '(fleetsight_collector_success{collector="bmc"} = 0, fleetsight_bmc_up = 0)',
            )
        self._effect(
            fault, "job", "nothing: the hardware and the jobs are as they were; only the view is gone"
        )

    def _end_telemetry_dropout(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        self.silenced[fault.state["source"]][node] -= 1

    def _start_profiling_dropout(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        gpus = [self._gpu_target(spec)] if "gpu" in spec.target else list(range(G))
        self.profiling_blind[node, gpus] += 1
        fault.state.update(gpus=gpus)
        which = "every GPU" if len(gpus) == G else f"gpu {gpus[0]}"
        self._effect(
            fault,
            "dcgm",
            f"{which}: DCGM_FI_PROF_* (GR_ENGINE_ACTIVE, SM_ACTIVE, PIPE_TENSOR_ACTIVE, DRAM_ACTIVE, PCIE_*) "
            "read 0 while DCGM_FI_DEV_POWER_USAGE, DCGM_FI_DEV_SM_CLOCK and DCGM_FI_DEV_GPU_UTIL stay busy",
        )
        self._effect(fault, "job", "nothing: another client holds DCGM's profiling module; the job runs on")

    def _end_profiling_dropout(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        self.profiling_blind[node, fault.state["gpus"]] -= 1

    def _start_xid_storm(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        """One application Xid that the driver logs ``magnitude`` times (the same line, one GPU): one
        episode, however many lines."""
        gpu = self._gpu_target(spec)
        code = int(spec.target.get("code", 13))
        count = int(spec.magnitude)
        rng = random.Random(stable_hash(self.scenario.seed, spec.id, code) & 0xFFFFFFFF)
        job = self._job_on(node)
        pid: Any = 10000 + rng.randrange(50000) if job is not None else "'<unknown>'"  # as _emit_xid
        process = "python3" if job is not None else "<unknown>"
        bus = hw.xid_bus_id(hw.GPU_BDFS[gpu])
        line = fc.xid_line(bus, code, fc.xid_message(code, pid, process, rng))
        span = min(spec.duration, XID_STORM_SPAN_S)
        times = sorted(spec.onset + rng.uniform(0.0, span) for _ in range(count))
        fault.state.update(gpu=gpu, code=code, line=line, times=times, next=0)
        self.xid_last[node, gpu] = code
        self._storm_tick(fault)
        self._effect(
            fault, "kern.log", f"NVRM: Xid (PCI:{bus}): {code}, ... the same line {count} times in {span:g} s"
        )
        self._effect(fault, "dcgm", f"gpu {gpu}: DCGM_FI_DEV_XID_ERRORS={code}")
        if code in fc.XID_KILLS_JOB and job is not None and job.state == "RUNNING":
            self._effect(fault, "app_log", "the rank on that GPU faulted (an application error); job fails")
            self._kill_job(job, f"xid{code}", node, spec.onset + 2.0, gpu=gpu)

    def _storm_tick(self, fault: ActiveFault) -> None:
        """The storm's lines due before the next tick."""
        state, until = fault.state, self.t + self.scenario.tick
        times = state["times"]
        while state["next"] < len(times) and times[state["next"]] < until:
            self.klog(fault.node, state["line"], max(0.0, times[state["next"]] - self.t))
            state["next"] += 1

    def _start_job_crash_xids(self, fault: ActiveFault, spec: FaultSpec, node: None) -> None:
        """A job crashes (its code, not the hardware): every GPU of every node it runs on logs the same
        application Xid within a second or two, and the job fails on all of them at once."""
        job_id = str(spec.target["job"])
        code = int(spec.target.get("code", 43))
        fault.state.update(code=code, nodes=[])
        job = next(j for j in self.jobs if j.spec.id == job_id)
        if job.state != "RUNNING":
            self._effect(fault, "job", f"job {job_id} was not running at the onset: nothing crashed")
            return
        rng = random.Random(stable_hash(self.scenario.seed, spec.id, code) & 0xFFFFFFFF)
        nodes = [int(n) for n in job.nodes]
        fault.state["nodes"] = [self.nodes[n] for n in nodes]
        fault.jobs.append(job_id)
        for position, n in enumerate(nodes):
            newer = rng.random() < 0.8  # one driver per node
            for gpu in range(G):
                pid = 20000 + 64 * position + gpu  # one rank per GPU
                message = fc.xid_message(code, pid, "python3", rng, newer_driver=newer)
                self.klog(
                    n, fc.xid_line(hw.xid_bus_id(hw.GPU_BDFS[gpu]), code, message), rng.uniform(0.0, 1.5)
                )
                self.xid_last[n, gpu] = code
        self._effect(
            fault,
            "kern.log",
            f"NVRM: Xid (PCI:...): {code}, on all {G} GPUs of {len(nodes)} nodes within 2 s",
        )
        self._effect(fault, "dcgm", f"DCGM_FI_DEV_XID_ERRORS={code} on every GPU of the job")
        self._effect(fault, "app_log", "every rank: CUDA error: an illegal memory access; the job fails")
        self._kill_job(job, "job_crash", nodes[0], spec.onset + 1.0)
        fault.failed_jobs.append(job_id)

    def _start_check_tool_missing(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        tool = spec.target["tool"]  # canonical: the scenario loader named it
        binary = TOOL_BINARIES[tool]
        fault.state.update(tool=tool)
        self._effect(
            fault,
            "checks",
            f"the checks that run {tool} get the shell's '{binary}: command not found' (exit 127) from the "
            "twin's stand-in (twin/checks.py): unknown (tool_missing), never failed",
        )

    def fmlog(self, node: int, text: str, offset: float = 0.0) -> None:
        """A line of the node's Fabric Manager log (after its stamp: "[LEVEL] [tid N] text")."""
        self.kernel_lines.append(LogLine(self.t + offset, node, text, log="fabricmanager"))

    def _fabric_manager_tid(self, node: int) -> int:
        return 2000 + node  # as the twin's other Fabric Manager lines (twin/log_files.py)

    def _start_fabric_manager_down(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        self.set_fabric_manager(node, running=False)
        for i, line in enumerate(fc.fabric_manager_stopped_lines(self._fabric_manager_tid(node))):
            self.fmlog(node, line, 0.001 * i)
        job = self._job_on(node)
        running = (job.spec.id, job.attempt) if job is not None and job.state == "RUNNING" else None
        fault.state.update(running=running, crashed=[])
        self._effect(fault, "fabricmanager.log", "Received signal 15, Fabric Manager is shutting down")
        self._effect(
            fault,
            "dcgm",
            f"every GPU: DCGM_FI_DEV_FABRIC_MANAGER_STATUS={FABRIC_NOT_STARTED} (not started), where the "
            "counters file publishes it",
        )
        self._effect(
            fault,
            "job",
            "a running job keeps its NVLink routes; a job that starts on the node meanwhile fails at CUDA "
            "initialisation ('system not yet initialized')",
        )

    def _fabric_manager_tick(self, fault: ActiveFault) -> None:
        """A job that started on the node after Fabric Manager stopped fails in its start-up: its ranks
        there cannot join the NVLink fabric."""
        node = fault.node
        job = self._job_on(node)
        if job is None or job.state != "RUNNING":
            return
        attempt = (job.spec.id, job.attempt)
        if attempt == fault.state["running"] or list(attempt) in fault.state["crashed"]:
            return
        fault.state["crashed"].append(list(attempt))
        if job.spec.id not in fault.jobs:
            fault.jobs.append(job.spec.id)
            fault.progress.setdefault(job.spec.id, [0.0, 0.0])
        if job.spec.id not in fault.failed_jobs:
            fault.failed_jobs.append(job.spec.id)
        self._kill_job(job, "fabric_manager", node, self.t)

    def _end_fabric_manager_down(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        self.set_fabric_manager(node, running=True)
        tid = self._fabric_manager_tid(node) + 100
        for i, line in enumerate(fc.fabric_manager_started_lines(tid, hw.DRIVER_VERSION)):
            self.fmlog(node, line, 0.001 * i)
