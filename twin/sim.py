"""The cluster's physics, one tick at a time, vectorised over nodes and GPUs with numpy.

Per tick: faults start and end (their lasting effects: log lines, dead GPUs, killed jobs, counter
jumps), then every job advances (a synchronous data-parallel step lasts as long as its slowest node's
compute plus the collective, so the peers of a slow node wait), then GPU gauges, counters, IB and
Lustre statistics follow from what each GPU did. Nothing here knows about file or HTTP formats;
``writers`` and ``render`` turn this state into them.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from twin import faults as fc
from twin import hardware as hw
from twin.scenario import MODEL_PROFILES, FaultSpec, JobSpec, Scenario

G = len(hw.GPU_BDFS)
P = len(hw.IB_DEVICES)
STARTUP_S = 90.0
IB_COUNTERS = (
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
    "VL15_dropped",
)
IB_HW_COUNTERS = (
    "duplicate_request",
    "implied_nak_seq_err",
    "lifespan",
    "local_ack_timeout_err",
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "req_cqe_error",
    "req_cqe_flush_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "resp_cqe_error",
    "resp_cqe_flush_error",
    "resp_local_length_error",
    "resp_remote_access_errors",
    "rnr_nak_retry_err",
    "rx_atomic_requests",
    "rx_read_requests",
    "rx_write_requests",
)
LLITE_STATS = ("read_bytes", "write_bytes", "read", "write", "open", "close", "getattr", "statfs", "fsync")
LLITE_UNITS = ("bytes", "bytes", "usecs", "usecs", "usecs", "usecs", "usecs", "usecs", "usecs")
OSC_STATS = ("req_waittime", "req_active", "read_bytes", "write_bytes", "ost_read", "ost_write", "obd_ping")
OSC_UNITS = ("usecs", "reqs", "bytes", "bytes", "usecs", "usecs", "usecs")
MDC_STATS = ("req_waittime", "req_active", "mds_getattr", "mds_close", "ldlm_cancel", "obd_ping")
MDC_UNITS = ("usecs", "reqs", "usecs", "usecs", "usecs", "usecs")
RPC_PAGE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

THROTTLE_IDLE = 0x1
THROTTLE_SW_POWER = 0x4
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80


def stable_hash(*parts: object) -> int:
    """A per-fault random seed that, unlike hash(), does not change between processes."""
    return zlib.crc32(repr(parts).encode())


class Stats:
    """Lustre-style statistics: per line count, min, max, sum, sumsq, over a leading shape."""

    def __init__(self, shape: tuple[int, ...], lines: int) -> None:
        self.count = np.zeros((*shape, lines), dtype=np.int64)
        self.sum = np.zeros((*shape, lines), dtype=np.float64)
        self.sumsq = np.zeros((*shape, lines), dtype=np.float64)
        self.min = np.zeros((*shape, lines), dtype=np.float64)
        self.max = np.zeros((*shape, lines), dtype=np.float64)

    def add(self, line: int, count: np.ndarray, size: np.ndarray) -> None:
        """Record `count` samples of value `size` (arrays over the leading shape)."""
        count = np.rint(count).astype(np.int64)
        has = count > 0
        first = has & (self.count[..., line] == 0)
        size = np.broadcast_to(size, count.shape)
        self.count[..., line] += count
        self.sum[..., line] += count * np.rint(size)
        self.sumsq[..., line] += count * np.rint(size) ** 2
        self.min[..., line] = np.where(
            first, size, np.where(has, np.minimum(self.min[..., line], size), self.min[..., line])
        )
        self.max[..., line] = np.where(has, np.maximum(self.max[..., line], size), self.max[..., line])

    def reset(self, index: Any) -> None:
        for array in (self.count, self.sum, self.sumsq, self.min, self.max):
            array[index] = 0


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

    @property
    def profile(self) -> dict[str, float]:
        return MODEL_PROFILES[self.spec.profile]

    @property
    def ranks(self) -> int:
        return len(self.nodes) * G


@dataclass
class ActiveFault:
    spec: FaultSpec
    node: int | None
    state: dict[str, Any] = field(default_factory=dict)
    effects: list[dict[str, str]] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    started: bool = False
    ended: bool = False


@dataclass
class LogLine:
    t: float  # sim seconds
    node: int
    text: str


@dataclass
class AppLine:
    t: float
    node: int
    job: str
    rank: int
    text: str


class Simulation:
    """A whole cluster, advanced tick by tick."""

    def __init__(self, scenario: Scenario, start: dt.datetime) -> None:
        self.scenario = scenario
        self.start = start
        self.start_unix = start.timestamp()
        self.topology = hw.Topology.build(scenario.cluster, scenario.seed)
        self.nodes = list(self.topology.nodes)
        self.node_index = {name: i for i, name in enumerate(self.nodes)}
        self.rng = np.random.default_rng(scenario.seed)
        self.prng = random.Random(scenario.seed)
        self.pci = hw.pci_devices()
        self.gpu_uuids = [[hw.gpu_uuid(scenario.seed, n, g) for g in range(G)] for n in self.nodes]
        self.lustre_instance = [
            f"ffff{self.prng.randrange(16**4):04x}{self.prng.randrange(16**8):08x}" for _ in self.nodes
        ]
        self.t = 0.0
        self.tick_index = 0
        self.kernel_lines: list[LogLine] = []
        self.app_lines: list[AppLine] = []
        self.truth_lines: list[dict[str, Any]] = []
        self.ufm_events: list[dict[str, Any]] = []
        self._init_state()
        self.jobs = [JobRun(spec, i) for i, spec in enumerate(scenario.jobs)]
        self.faults = [ActiveFault(f, self.node_index.get(f.target.get("node"))) for f in scenario.faults]

    # ----------------------------------------------------------------------------------- state
    def _init_state(self) -> None:
        n = len(self.nodes)
        rng = self.rng
        self.gpu_eff = 1.0 + rng.normal(0.0, 0.012, (n, G))
        self.gpu_power_scale = 1.0 + rng.normal(0.0, 0.03, (n, G))
        self.gpu_temp_base = 29.0 + rng.normal(0.0, 1.5, (n, G))
        self.node_speed = 1.0 + np.abs(rng.normal(0.0, 0.006, n))
        self.boot_unix = self.start_unix - rng.uniform(2 * 3600, 40 * 86400, n)
        self.alive = np.ones(n, dtype=bool)
        self.gpu_present = np.ones((n, G), dtype=bool)
        self.node_job = np.full(n, -1, dtype=np.int64)
        # Counters (reset on reboot or GPU reset).
        self.energy_mj = np.zeros((n, G))
        self.nvlink_total = np.zeros((n, G))
        self.pcie_replay = np.zeros((n, G))
        self.xid_last = np.zeros((n, G), dtype=np.int64)
        self.remap_pending = np.zeros((n, G), dtype=np.int64)
        self.remap_failed = np.zeros((n, G), dtype=np.int64)
        self.remap_correctable = np.zeros((n, G), dtype=np.int64)
        self.remap_uncorrectable = np.zeros((n, G), dtype=np.int64)
        self.ecc_sbe = np.zeros((n, G))
        self.ecc_dbe = np.zeros((n, G))
        # Gauges of the last tick.
        zeros = np.zeros((n, G))
        self.power = zeros + hw.GPU_IDLE_W
        self.sm_clock = zeros + 345.0
        self.gpu_temp = self.gpu_temp_base.copy()
        self.mem_temp = self.gpu_temp_base + 6.0
        self.tensor = zeros.copy()
        self.gr_active = zeros.copy()
        self.sm_active = zeros.copy()
        self.sm_occupancy = zeros.copy()
        self.dram_active = zeros.copy()
        self.gpu_util = zeros.copy()
        self.mem_copy_util = zeros.copy()
        self.fb_used = zeros + 512.0
        self.pcie_tx = zeros.copy()
        self.pcie_rx = zeros.copy()
        self.throttle = np.full((n, G), THROTTLE_IDLE, dtype=np.int64)
        self.power_limit = zeros + hw.GPU_TDP_W
        # PCIe links of every device of every node.
        self.pci_gen = np.array([[d.gen for d in self.pci]] * n, dtype=np.int64)
        self.pci_width = np.array([[d.width for d in self.pci]] * n, dtype=np.int64)
        self.pci_max_gen = self.pci_gen.copy()
        self.pci_max_width = self.pci_width.copy()
        self.h2d_bandwidth = zeros.copy()
        self._measure_h2d()
        # InfiniBand ports.
        self.ib_up = np.ones((n, P), dtype=bool)
        self.ib_width = np.full((n, P), 4, dtype=np.int64)
        self.ib_counters = {name: np.zeros((n, P), dtype=np.uint64) for name in IB_COUNTERS}
        self.ib_hw_counters = {name: np.zeros((n, P), dtype=np.uint64) for name in IB_HW_COUNTERS}
        self.ib_symbol_rate = np.zeros((n, P))
        # PSUs and the node's power.
        self.psu_ok = np.ones((n, self.scenario.cluster.psus_per_node), dtype=bool)
        self.node_input_w = np.zeros(n)
        # Lustre client.
        osts = self.scenario.cluster.lustre_osts
        self.llite = Stats((n,), len(LLITE_STATS))
        self.osc = Stats((n, osts), len(OSC_STATS))
        self.mdc = Stats((n,), len(MDC_STATS))
        self.osc_rpcs = np.zeros((n, osts, 2, len(RPC_PAGE_BUCKETS)), dtype=np.int64)
        self.lustre_stats_start = np.full(n, self.start_unix)
        self.ost_slow = np.ones(osts)
        # Per-tick modifiers that active faults set.
        self.cap_w = zeros + hw.GPU_TDP_W
        self.clock_ratio = zeros + 1.0
        self.brake = np.zeros((n, G), dtype=bool)
        self.thermal = np.zeros((n, G), dtype=bool)
        self.node_slow = np.ones(n)
        self.comm_slow = np.ones(n)
        self.loss_mult: dict[str, float] = {}

    # ----------------------------------------------------------------------------------- helpers
    def unix(self, t: float | None = None) -> float:
        return self.start_unix + (self.t if t is None else t)

    def iso(self, t: float | None = None) -> str:
        return dt.datetime.fromtimestamp(self.unix(t), dt.UTC).isoformat().replace("+00:00", "Z")

    def uptime(self, node: int, t: float | None = None) -> float:
        return self.unix(t) - self.boot_unix[node]

    def klog(self, node: int, text: str, offset: float = 0.0) -> None:
        self.kernel_lines.append(LogLine(self.t + offset, node, text))

    def _measure_h2d(self) -> None:
        """What a host-to-device copy benchmark would measure per GPU (bytes/s), with jitter."""
        gen = self.pci_gen[:, :G]
        width = self.pci_width[:, :G]
        per_lane = np.vectorize(hw.PCIE_GEN_LANE_BYTES.get)(gen)
        jitter = 1.0 + self.rng.normal(0.0, 0.01, gen.shape)
        self.h2d_bandwidth = np.where(width > 0, per_lane * width * jitter, 0.0)

    def gpu_pci_index(self, gpu: int) -> int:
        return gpu

    def hca_pci_index(self, port: int) -> int:
        return G + port

    def healthy(self, node: int) -> bool:
        busy_faults = [
            f
            for f in self.faults
            if f.node == node and f.started and not f.ended and f.state.get("blocks_scheduling")
        ]
        return bool(self.alive[node] and self.gpu_present[node].all() and not busy_faults)

    # ----------------------------------------------------------------------------------- tick
    def advance(self) -> None:
        """Move the cluster forward by one tick."""
        tick = self.scenario.tick
        self.t = self.tick_index * tick
        self._update_faults()
        self._apply_modifiers()
        self._update_jobs()
        activity = self._gpu_activity()
        self._update_gpus(activity, tick)
        self._update_ib(tick)
        self._update_lustre(tick)
        self._update_power()
        self.tick_index += 1

    # ----------------------------------------------------------------------------------- faults
    def _update_faults(self) -> None:
        for fault in self.faults:
            spec = fault.spec
            if not fault.started and spec.onset <= self.t:
                fault.started = True
                self._start_fault(fault)
                self._record_truth(fault)
            if fault.started and not fault.ended and self.t >= spec.onset + spec.duration:
                fault.ended = True
                self._end_fault(fault)
            if fault.started and not fault.ended:
                self._during_fault(fault)

    def _record_truth(self, fault: ActiveFault) -> None:
        spec = fault.spec
        self.truth_lines.append(
            {
                "id": spec.id,
                "kind": spec.kind,
                "target": spec.target,
                "onset": self.iso(spec.onset),
                "end": self.iso(spec.onset + spec.duration),
                "onset_unix": round(self.unix(spec.onset), 3),
                "end_unix": round(self.unix(spec.onset + spec.duration), 3),
                "magnitude": fault.state.get("magnitude", spec.magnitude),
                "jobs": fault.jobs,
                "effects": fault.effects,
            }
        )

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

    def _end_fault(self, fault: ActiveFault) -> None:
        handler = getattr(self, f"_end_{fault.spec.kind}", None)
        if handler is not None:
            handler(fault, fault.spec, fault.node)

    def _during_fault(self, fault: ActiveFault) -> None:
        if fault.spec.kind == "ib_link_flap":
            self._flap_tick(fault)

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
            f"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS has bit {THROTTLE_HW_POWER_BRAKE} (HW Power Brake)",
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
            self._effect(fault, "dcgm", f"gpu {gpu}: DCGM_FI_DEV_ROW_REMAP_FAILED=1")
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

    # ----------------------------------------------------------------------------------- modifiers
    def _apply_modifiers(self) -> None:
        self.cap_w[:] = hw.GPU_TDP_W
        self.clock_ratio[:] = 1.0
        self.brake[:] = False
        self.thermal[:] = False
        self.node_slow[:] = 1.0
        self.comm_slow[:] = 1.0
        self.ost_slow[:] = 1.0
        self.loss_mult = {}
        for fault in self.faults:
            if not fault.started or fault.ended:
                continue
            spec, node = fault.spec, fault.node
            if spec.kind == "psu_failure":
                cap = spec.magnitude
                self.cap_w[node] = cap
                self.brake[node] = True
                # Clocks fall with the cap: at ~150 W an H100 runs about a third as fast.
                self.clock_ratio[node] = min(1.0, (cap / 600.0) ** 0.8)
            elif spec.kind == "thermal_throttle":
                gpu = fault.state["gpu"]
                self.thermal[node, gpu] = True
                self.clock_ratio[node, gpu] = min(self.clock_ratio[node, gpu], spec.magnitude)
            elif spec.kind == "gray_slow_node":
                self.node_slow[node] *= spec.magnitude
            elif spec.kind == "ib_link_flap" and not self.ib_up[node, fault.state["port"]]:
                self.comm_slow[node] *= 2.5
            elif spec.kind == "ib_link_flap" and self.ib_width[node, fault.state["port"]] < 4:
                self.comm_slow[node] *= 1.6
            elif spec.kind == "lustre_ost_slow":
                self.ost_slow[fault.state["ost"]] = max(self.ost_slow[fault.state["ost"]], spec.magnitude)
            elif spec.kind == "loss_spike" and fault.state.get("job"):
                self.loss_mult[fault.state["job"]] = spec.magnitude

    # ----------------------------------------------------------------------------------- jobs
    def _update_jobs(self) -> None:
        for job in self.jobs:
            if job.state == "PENDING" and self._may_start(job):
                self._try_start(job)
            if job.state == "RUNNING":
                if self.t >= job.spec.end:
                    self._finish(job, "COMPLETED", "end of allocation")
                else:
                    self._step_job(job)

    def _may_start(self, job: JobRun) -> bool:
        if self.t < job.spec.start or self.t >= job.spec.end:
            return False
        return job.restart_at is None or self.t >= job.restart_at

    def _try_start(self, job: JobRun) -> None:
        wanted = job.spec.nodes
        count = wanted if isinstance(wanted, int) else len(wanted)
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
        job.phase = "startup"
        self.node_job[job.nodes] = job.index
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

    def _node_factor(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per GPU compute-time multipliers of these nodes, and per node the slowest GPU's."""
        per_gpu = (
            self.node_slow[nodes, None]
            * self.node_speed[nodes, None]
            / (self.clock_ratio[nodes] * self.gpu_eff[nodes])
        )
        h2d_ratio = self.h2d_bandwidth[nodes] / (hw.PCIE_GEN_LANE_BYTES[5] * 16)
        per_gpu = per_gpu * (1.0 + 0.25 * np.clip(1.0 - h2d_ratio, 0.0, 1.0))
        return per_gpu, per_gpu.max(axis=1)

    def _step_job(self, job: JobRun) -> None:
        job.phase = self._phase(job)
        profile = job.profile
        if job.phase != "compute":
            job.step_time = job.step_time or profile["step_time"]
            return
        _, per_node = self._node_factor(job.nodes)
        share = profile["compute_share"]
        jitter = 1.0 + abs(self.rng.normal(0.0, 0.01))
        job.step_time = (
            profile["step_time"]
            * (share * per_node.max() + (1 - share) * self.comm_slow[job.nodes].max())
            * jitter
        )
        steps_before = int(job.step)
        job.step += self.scenario.tick / job.step_time
        if int(job.step) >= job.next_log_step:
            self._log_progress(job)
            interval = max(1, round(30.0 / job.step_time))
            job.next_log_step = (int(job.step) // interval + 1) * interval
        del steps_before

    # ----------------------------------------------------------------------------------- app logs
    def _loss(self, job: JobRun) -> float:
        step = max(job.step, 1.0)
        base = 1.9 + (job.profile["loss0"] - 1.9) * step**-0.35
        return base * (1 + self.rng.normal(0.0, 0.01)) * self.loss_mult.get(job.spec.id, 1.0)

    def _log_progress(self, job: JobRun) -> None:
        loss = self._loss(job)
        spike = self.loss_mult.get(job.spec.id, 1.0)
        grad_norm = 0.8 * (1 + self.rng.normal(0.0, 0.05)) * (spike**2 if spike > 1 else 1.0)
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

    # ----------------------------------------------------------------------------------- GPUs
    def _gpu_activity(self) -> np.ndarray:
        """Share of each tick each GPU spends computing (0..1), and job bookkeeping per GPU."""
        n = len(self.nodes)
        activity = np.zeros((n, G))
        self._phase_of_node = np.full(n, "idle", dtype=object)
        self._tensor_ratio = np.zeros(n)
        self._fb_target = np.full(n, 512.0)
        for job in self.jobs:
            if job.state != "RUNNING":
                continue
            nodes = job.nodes
            self._phase_of_node[nodes] = job.phase
            self._tensor_ratio[nodes] = job.profile["tensor"]
            self._fb_target[nodes] = job.profile["fb_used_gib"] * 1024
            if job.phase == "compute":
                per_gpu, _ = self._node_factor(nodes)
                share = job.profile["compute_share"]
                activity[nodes] = np.clip(
                    job.profile["step_time"] * share * per_gpu / job.step_time, 0.0, 1.0
                )
            elif job.phase == "startup":
                activity[nodes] = 0.04
            else:
                activity[nodes] = 0.03
        noise = self.rng.normal(0.0, 0.015, (n, G))
        return np.clip(activity * (1.0 + noise), 0.0, 1.0)

    def _update_gpus(self, activity: np.ndarray, tick: float) -> None:
        n = len(self.nodes)
        running = np.array([p not in ("idle",) for p in self._phase_of_node])
        computing = np.array([p == "compute" for p in self._phase_of_node])
        busy_w = 640.0 * self.gpu_power_scale
        power = hw.GPU_IDLE_W + (busy_w - hw.GPU_IDLE_W) * activity**0.9
        power += np.where(running[:, None], 35.0, 0.0)  # memory and NCCL spin while waiting
        power += self.rng.normal(0.0, 4.0, (n, G))
        power = np.minimum(power, self.cap_w - np.abs(self.rng.normal(0.0, 2.0, (n, G))))
        self.power = np.where(self.gpu_present, np.maximum(power, 55.0), 0.0)
        self.power_limit = self.cap_w.copy()
        self.sm_clock = np.where(running[:, None], hw.GPU_MAX_SM_CLOCK * self.clock_ratio, 345.0)
        self.sm_clock = np.round(self.sm_clock / 15.0) * 15.0
        hot = np.where(self.thermal, 58.0, 0.0)
        target_temp = self.gpu_temp_base + 0.062 * self.power + hot
        self.gpu_temp = self.gpu_temp + (target_temp - self.gpu_temp) * min(1.0, tick / 30.0)
        self.mem_temp = self.gpu_temp + 7.0 + self.rng.normal(0.0, 0.5, (n, G))
        spin = np.where(computing[:, None], 1.0 - activity, 0.0)
        tensor_ratio = self._tensor_ratio[:, None]
        self.tensor = np.clip(activity * tensor_ratio * (1 + self.rng.normal(0.0, 0.03, (n, G))), 0, 1)
        self.gr_active = np.clip(activity * 0.97 + spin * 0.55, 0, 1)
        self.sm_active = np.clip(activity * 0.9 + spin * 0.25, 0, 1)
        self.sm_occupancy = self.sm_active * 0.38
        self.dram_active = np.clip(activity * 0.36 + spin * 0.02, 0, 1)
        self.gpu_util = np.round(np.clip(self.gr_active * 100 + np.where(running[:, None], 3.0, 0.0), 0, 100))
        self.mem_copy_util = np.round(self.dram_active * 100)
        self.fb_used = np.round(self._fb_target[:, None] + self.rng.normal(0.0, 20.0, (n, G)).clip(0))
        link_bw = self.h2d_bandwidth
        phase_io = np.array([{"checkpoint": 0.4, "startup": 0.3}.get(p, 0.0) for p in self._phase_of_node])
        self.pcie_rx = np.minimum(link_bw * (0.02 * activity + 0.1 * phase_io[:, None] * 0.5), link_bw)
        self.pcie_tx = np.minimum(link_bw * (0.015 * activity + phase_io[:, None]), link_bw)
        throttle = np.where(running[:, None], 0, THROTTLE_IDLE)
        throttle = throttle | np.where(self.brake, THROTTLE_HW_POWER_BRAKE | THROTTLE_SW_POWER, 0)
        throttle = throttle | np.where(self.thermal, THROTTLE_SW_THERMAL | THROTTLE_HW_THERMAL, 0)
        self.throttle = throttle.astype(np.int64)
        self.energy_mj += self.power * tick * 1000.0
        nvlink_ok = np.ones(n, dtype=bool)
        for fault in self.faults:
            if fault.spec.kind == "nvswitch_fatal" and fault.started and not fault.ended:
                nvlink_ok[fault.node] = False
        self.nvlink_total += np.where(nvlink_ok[:, None], activity * 2.0e8 * tick, 0.0)
        self.pcie_replay += (self.pci_gen[:, :G] < self.pci_max_gen[:, :G]) * self.rng.poisson(0.4, (n, G))
        dead = ~self.alive
        for array in (self.power, self.tensor, self.gr_active, self.sm_active, self.gpu_util):
            array[dead] = 0.0

    # ----------------------------------------------------------------------------------- IB
    def _update_ib(self, tick: float) -> None:
        n = len(self.nodes)
        rates = np.zeros((n, P))
        for job in self.jobs:
            if job.state != "RUNNING":
                continue
            if job.phase == "compute":
                # Gradient all-reduce: ~2x the model's gradient bytes per step, spread over 8 rails.
                per_step = {"llm-8b": 32e9, "llm-20b": 80e9, "llm-70b": 280e9, "vision": 0.2e9}[
                    job.spec.profile
                ] / 8
                rates[job.nodes, : hw.COMPUTE_PORTS] = per_step / max(job.step_time, 1e-3)
            elif job.phase == "stall":
                rates[job.nodes, : hw.COMPUTE_PORTS] = 2e6
        lustre_rate = self._lustre_rates()
        rates[:, hw.COMPUTE_PORTS :] = (lustre_rate[0] + lustre_rate[1])[:, None] / 2.0
        rates += 900.0  # subnet management and IPoIB chatter
        rates *= 1.0 + self.rng.normal(0.0, 0.02, (n, P))
        rates = np.where(self.ib_up & self.alive[:, None], np.clip(rates, 0, 48e9 * self.ib_width / 4), 0.0)
        bytes_ = rates * tick
        words = np.rint(bytes_ / 4.0).astype(np.uint64)
        packets = np.rint(bytes_ / 4096.0 + (bytes_ > 0) * 3).astype(np.uint64)
        counters = self.ib_counters
        for prefix in ("xmit", "rcv"):
            counters[f"port_{prefix}_data"] += words
            counters[f"port_{prefix}_packets"] += packets
            counters[f"unicast_{prefix}_packets"] += packets
        waiting = np.zeros((n, P))
        waiting[:, : hw.COMPUTE_PORTS] = (self.comm_slow[:, None] > 1.0) * 5e6
        counters["port_xmit_wait"] += np.rint(waiting + rates * 1e-5).astype(np.uint64)
        symbols = self.rng.poisson(self.ib_symbol_rate * tick / 5.0).astype(np.uint64)
        counters["symbol_error"] += symbols
        counters["port_rcv_errors"] += (symbols // np.uint64(4)).astype(np.uint64)
        self.ib_hw_counters["rx_write_requests"] += packets // np.uint64(8)
        self.ib_hw_counters["rx_read_requests"] += packets // np.uint64(64)
        self.ib_hw_counters["out_of_sequence"] += symbols

    # ----------------------------------------------------------------------------------- Lustre
    def _lustre_rates(self) -> tuple[np.ndarray, np.ndarray]:
        """Per node (read, write) bytes/s for this tick's phases (Eos: init read, ~3 MB/s of small
        reads while computing, checkpoint writes of ~6 GB/s per client)."""
        n = len(self.nodes)
        read = np.zeros(n)
        write = np.zeros(n)
        for i, phase in enumerate(self._phase_of_node):
            if phase == "startup":
                read[i] = 2.2e9
            elif phase in ("compute", "stall"):
                read[i] = 3.0e6
            elif phase == "checkpoint":
                write[i] = 6.0e9 / max(1.0, float(np.max(self.ost_slow)) * 0.2 + 0.8)
        return read * self.alive, write * self.alive

    def _update_lustre(self, tick: float) -> None:
        read, write = self._lustre_rates()
        small = np.array([p in ("compute", "stall") for p in self._phase_of_node])
        read_size = np.where(small, 4096.0, 1048576.0)
        read_count = read * tick / read_size
        write_count = write * tick / 4194304.0
        self.llite.add(0, read_count, read_size)
        self.llite.add(1, write_count, np.full_like(write_count, 4194304.0))
        self.llite.add(2, read_count, np.where(small, 35.0, 420.0))
        self.llite.add(3, write_count, np.full_like(write_count, 2400.0))
        active = self.alive & (self.node_job >= 0)
        self.llite.add(6, active * tick * 2.0, np.full(len(self.nodes), 11.0))
        self.llite.add(7, self.alive * 1.0, np.full(len(self.nodes), 95.0))
        osts = len(self.ost_slow)
        # Striped over every OST: each gets an equal share of the RPCs. A small (4 KiB) read is one
        # RPC of one page; a streaming read is one 1 MiB RPC of 256 pages.
        per_ost_read = read_count[:, None] / osts * np.ones(osts)
        per_ost_write = write_count[:, None] / osts * np.ones(osts)
        jitter = 1 + np.abs(self.rng.normal(0, 0.1, (len(self.nodes), osts)))
        latency = 900.0 * self.ost_slow[None, :] * jitter
        rpcs = per_ost_read + per_ost_write
        self.osc.add(0, rpcs, latency)
        self.osc.add(1, rpcs, np.full_like(rpcs, 2.0))
        self.osc.add(2, per_ost_read, np.broadcast_to(read_size[:, None], rpcs.shape))
        self.osc.add(3, per_ost_write, np.full_like(rpcs, 4194304.0))
        self.osc.add(4, per_ost_read, latency * 1.1)
        self.osc.add(5, per_ost_write, latency * 3.0)
        self.osc.add(6, np.broadcast_to((self.alive * tick / 25.0)[:, None], rpcs.shape), latency * 0.2)
        self.osc_rpcs[small, :, 0, 0] += np.rint(per_ost_read[small]).astype(np.int64)
        self.osc_rpcs[~small, :, 0, 8] += np.rint(per_ost_read[~small]).astype(np.int64)
        self.osc_rpcs[:, :, 1, 10] += np.rint(per_ost_write).astype(np.int64)
        self.mdc.add(0, active * tick * 2.0, np.full(len(self.nodes), 180.0))
        self.mdc.add(2, active * tick * 2.0, np.full(len(self.nodes), 160.0))
        self._warn_slow_osts()

    def _warn_slow_osts(self) -> None:
        fsname = self.scenario.cluster.lustre_fsname
        for fault in self.faults:
            if fault.spec.kind != "lustre_ost_slow" or not fault.started or fault.ended:
                continue
            if fault.state.get("warned"):
                continue
            ost = fault.state["ost"]
            affected = [int(i) for i in np.nonzero(self.alive & (self.node_job >= 0))[0]]
            fault.state["warned"] = affected
            rng = random.Random(stable_hash(self.scenario.seed, fault.spec.id) & 0xFFFFFFFF)
            for node in affected:
                for line in fc.lustre_slow_lines(
                    fsname, ost, self.lustre_instance[node], int(self.unix()), rng
                ):
                    self.klog(node, line, 0.5)

    # ----------------------------------------------------------------------------------- power
    def _update_power(self) -> None:
        gpu_w = self.power.sum(axis=1)
        self.node_input_w = np.where(self.alive, (gpu_w + 1900.0) / 0.94, 40.0)

    # ----------------------------------------------------------------------------------- reboot
    def _reboot(self, node: int, reason: str) -> None:
        """The node comes back: uptime restarts, counters reset, GPUs and links restored."""
        job = self._job_on(node)
        if job is not None and job.state == "RUNNING":
            self._kill_job(job, "node_reboot", node, self.t + 1.0, silent_node=node)
        self.alive[node] = True
        self.boot_unix[node] = self.unix() - 1.0
        self.gpu_present[node] = True
        for array in (self.energy_mj, self.nvlink_total, self.pcie_replay, self.ecc_sbe, self.ecc_dbe):
            array[node] = 0
        self.xid_last[node] = 0
        self.remap_pending[node] = 0
        self.remap_failed[node] = 0
        for counters in (self.ib_counters, self.ib_hw_counters):
            for array in counters.values():
                array[node] = 0
        self.ib_up[node] = True
        self.ib_width[node] = 4
        self.pci_gen[node] = self.pci_max_gen[node]
        self.pci_width[node] = self.pci_max_width[node]
        self._measure_h2d()
        self.llite.reset(node)
        self.osc.reset(node)
        self.mdc.reset(node)
        self.osc_rpcs[node] = 0
        self.lustre_stats_start[node] = self.unix()
        for offset, line in enumerate(fc.BOOT_LINES):
            self.kernel_lines.append(LogLine(self.t + 1.0 + offset * 0.5, node, line))
        for port in range(P):
            self._ufm_port_event(node, port, down=False)
        del reason

    # ----------------------------------------------------------------------------------- views
    def slurm_state(self, job: JobRun) -> str:
        return job.state

    def gpu_job(self, node: int) -> str | None:
        job = self._job_on(node)
        return job.spec.id if job is not None and job.state == "RUNNING" else None


def hostlist(names: list[str]) -> str:
    """Slurm's compressed host list: n[0001-0004,0007]."""
    if not names:
        return ""
    numbers = sorted(int(n[1:]) for n in names)
    ranges: list[str] = []
    first = prev = numbers[0]
    for value in [*numbers[1:], None]:
        if value is not None and value == prev + 1:
            prev = value
            continue
        ranges.append(f"{first:04d}" if first == prev else f"{first:04d}-{prev:04d}")
        if value is not None:
            first = prev = value
    return f"n[{','.join(ranges)}]" if len(numbers) > 1 else f"n{numbers[0]:04d}"


def ceil_ticks(seconds: float, tick: float) -> int:
    return math.ceil(seconds / tick)
