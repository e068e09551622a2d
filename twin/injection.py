"""Faults and benign disturbances over the run: which start and end each tick, and the per-tick
modifiers the physics reads (power caps, clock ratios, slow nodes and links, slow OSTs, loss
multipliers); and the benign disturbances a healthy cluster has, drawn from the seed.

What each kind does when it starts, while it lasts and when it ends is its handlers' (found by name,
``_start_<kind>``/``_end_<kind>``): the node's hardware in twin/node_faults.py, the IB fabric in
twin/link_faults.py, what is not the hardware in twin/blind_spot_faults.py. Each event's truth line
and its part in its jobs' pace are twin/fault_truth.py's; its state is twin/fault_state.py's.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .blind_spot_faults import BlindSpotFaultsMixin
from .counters import G, P
from .fabric_gray_faults import FabricGrayFaultsMixin
from .fault_kinds import PACE_KINDS, PRECURSOR_KINDS, TRAINING_KINDS
from .fault_state import NODE_MODIFIERS, ActiveFault
from .fault_truth import FaultTruthMixin
from .link_faults import LinkFaultsMixin
from .node_faults import NodeFaultsMixin
from .pace_faults import PaceFaultsMixin
from .precursor_faults import PrecursorFaultsMixin
from .scenario_model import FaultSpec, Scenario
from .sdc_faults import SdcFaultsMixin
from .training_kinds import TrainingKindsMixin

if TYPE_CHECKING:
    from .workload import JobRun

# How the drawn benign disturbances share out among their kinds.
BENIGN_SHARES = {"dataloader_hiccup": 0.5, "os_jitter": 0.3, "slow_rank_logging": 0.2}


def draw_benign(scenario: Scenario, first: int = 1) -> list[FaultSpec]:
    """Benign disturbances a healthy cluster has, drawn from the seed: data-loader hiccups of
    seconds, OS jitter of a minute or two, a rank that logs slowly for a few minutes."""
    rate = scenario.realism.benign_per_node_hour
    if rate <= 0:
        return []
    rng = np.random.default_rng([scenario.seed, 13])
    kinds = list(BENIGN_SHARES)
    events: list[FaultSpec] = []
    for node in scenario.node_names():
        count = rng.poisson(rate * scenario.duration / 3600.0)
        for onset in np.sort(rng.uniform(0.0, scenario.duration, count)):
            kind = str(rng.choice(kinds, p=list(BENIGN_SHARES.values())))
            if kind == "dataloader_hiccup":
                magnitude = round(float(rng.uniform(3.0, 20.0)), 1)
                duration = magnitude
            elif kind == "os_jitter":
                magnitude = round(float(rng.uniform(1.02, 1.08)), 3)
                duration = float(rng.uniform(30.0, 180.0))
            else:
                magnitude = round(float(rng.uniform(1.01, 1.04)), 3)
                duration = float(rng.uniform(120.0, 600.0))
            events.append(
                FaultSpec(
                    id="",
                    kind=kind,
                    target={"node": node},
                    onset=round(float(onset), 1),
                    duration=round(duration, 1),
                    magnitude=magnitude,
                )
            )
    events.sort(key=lambda e: (e.onset, e.target["node"]))
    return [replace(e, id=f"b{first + i:04d}") for i, e in enumerate(events)]


class FaultMixin(
    FaultTruthMixin,
    NodeFaultsMixin,
    LinkFaultsMixin,
    BlindSpotFaultsMixin,
    TrainingKindsMixin,
    PrecursorFaultsMixin,
    FabricGrayFaultsMixin,
    SdcFaultsMixin,
    PaceFaultsMixin,
):
    """The Simulation's fault handling (a mixin: the state lives on the Simulation): the events'
    lifecycle here, each kind's handlers and the truth in the mixins it is made of."""

    def _update_faults(self) -> None:
        """Start the events whose onset came, end those whose time is up; only active ones cost."""
        while self.next_fault < len(self.faults) and self.faults[self.next_fault].spec.onset <= self.t:
            fault = self.faults[self.next_fault]
            self.next_fault += 1
            fault.started = True
            idle = self._job_on(fault.node) is None
            if fault.spec.benign and fault.spec.kind not in TRAINING_KINDS and idle:
                fault.ended = True  # a disturbance of a job's data path: nothing to disturb
                continue
            self._start_fault(fault)
            self._record_truth(fault)
            self.active_faults.append(fault)
        still = []
        for fault in self.active_faults:
            if self.t >= fault.spec.onset + fault.spec.duration:
                fault.ended = True
                self._end_fault(fault)
            else:
                self._during_fault(fault)
                still.append(fault)
        self.active_faults = still

    def _effect(self, fault: ActiveFault, source: str, signature: str) -> None:
        fault.effects.append({"source": source, "signature": signature})

    def _job_on(self, node: int | None) -> JobRun | None:
        if node is None or self.node_job[node] < 0:
            return None
        return self.jobs[int(self.node_job[node])]

    def _start_fault(self, fault: ActiveFault) -> None:
        job = self._job_on(fault.node)  # before the handler: it may kill the job
        if job is not None and job.state == "RUNNING":
            fault.jobs.append(job.spec.id)
        handler = getattr(self, f"_start_{fault.spec.kind}")
        handler(fault, fault.spec, fault.node)
        for job_id in fault.jobs:
            fault.progress.setdefault(job_id, [0.0, 0.0])
        if job is not None and job.state != "RUNNING":
            fault.failed_jobs.append(job.spec.id)

    def _end_fault(self, fault: ActiveFault) -> None:
        handler = getattr(self, f"_end_{fault.spec.kind}", None)
        if handler is not None:
            handler(fault, fault.spec, fault.node)

    def _during_fault(self, fault: ActiveFault) -> None:
        if fault.spec.kind == "ib_link_flap":
            self._flap_tick(fault)
        elif fault.spec.kind == "leaf_flap":
            self._leaf_flap_tick(fault)
        elif fault.spec.kind == "xid_storm":
            self._storm_tick(fault)
        elif fault.spec.kind == "fabric_manager_down":
            self._fabric_manager_tick(fault)
        elif fault.spec.kind == "moe_imbalance":
            self._moe_tick(fault)
        elif fault.spec.kind == "pipeline_bubble":
            self._training_job(fault)  # the nodes it shapes, as the job (re)starts
        elif fault.spec.kind == "sdc_training":
            self._sdc_tick(fault)
        elif fault.spec.kind in PRECURSOR_KINDS:
            self._precursor_tick(fault)
        else:
            self._gray_during(fault)  # the fabric's gray kinds (twin/fabric_gray_faults.py)

    # The targets the kinds' handlers read, checked against the node's hardware.
    def _gpu_target(self, spec: FaultSpec) -> int:
        gpu = int(spec.target.get("gpu", 0))
        if not 0 <= gpu < G:
            raise ValueError(f"fault {spec.id}: gpu {gpu} out of range 0..{G - 1}")
        return gpu

    def _port_target(self, spec: FaultSpec) -> int:
        port = spec.target.get("port", "mlx5_0")
        index = int(str(port).removeprefix("mlx5_"))
        if not 0 <= index < P:
            raise ValueError(f"fault {spec.id}: port {port} out of range mlx5_0..mlx5_{P - 1}")
        return index

    # ----------------------------------------------------------------------------------- modifiers
    def _apply_modifiers(self) -> None:
        for name, value in NODE_MODIFIERS.items():
            getattr(self, name)[:] = value
        self.ost_slow[:] = 1.0
        self.loss_mult = {}
        for fault in self.active_faults:
            self._modify(fault, self)

    def _modify(self, fault: ActiveFault, m: Any) -> None:
        """One event's share of the per-tick modifiers, written into ``m`` (the Simulation itself,
        or a copy of its modifier arrays when the truth asks what the job would do without it)."""
        spec, node = fault.spec, fault.node
        if spec.kind == "psu_failure":
            cap = spec.magnitude
            m.cap_w[node] = cap
            m.brake[node] = True
            # Clocks fall with the cap: at ~150 W an H100 runs about a third as fast.
            m.clock_ratio[node] = min(1.0, (cap / 600.0) ** 0.8)
        elif spec.kind == "thermal_throttle":
            gpu = fault.state["gpu"]
            m.thermal[node, gpu] = True
            m.thermal_ratio[node, gpu] = spec.magnitude
            m.clock_ratio[node, gpu] = min(m.clock_ratio[node, gpu], spec.magnitude)
        elif spec.kind in ("gray_slow_node", "os_jitter", "slow_rank_logging"):
            m.node_slow[node] *= spec.magnitude
        elif spec.kind == "dataloader_hiccup":
            ticks = max(1, math.ceil(spec.duration / self.scenario.tick))
            m.node_stall[node] = max(m.node_stall[node], spec.magnitude / ticks)
        elif spec.kind == "ib_link_flap" and not self.ib_up[node, fault.state["port"]]:
            m.comm_slow[node] *= 2.5
        elif spec.kind == "ib_link_flap" and self.ib_width[node, fault.state["port"]] < 4:
            m.comm_slow[node] *= 1.6
        elif spec.kind == "leaf_flap" and fault.state["down"]:
            # The leaf's rail is gone for every host on it: as a flapping port does to one host.
            for i in sorted({i for i, _ in fault.state["down"]}):
                m.comm_slow[i] *= 2.5
        elif spec.kind == "lustre_ost_slow":
            m.ost_slow[fault.state["ost"]] = max(m.ost_slow[fault.state["ost"]], spec.magnitude)
        elif spec.kind in ("moe_imbalance", "pipeline_bubble"):
            self._shape_job(fault, m)
        elif spec.kind == "loss_spike" and fault.state.get("job"):
            m.loss_mult[fault.state["job"]] = spec.magnitude
        elif spec.kind in ("ib_lane_downshift", "ib_congestion"):
            self._gray_modify(fault, m)
        elif spec.kind in PACE_KINDS:
            self._pace_modify(fault, m)
