"""Faults and benign disturbances: what each does when it starts, while it lasts and when it ends
(log lines, dead GPUs, killed jobs, counter jumps), and the per-tick modifiers the physics reads
(power caps, clock ratios, slow nodes and links, slow OSTs, loss multipliers)."""

from __future__ import annotations

import datetime as dt
import functools
import math
import random
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np

from . import faults as fc
from . import hardware as hw
from .checks import BINARIES as TOOL_BINARIES
from .counters import FABRIC_NOT_STARTED, THROTTLE_HW_POWER_BRAKE, G, LogLine, P, stable_hash
from .scenario import NOT_HARDWARE_KINDS, FaultSpec, Scenario

if TYPE_CHECKING:
    from .workload import JobRun


@dataclass
class ActiveFault:
    spec: FaultSpec
    node: int | None
    state: dict[str, Any] = field(default_factory=dict)
    effects: list[dict[str, str]] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    started: bool = False
    ended: bool = False
    # Per job it touched: [steps the job would have made without it, steps it made] while it lasts.
    progress: dict[str, list[float]] = field(default_factory=dict)
    failed_jobs: list[str] = field(default_factory=list)
    truth: dict[str, Any] | None = None
    # Per job, the event's own part in the job's pace (truth "pacing", "masked", "fault_slowdown"):
    # [steps without any event, steps with this event alone] over the compute ticks it set the pace,
    # the sim-time spans [from, to] it set the pace / was masked by a slower node, and its state at
    # the job's last compute tick ("pacing", "masked" or "": no effect on its node).
    own: dict[str, list[float]] = field(default_factory=dict)
    pacing: dict[str, list[list[float]]] = field(default_factory=dict)
    masked: dict[str, list[list[float]]] = field(default_factory=dict)
    pace_state: dict[str, str] = field(default_factory=dict)


BENIGN_SHARES = {"dataloader_hiccup": 0.5, "os_jitter": 0.3, "slow_rank_logging": 0.2}
MAX_SLOWDOWN = 100.0  # reported when the job made (almost) no progress during the event
# The per-node modifiers the physics reads, and their values on a node without events.
NODE_MODIFIERS: dict[str, Any] = {
    "cap_w": hw.GPU_TDP_W,
    "clock_ratio": 1.0,
    "brake": False,
    "thermal": False,
    "node_slow": 1.0,
    "comm_slow": 1.0,
    "node_stall": 0.0,
    "thermal_ratio": 1.0,
}
# An event acts on its node when removing it makes the node's compute, communication or stall term
# longer by more than PACE_EPS. It sets the job's pace when that term is within PACE_TIE of the job's
# slowest node: healthy nodes' slowest GPUs differ by up to ~5 % (silicon, pipeline stage), so of two
# stragglers that close, fixing one alone leaves the job about as slow: both set the pace. Further
# behind, a slower node masks it (its peers and it wait for that one). Spans closer than PACE_GAP_S
# are written as one.
PACE_EPS = 1e-3
PACE_TIE = 0.05
PACE_GAP_S = 30.0
# An Xid storm's lines come within its first minute (or the whole fault, if shorter).
XID_STORM_SPAN_S = 60.0


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


class FaultMixin:
    """The Simulation's fault handling (a mixin: the state lives on the Simulation)."""

    def _update_faults(self) -> None:
        """Start the events whose onset came, end those whose time is up; only active ones cost."""
        while self.next_fault < len(self.faults) and self.faults[self.next_fault].spec.onset <= self.t:
            fault = self.faults[self.next_fault]
            self.next_fault += 1
            fault.started = True
            if fault.spec.benign and self._job_on(fault.node) is None:
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
        if spec.kind in NOT_HARDWARE_KINDS:  # a drain for it is a wrong drain (twin/truth.py)
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

    # Benign disturbances: the node's job is disturbed for a while, nothing breaks.
    def _start_dataloader_hiccup(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        self._effect(fault, "dcgm", f"the node's GPUs idle ~{spec.magnitude:g} s; its peers wait in NCCL")
        self._effect(fault, "job", "one step longer by the stall")

    def _start_os_jitter(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        self._effect(fault, "job", f"the node computes x{spec.magnitude:g} slower for a while (OS noise)")

    def _start_slow_rank_logging(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        job = self._job_on(node)
        position = int(np.nonzero(job.nodes == node)[0][0]) if job is not None else 0
        fault.state["rank"] = position * G
        self._effect(fault, "job", f"rank {position * G} logs slowly; its node x{spec.magnitude:g} slower")

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

    # PSU failure: the BMC's power brake caps every GPU (IBM Vela: ~400 W -> ~150 W, job ~3x slower).
    def _start_psu_failure(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        psu = int(spec.target.get("psu", 0)) % self.psu_ok.shape[1]
        self.psu_ok[node, psu] = False
        fault.state.update(psu=psu)
        self._effect(
            fault, "redfish", f"PowerSupplies/{psu} Status.Health=Critical, LineInputStatus=LossOfInput"
        )
        self._effect(
            fault,
            "dcgm",
            f"DCGM_FI_DEV_CLOCKS_EVENT_REASONS has bit {THROTTLE_HW_POWER_BRAKE} (HW Power Brake)",
        )
        self._effect(
            fault, "dcgm", f"DCGM_FI_DEV_POWER_USAGE <= {spec.magnitude:.0f} W on all GPUs of the node"
        )
        self._effect(
            fault, "job", "step time of the node's job rises about 3x; peers' tensor activity and power fall"
        )

    def _end_psu_failure(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        self.psu_ok[node, fault.state["psu"]] = True

    def _start_thermal_throttle(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        gpu = self._gpu_target(spec)
        fault.state.update(gpu=gpu)
        self._effect(
            fault,
            "dcgm",
            f"gpu {gpu}: DCGM_FI_DEV_GPU_TEMP ~ 90 C, throttle bits 0x20|0x40, SM clock x{spec.magnitude}",
        )
        self._effect(fault, "job", "the node becomes the job's straggler")

    def _start_pcie_downgrade(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        gpu = self._gpu_target(spec)
        index = self.gpu_pci_index(gpu)
        gen = int(spec.target.get("gen", spec.magnitude if spec.magnitude >= 1 else 1))
        width = int(spec.target.get("width", self.pci_max_width[node, index]))
        self.pci_gen[node, index] = max(1, min(gen, 5))
        self.pci_width[node, index] = width
        self._measure_h2d()
        fault.state.update(gpu=gpu, index=index)
        bdf = hw.GPU_BDFS[gpu]
        self._effect(
            fault,
            "sysfs",
            f"bus/pci/devices/{bdf}/current_link_speed={hw.PCIE_GEN_SPEED[int(self.pci_gen[node, index])]}, "
            f"current_link_width={width}",
        )
        self._effect(
            fault,
            "pcie_bandwidth",
            f"gpu {gpu} host_to_device ~{self.h2d_bandwidth[node, gpu] / 1e9:.1f} GB/s",
        )

    def _end_pcie_downgrade(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        index = fault.state["index"]
        self.pci_gen[node, index] = self.pci_max_gen[node, index]
        self.pci_width[node, index] = self.pci_max_width[node, index]
        self._measure_h2d()

    def _start_ib_link_flap(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        port = self._port_target(spec)
        flaps = max(1, int(spec.magnitude))
        rng = random.Random(stable_hash(self.scenario.seed, spec.id) & 0xFFFFFFFF)
        times = sorted(rng.uniform(0, spec.duration * 0.8) for _ in range(flaps))
        fault.state.update(port=port, flap_times=times, next=0, down_until=-1.0)
        self.ib_symbol_rate[node, port] = 40.0
        width = spec.target.get("width")
        if width:
            fault.state["width"] = int(width)
        device = hw.IB_DEVICES[port]
        self._effect(
            fault,
            "sysfs",
            f"class/infiniband/{device}/ports/1/counters/link_downed +{flaps}, symbol_error rising",
        )
        self._effect(fault, "sysfs", f"class/infiniband/{device}/ports/1/state 1: DOWN while flapping")
        self._effect(fault, "kern.log", f"mlx5_core {hw.HCA_BDFS[port]}: ... Link down")
        self._effect(fault, "ufm", "events 'Link went down' / 'Link went up' on the port")

    def _flap_tick(self, fault: ActiveFault) -> None:
        node, port, state = fault.node, fault.state["port"], fault.state
        elapsed = self.t - fault.spec.onset
        if state["down_until"] >= 0 and self.t >= state["down_until"]:
            self._ib_port_up(node, port, state.get("width", 4))
            state["down_until"] = -1.0
        times = state["flap_times"]
        if state["next"] < len(times) and elapsed >= times[state["next"]] and state["down_until"] < 0:
            state["next"] += 1
            self._ib_port_down(node, port)
            state["down_until"] = self.t + self.scenario.tick * (1 + self.prng.randrange(2))

    def _end_ib_link_flap(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        port = fault.state["port"]
        self.ib_symbol_rate[node, port] = 0.0
        if not self.ib_up[node, port]:
            self._ib_port_up(node, port, 4)
        self.ib_width[node, port] = 4

    def _start_leaf_flap(self, fault: ActiveFault, spec: FaultSpec, node: None) -> None:
        """Every port of one leaf switch goes down and up ``magnitude`` times (a switch that reboots
        or loses its ASIC): each host cabled to it sees its own HCA port flap on that leaf's rail."""
        leaf = str(spec.target["switch"])
        ports = [
            (i, p) for i in range(len(self.nodes)) for p in range(P) if self.topology.leaf(i, p)[0] == leaf
        ]
        flaps = max(1, int(spec.magnitude))
        rng = random.Random(stable_hash(self.scenario.seed, spec.id) & 0xFFFFFFFF)
        times = sorted(rng.uniform(0, spec.duration * 0.8) for _ in range(flaps))
        nodes = sorted({self.nodes[i] for i, _ in ports})
        fault.state.update(ports=ports, nodes=nodes, flap_times=times, next=0, down_until=-1.0, down=[])
        for i in sorted({i for i, _ in ports}):
            job = self._job_on(i)
            if job is not None and job.state == "RUNNING" and job.spec.id not in fault.jobs:
                fault.jobs.append(job.spec.id)
        rail = ports[0][1]  # validation named an existing leaf: it has ports, all on one rail
        device = hw.IB_DEVICES[rail]
        self._effect(
            fault, "sysfs", f"class/infiniband/{device}/ports/1/counters/link_downed +{flaps} on {nodes}"
        )
        self._effect(
            fault, "sysfs", f"class/infiniband/{device}/ports/1/state 1: DOWN while the leaf is down"
        )
        self._effect(fault, "kern.log", f"mlx5_core {hw.HCA_BDFS[rail]}: ... Link down / Link up")
        self._effect(
            fault, "ufm", f"every port of {leaf} Down while flapping; 'Link went down' / 'Link went up'"
        )

    def _leaf_flap_tick(self, fault: ActiveFault) -> None:
        state = fault.state
        if state["down_until"] >= 0 and self.t >= state["down_until"]:
            self._leaf_up(fault)
        times = state["flap_times"]
        if (
            state["next"] < len(times)
            and self.t - fault.spec.onset >= times[state["next"]]
            and not state["down"]
        ):
            state["next"] += 1
            # A dead host's port is already dark: the leaf cannot take it down again.
            state["down"] = [(i, p) for i, p in state["ports"] if self.alive[i] and self.ib_up[i, p]]
            for i, p in state["down"]:
                self._ib_port_down(i, p)
            state["down_until"] = self.t + self.scenario.tick * (1 + self.prng.randrange(2))

    def _leaf_up(self, fault: ActiveFault) -> None:
        """Bring back the ports this fault took down (only those: another fault may hold a port down)."""
        for i, p in fault.state["down"]:
            if self.alive[i]:
                self._ib_port_up(i, p, 4)
        fault.state.update(down=[], down_until=-1.0)

    def _end_leaf_flap(self, fault: ActiveFault, spec: FaultSpec, node: None) -> None:
        self._leaf_up(fault)

    def _ib_port_down(self, node: int, port: int) -> None:
        self.ib_up[node, port] = False
        self.ib_counters["link_downed"][node, port] += np.uint64(1)
        self.ib_counters["link_error_recovery"][node, port] += np.uint64(1)
        self.ib_counters["symbol_error"][node, port] += np.uint64(self.prng.randrange(5, 60))
        bdf = hw.HCA_BDFS[port]
        for line in fc.ib_link_lines(bdf, hw.netdev_name(bdf), hw.IB_DEVICES[port], up=False):
            self.klog(node, line)
        self._ufm_port_event(node, port, down=True)

    def _ib_port_up(self, node: int, port: int, width: int) -> None:
        self.ib_up[node, port] = True
        self.ib_width[node, port] = width
        bdf = hw.HCA_BDFS[port]
        for line in fc.ib_link_lines(bdf, hw.netdev_name(bdf), hw.IB_DEVICES[port], up=True):
            self.klog(node, line, 0.2)
        self._ufm_port_event(node, port, down=False)

    def _ufm_port_event(self, node: int, port: int, down: bool) -> None:
        guid = hw.hca_guid(self.scenario.seed, self.nodes[node], port)
        leaf, leaf_port = self.topology.leaf(node, port)
        self.ufm_events.append(
            {
                "id": len(self.ufm_events) + 1,
                "name": "Link went down" if down else "Link went up",
                "type": "Port",
                "event_type": "913" if down else "912",
                "severity": "Critical" if down else "Info",
                "timestamp": dt.datetime.fromtimestamp(self.unix(), dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[
                    :-3
                ],
                "counter": "N/A",
                "category": "Fabric Topology",
                "object_name": f"{guid}_1",
                "object_path": f"default / Computer: {self.nodes[node]} / computer IB Port: "
                "{self.nodes[node]} {hw.IB_DEVICES[port]}",
                "write_to_syslog": True,
                "description": (
                    f"Link {'went down' if down else 'went up'}: ({self.nodes[node]}:{hw.IB_DEVICES[port]}:1)"
                    f" - ({leaf}:{leaf_port})"
                ),
            }
        )

    def _start_ib_port_down(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        port = self._port_target(spec)
        fault.state.update(port=port)
        self._ib_port_down(node, port)
        self._effect(
            fault,
            "sysfs",
            f"class/infiniband/{hw.IB_DEVICES[port]}/ports/1/state 1: DOWN, phys_state 3: Disabled",
        )
        self._effect(fault, "ufm", "port logical_state Down; event 'Link went down'")
        if port < hw.COMPUTE_PORTS:
            job = self._job_on(node)
            if job is not None and job.state == "RUNNING":
                self._effect(
                    fault, "app_log", "NCCL WARN NET/IB ... transport retry counter exceeded; job fails"
                )
                self._kill_job(job, "nccl_ib", node, fault.spec.onset + 30.0)

    def _end_ib_port_down(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        if self.alive[node]:
            self._ib_port_up(node, fault.state["port"], 4)

    def _start_xid(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        gpu = self._gpu_target(spec)
        code = int(spec.target.get("code", spec.magnitude)) or fc.draw_xid(
            random.Random(stable_hash(self.scenario.seed, spec.id) & 0xFFFF)
        )
        fault.state.update(gpu=gpu, magnitude=float(code), code=code)
        self._emit_xid(fault, node, gpu, code)
        if code in fc.XID_ROW_REMAP:
            self.remap_pending[node, gpu] = 1
            self.remap_correctable[node, gpu] += 1 if code == 63 else 0
            self.remap_uncorrectable[node, gpu] += 0 if code == 63 else 1
            self._effect(fault, "dcgm", f"gpu {gpu}: DCGM_FI_DEV_ROW_REMAP_PENDING=1")
        if code == 64:
            self.remap_failed[node, gpu] = 1
            self._effect(fault, "dcgm", f"gpu {gpu}: DCGM_FI_DEV_ROW_REMAP_FAILURE=1")
        if code in (48, 95):
            self.ecc_dbe[node, gpu] += 1
        if code in fc.XID_NEEDS_RESET:
            fault.state["blocks_scheduling"] = True
        if code == 79:
            self.gpu_present[node, gpu] = False
            self._effect(fault, "dcgm", f"gpu {gpu}: its series disappear from /metrics")
            self._effect(fault, "sysfs", f"bus/pci/devices/{hw.GPU_BDFS[gpu]}/current_link_speed=Unknown")
        job = self._job_on(node)
        if code in fc.XID_KILLS_JOB and job is not None and job.state == "RUNNING":
            self._effect(fault, "app_log", "CUDA error in the rank on that GPU; job fails")
            self._kill_job(job, f"xid{code}", node, spec.onset + 2.0, gpu=gpu)

    def _emit_xid(self, fault: ActiveFault, node: int, gpu: int, code: int) -> None:
        rng = random.Random(stable_hash(self.scenario.seed, fault.spec.id, code) & 0xFFFFFFFF)
        job = self._job_on(node)
        pid = 10000 + rng.randrange(50000) if job is not None else 0
        process = "python3" if job is not None else "<unknown>"
        pid_text: Any = pid if job is not None else "'<unknown>'"
        newer = rng.random() < 0.8
        message = fc.xid_message(code, pid_text, process, rng, newer_driver=newer)
        bus = hw.xid_bus_id(hw.GPU_BDFS[gpu])
        self.klog(node, fc.xid_line(bus, code, message))
        if code == 79:
            self.klog(node, f"NVRM: GPU {hw.GPU_BDFS[gpu]}: GPU has fallen off the bus.", 0.001)
        self.xid_last[node, gpu] = code
        self._effect(fault, "kern.log", f"NVRM: Xid (PCI:{bus}): {code},")
        self._effect(fault, "dcgm", f"gpu {gpu}: DCGM_FI_DEV_XID_ERRORS={code}")

    def _end_xid(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        if fault.state.get("code") in fc.XID_NEEDS_RESET:
            self._reboot(node, "operator reset after Xid")
        elif fault.state.get("code") in fc.XID_ROW_REMAP:
            self._reset_gpu(node, fault.state["gpu"])

    def _start_hbm_row_remap(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        gpu = self._gpu_target(spec)
        fault.state.update(gpu=gpu)
        rows = max(1, int(spec.magnitude))
        self.ecc_sbe[node, gpu] += 3 * rows
        self.remap_correctable[node, gpu] += rows
        self.remap_pending[node, gpu] = 1
        self._emit_xid(fault, node, gpu, 63)
        self._effect(
            fault, "dcgm", f"gpu {gpu}: DCGM_FI_DEV_ROW_REMAP_PENDING=1, CORRECTABLE_REMAPPED_ROWS +{rows}"
        )

    def _start_hbm_silent_corruption(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        # No counter moves: only a memory test under load finds it (twin/checks.py, DCGM level 4 memtest).
        fault.state.update(gpu=self._gpu_target(spec))
        gpu = fault.state["gpu"]
        self._effect(fault, "checks", f"gpu {gpu}: fails DCGM level 3 memtest, nothing passive")

    def _end_hbm_row_remap(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        self._reset_gpu(node, fault.state["gpu"])

    def _reset_gpu(self, node: int, gpu: int) -> None:
        """An operator's GPU reset (between jobs): the remapped rows become active, pending clears."""
        self.remap_pending[node, gpu] = 0
        self.xid_last[node, gpu] = 0
        self.klog(
            node, f"NVRM: GPU at PCI:{hw.GPU_BDFS[gpu]}: GPU-{self.gpu_uuids[node][gpu][4:]}: GPU reset"
        )

    def _start_host_crash(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        self.alive[node] = False
        fault.state["blocks_scheduling"] = True
        self._effect(fault, "dcgm", "the node's /metrics stops answering (scrape fails)")
        self._effect(fault, "kern.log", "no lines during the outage, then a boot (uptime restarts at 0)")
        self._effect(fault, "sysfs", "IB counters reset to 0 after the reboot")
        job = self._job_on(node)
        if job is not None and job.state == "RUNNING":
            self._effect(fault, "app_log", "peers: NCCL watchdog timeout; job fails")
            self._kill_job(job, "host_crash", node, spec.onset + 60.0, silent_node=node)
        for port in range(P):
            self.ib_up[node, port] = False
            self._ufm_port_event(node, port, down=True)

    def _end_host_crash(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        self._reboot(node, "host crash")

    def _start_nvswitch_fatal(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        switch = int(spec.target.get("nvswitch", 0)) % len(hw.NVSWITCH_BDFS)
        rng = random.Random(stable_hash(self.scenario.seed, spec.id) & 0xFFFFFFFF)
        for line in fc.sxid_lines(switch, hw.NVSWITCH_BDFS[switch], rng):
            self.klog(node, line)
        fault.state.update(blocks_scheduling=True, switch=switch)
        self._effect(
            fault, "kern.log", f"nvidia-nvswitch{switch}: SXid (PCI:{hw.NVSWITCH_BDFS[switch]}): 24007, Fatal"
        )
        self._effect(fault, "dcgm", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL stops increasing on every GPU")
        job = self._job_on(node)
        if job is not None and job.state == "RUNNING":
            self._effect(fault, "app_log", "NCCL error on the node's ranks; job fails")
            self._kill_job(job, "nvswitch", node, spec.onset + 5.0)

    def _end_nvswitch_fatal(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        self._reboot(node, "NVSwitch fatal error")

    def _start_lustre_ost_slow(self, fault: ActiveFault, spec: FaultSpec, node: int | None) -> None:
        ost = int(spec.target["ost"]) % len(self.ost_slow)
        fault.state.update(ost=ost)
        self._effect(
            fault,
            "procfs",
            f"osc/{self.scenario.cluster.lustre_fsname}-OST{ost:04x}-osc-*/stats req_waittime rises "
            f"x{spec.magnitude:g}",
        )
        self._effect(
            fault, "kern.log", "ptlrpc_expire_one_request ... Request sent has timed out for slow reply"
        )
        self._effect(fault, "job", "checkpoints take longer; more data-loader stalls on every job")
        for job in self.jobs:
            if job.state == "RUNNING" and job.spec.id not in fault.jobs:
                fault.jobs.append(job.spec.id)

    def _end_lustre_ost_slow(self, fault: ActiveFault, spec: FaultSpec, node: int | None) -> None:
        ost = fault.state["ost"]
        fsname = self.scenario.cluster.lustre_fsname
        for n in fault.state.get("warned", []):
            self.klog(n, fc.lustre_recovered_line(fsname, ost, self.lustre_instance[n]))

    def _start_gray_slow_node(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        self._effect(
            fault, "job", f"the node computes x{spec.magnitude:g} slower with no hardware signal; peers wait"
        )

    def _start_loss_spike(self, fault: ActiveFault, spec: FaultSpec, node: int | None) -> None:
        job_id = str(spec.target.get("job")) if "job" in spec.target else None
        if job_id is None and node is not None and self._job_on(node) is not None:
            job_id = self._job_on(node).spec.id
        fault.state.update(job=job_id)
        if job_id is not None:
            fault.jobs.append(job_id)
        self._effect(fault, "app_log", f"lm loss x{spec.magnitude:g} and grad norm spike in rank logs")

    # ------------------------------------------------------------------ not the hardware (blind spots)
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
        return 2000 + node  # as the twin's other Fabric Manager lines (twin/writers.py)

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
        elif spec.kind == "loss_spike" and fault.state.get("job"):
            m.loss_mult[fault.state["job"]] = spec.magnitude


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
