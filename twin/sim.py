"""The cluster's state and its tick loop, vectorised over nodes and GPUs with numpy.

Per tick: faults and benign disturbances start and end (``injection``: log lines, dead GPUs, killed
jobs, counter jumps, and the modifiers they put on power caps, clocks and speeds), every job advances
(``workload``: a step lasts as long as its slowest GPU's compute plus the exposed communication, so
the peers of a slow node wait; what each GPU did in its sampled window), then GPU gauges and counters
(``gpu``), IB and Lustre statistics and input power (``fabric``) follow. Nothing here knows about file
or HTTP formats; ``writers`` and ``render`` turn this state into them.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from typing import Any

__all__ = [
    "IB_COUNTERS",
    "IB_HW_COUNTERS",
    "LLITE_STATS",
    "LLITE_UNITS",
    "MDC_STATS",
    "MDC_UNITS",
    "OSC_STATS",
    "OSC_UNITS",
    "RPC_PAGE_BUCKETS",
    "G",
    "P",
    "Simulation",
    "Stats",
    "hostlist",
]

import numpy as np

from . import faults as fc
from . import hardware as hw
from .counters import (  # re-exported: the writers and renderers read them from here
    FABRIC_NOT_STARTED,
    FABRIC_SUCCESS,
    IB_COUNTERS,
    IB_HW_COUNTERS,
    LLITE_STATS,
    LLITE_UNITS,
    MDC_STATS,
    MDC_UNITS,
    OSC_STATS,
    OSC_UNITS,
    RPC_PAGE_BUCKETS,
    THROTTLE_IDLE,
    AppLine,
    G,
    LogLine,
    P,
    Stats,
)
from .fabric import FabricMixin
from .fault_kinds import TELEMETRY_SOURCES
from .fault_state import ActiveFault
from .gpu import GpuMixin
from .injection import FaultMixin, draw_benign
from .scenario_model import Scenario
from .workload import JobRun, WorkloadMixin


class Simulation(FaultMixin, WorkloadMixin, GpuMixin, FabricMixin):
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
        events = sorted([*scenario.faults, *draw_benign(scenario)], key=lambda f: f.onset)
        self.faults = [ActiveFault(f, self.node_index.get(f.target.get("node"))) for f in events]
        self.next_fault = 0  # faults[:next_fault] have started
        self.active_faults: list[ActiveFault] = []
        self._fault_with_truth: list[ActiveFault] = []

    # ----------------------------------------------------------------------------------- state
    def _init_state(self) -> None:
        n = len(self.nodes)
        rng = self.rng
        silicon = self.scenario.realism.silicon
        self.node_speed = 1.0 + np.abs(rng.normal(0.0, 0.006, n)) * silicon
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
        # NVLink error counters, all links of the GPU together (twin/precursor_faults.py).
        self.nvlink_crc_flit = np.zeros((n, G))
        self.nvlink_crc_data = np.zeros((n, G))
        self.nvlink_replay = np.zeros((n, G))
        self.nvlink_recovery = np.zeros((n, G))
        # Gauges of the last tick.
        zeros = np.zeros((n, G))
        self.power = zeros + hw.GPU_IDLE_W
        self.sm_clock = zeros + 345.0
        self._init_gpu_physics()
        self.mem_temp = self.gpu_temp + 6.0
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
        self.ib_speed = np.full((n, P), 100, dtype=np.int64)  # Gb/s per lane: NDR 100, HDR 50
        self.ib_counters = {name: np.zeros((n, P), dtype=np.uint64) for name in IB_COUNTERS}
        self.ib_hw_counters = {name: np.zeros((n, P), dtype=np.uint64) for name in IB_HW_COUNTERS}
        self.ib_symbol_rate = np.zeros((n, P))
        # Healthy links see a symbol error now and then (BER ~1e-15 after FEC), some more than most.
        background = self.scenario.realism.background_errors
        self.ib_background_rate = np.exp(rng.normal(np.log(3e-6), 1.5, (n, P))) * background
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
        self.node_stall = np.zeros(n)  # seconds a node's data loader stalls this tick
        self.thermal_ratio = zeros + 1.0
        self.comm_slow = np.ones(n)
        self.node_work = np.ones(n)  # training's own load per node (expert routing, pipeline stages)
        self.expert_work = np.ones(n)  # the routing's part of it alone (tokens received: twin/fabric.py)
        self.bubble = np.zeros(n)  # share of a node's compute its pipeline's bubble turns into waiting
        self.loss_mult: dict[str, float] = {}
        # FleetSight's blind spots (the not-hardware kinds): per source, how many dropouts keep it silent
        # on each node; per GPU, how many keep DCGM's profiling fields at 0; per node, how many keep
        # Fabric Manager down, and each GPU's fabric state as DCGM reports it.
        self.silenced = {source: np.zeros(n, dtype=np.int64) for source in TELEMETRY_SOURCES}
        self.profiling_blind = np.zeros((n, G), dtype=np.int64)
        self.fabric_manager_down = np.zeros(n, dtype=np.int64)
        self.fabric_status = np.full((n, G), FABRIC_SUCCESS, dtype=np.int64)

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

    def answers(self, node: int, source: str) -> bool:
        """Whether a node's source answers now: dcgm-exporter and the node agent run on the host (down
        with it), the BMC has its own power and network; a telemetry_dropout silences any of them."""
        if source not in self.silenced:
            raise KeyError(f"unknown source {source!r}: one of {', '.join(self.silenced)}")
        if self.silenced[source][node]:
            return False
        return source == "bmc" or bool(self.alive[node])

    def set_fabric_manager(self, node: int, running: bool) -> None:
        """Fabric Manager stops or runs again on a node: every GPU's fabric state follows."""
        self.fabric_manager_down[node] += -1 if running else 1
        down = self.fabric_manager_down[node] > 0
        self.fabric_status[node] = FABRIC_NOT_STARTED if down else FABRIC_SUCCESS

    def healthy(self, node: int) -> bool:
        busy_faults = [f for f in self.active_faults if f.node == node and f.state.get("blocks_scheduling")]
        return bool(self.alive[node] and self.gpu_present[node].all() and not busy_faults)

    # ----------------------------------------------------------------------------------- tick
    def advance(self) -> None:
        """Move the cluster forward by one tick."""
        tick = self.scenario.tick
        self.t = self.tick_index * tick
        self._update_faults()
        self._apply_modifiers()
        self._update_jobs()
        self._sample_jobs()
        self._update_gpus(tick)
        self._blind_profiling()
        self._update_ib(tick)
        self._update_lustre(tick)
        self._update_power()
        self.tick_index += 1

    def _blind_profiling(self) -> None:
        """DCGM's profiling fields read 0 on the GPUs whose profiling module another client holds; power,
        clocks and utilisation come from other sources and keep their values."""
        blind = self.profiling_blind > 0
        if blind.any():
            for array in (
                self.tensor,
                self.gr_active,
                self.sm_active,
                self.sm_occupancy,
                self.dram_active,
                self.pcie_tx,
                self.pcie_rx,
            ):
                array[blind] = 0.0

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
        for array in (self.nvlink_crc_flit, self.nvlink_crc_data, self.nvlink_replay, self.nvlink_recovery):
            array[node] = 0
        self.xid_last[node] = 0
        self.remap_pending[node] = 0
        self.remap_failed[node] = 0
        for counters in (self.ib_counters, self.ib_hw_counters):
            for array in counters.values():
                array[node] = 0
        self.ib_up[node] = True
        self.ib_width[node] = 4
        self.ib_speed[node] = 100
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
