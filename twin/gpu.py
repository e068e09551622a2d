"""GPU physics: what each GPU's DCGM fields read, from what it did in the window the sample saw.

Each tick the workload says, per GPU, which share of the sampled window it computed (``f_compute``),
waited in a collective with the NCCL kernel resident (``f_wait``: exposed communication, pipeline
bubbles, waiting for a slower peer) or sat idle (the rest: checkpoints, stalls, no job). DCGM's
profiling fields average that window, so:

- ``GPU_UTIL`` counts any resident kernel: ~100 % while computing *and* while waiting in NCCL;
- ``GR_ENGINE_ACTIVE`` stays high in both; ``SM_ACTIVE`` falls while waiting (NCCL uses a few SMs);
- ``PIPE_TENSOR_ACTIVE`` and power follow compute only.

Silicon differs (speed, power at the same work, cooling); busy GPUs reach their power limit, which
lowers their clocks and sets the SW power-cap throttle bit, as on real H100s in dense training.
Temperatures follow power through each GPU's thermal resistance above a drifting inlet temperature;
a thermal fault drives a GPU to its slowdown point (~87-90 C on an H100), never beyond.
"""

from __future__ import annotations

import math

import numpy as np

from . import hardware as hw
from .counters import (
    THROTTLE_HW_POWER_BRAKE,
    THROTTLE_HW_THERMAL,
    THROTTLE_IDLE,
    THROTTLE_SW_POWER,
    THROTTLE_SW_THERMAL,
    G,
)

WAIT_POWER_W = 190.0  # an H100 in an NCCL collective: copies and a few SMs, clocks up
LOADED_IDLE_W = hw.GPU_IDLE_W + 25.0  # a job's context resident, no kernel running
THERMAL_TAU_S = 40.0  # how fast a GPU's temperature follows its power
THERMAL_SLOWDOWN_C = 84.0  # where an H100 starts slowing down; its hardware slowdown is near 90 C
CAP_CLOCK_EXPONENT = 0.4  # power ~ f * V^2 ~ f^2.5 in DVFS: clock ratio = (cap / demand) ** 0.4


class GpuMixin:
    """The Simulation's GPUs (a mixin: the state lives on the Simulation)."""

    def _init_gpu_physics(self) -> None:
        """Per-GPU silicon and cooling, per-node inlet temperature and background error rates."""
        n = len(self.nodes)
        realism = self.scenario.realism
        rng = np.random.default_rng([self.scenario.seed, 11])
        if realism.silicon:
            # Same work, same cap: H100s differ by ~1-2 % in speed and several % in power (leakage).
            self.gpu_eff = 1.0 + rng.normal(0.0, 0.012, (n, G))
            self.gpu_power_scale = 1.0 + rng.normal(0.0, 0.035, (n, G))
            self.thermal_resistance = 0.058 * (1.0 + rng.normal(0.0, 0.07, (n, G)))  # C per W
            per_rack = self.scenario.cluster.nodes_per_rack
            slot = np.arange(n) % per_rack
            self.inlet_base = 23.0 + 0.8 * slot + rng.normal(0.0, 0.6, n)  # higher in the rack, warmer
            self.inlet_phase = rng.uniform(0, 2 * math.pi, n // per_rack + 1)[np.arange(n) // per_rack]
            self.intensity_sigma = 0.03
        else:
            self.gpu_eff = np.ones((n, G))
            self.gpu_power_scale = np.ones((n, G))
            self.thermal_resistance = np.full((n, G), 0.062)
            self.inlet_base = np.full(n, 29.0)
            self.inlet_phase = np.zeros(n)
            self.intensity_sigma = 0.0
        self.gpu_temp = self.inlet_base[:, None] + np.zeros((n, G))
        if realism.background_errors:
            # Healthy GPUs replay a PCIe TLP now and then; a few GPUs much more than most.
            self.replay_rate = np.exp(rng.normal(math.log(2e-5), 1.5, (n, G)))  # per second
            self.sbe_rate = np.exp(rng.normal(math.log(2e-7), 2.0, (n, G)))
        else:
            self.replay_rate = np.zeros((n, G))
            self.sbe_rate = np.zeros((n, G))
        self._init_precursor_rates()  # healthy NVLinks' error rates (twin/precursor_faults.py)
        self.f_compute = np.zeros((n, G))
        self.f_wait = np.zeros((n, G))
        self.wait_share = np.zeros(n)  # per node: share of the step spent waiting (whole step)
        self.intensity = np.ones((n, G))
        self.power_demand = np.full((n, G), hw.GPU_IDLE_W)
        self.cap_clock = np.ones((n, G))
        self.thermal_ratio = np.ones((n, G))

    def inlet_temperature(self) -> np.ndarray:
        """Per node: the rack's inlet air, drifting over the day (chillers, load in the hall)."""
        if not self.scenario.realism.silicon:
            return self.inlet_base
        day = 2 * math.pi * self.t / 86400.0
        return self.inlet_base + 1.5 * np.sin(day + self.inlet_phase)

    def _update_gpus(self, tick: float) -> None:
        n = len(self.nodes)
        rng = self.rng
        f_c, f_w = self.f_compute, self.f_wait
        f_i = np.clip(1.0 - f_c - f_w, 0.0, 1.0)
        running = self.node_job >= 0
        computing = np.array([p == "compute" for p in self._phase_of_node])
        cap = self.cap_w
        capped = self.power_demand > cap
        compute_w = np.where(capped, cap - np.abs(rng.normal(0.0, 4.0, (n, G))), self.power_demand)
        compute_w = np.where(self.brake, cap * (0.93 + 0.05 * rng.random((n, G))), compute_w)
        idle_w = np.where(running[:, None], LOADED_IDLE_W, hw.GPU_IDLE_W) * self.gpu_power_scale
        power = f_c * compute_w + f_w * WAIT_POWER_W * self.gpu_power_scale + f_i * idle_w
        power = power + rng.normal(0.0, 4.0, (n, G))
        power = np.minimum(power, np.where(self.brake, cap, np.inf))
        self.power = np.where(self.gpu_present, np.maximum(power, 55.0), 0.0)
        self.power_limit = self.cap_w.copy()
        base_clock = hw.GPU_MAX_SM_CLOCK * self.clock_ratio
        compute_clock = base_clock * np.minimum(self.cap_clock, 1.0)
        clock = f_c * compute_clock + (1.0 - f_c) * base_clock
        self.sm_clock = np.where(running[:, None], np.round(clock / 15.0) * 15.0, 345.0)
        self._update_temperatures(tick)
        tensor_ratio = self._tensor_ratio[:, None]
        self.tensor = np.clip(f_c * tensor_ratio * self.intensity, 0, 1)
        self.gr_active = np.clip(f_c * 0.98 + f_w * 0.95, 0, 1)
        self.sm_active = np.clip(f_c * 0.88 * self.intensity + f_w * 0.16, 0, 1)
        self.sm_occupancy = np.clip(f_c * 0.36 + f_w * 0.05, 0, 1)
        self.dram_active = np.clip(f_c * 0.36 * self.intensity + f_w * 0.06, 0, 1)
        self.gpu_util = np.round(np.clip((f_c + f_w) * 100.0, 0, 100))
        self.mem_copy_util = np.round(self.dram_active * 100)
        self.fb_used = np.round(self._fb_target[:, None] + rng.normal(0.0, 20.0, (n, G)).clip(0))
        self._update_pcie_traffic(f_c)
        self._update_throttle(running, computing)
        self._update_gpu_counters(tick, f_c)
        dead = ~self.alive
        for array in (self.power, self.tensor, self.gr_active, self.sm_active, self.gpu_util):
            array[dead] = 0.0

    def _update_temperatures(self, tick: float) -> None:
        n = len(self.nodes)
        target = self.inlet_temperature()[:, None] + self.thermal_resistance * self.power
        # A GPU whose cooling fails heats up to its slowdown point and is held there by lower clocks:
        # the worse the fault (the lower the clock ratio), the closer to the 90 C hardware slowdown.
        hot = self.thermal
        held = THERMAL_SLOWDOWN_C + 15.0 * (1.0 - self.thermal_ratio)
        target = np.where(hot, np.maximum(target, held), target)
        self.gpu_temp = self.gpu_temp + (target - self.gpu_temp) * min(1.0, tick / THERMAL_TAU_S)
        self.mem_temp = self.gpu_temp + 6.0 + self.rng.normal(0.0, 0.5, (n, G))

    def _update_pcie_traffic(self, f_c: np.ndarray) -> None:
        link_bw = self.h2d_bandwidth
        phase_io = np.array([{"checkpoint": 0.4, "startup": 0.3}.get(p, 0.0) for p in self._phase_of_node])
        self.pcie_rx = np.minimum(link_bw * (0.02 * f_c + 0.05 * phase_io[:, None]), link_bw)
        self.pcie_tx = np.minimum(link_bw * (0.015 * f_c + phase_io[:, None]), link_bw)

    def _update_throttle(self, running: np.ndarray, computing: np.ndarray) -> None:
        """DCGM's clock throttle reasons: idle, SW power cap (common on busy healthy H100s), power
        brake, thermal slowdowns."""
        throttle = np.where(running[:, None], 0, THROTTLE_IDLE)
        power_capped = (self.power_demand > self.cap_w) & (self.f_compute > 0.25) & computing[:, None]
        throttle = throttle | np.where(power_capped, THROTTLE_SW_POWER, 0)
        throttle = throttle | np.where(self.brake, THROTTLE_HW_POWER_BRAKE | THROTTLE_SW_POWER, 0)
        near_limit = self.thermal & (self.gpu_temp > THERMAL_SLOWDOWN_C - 1.0)
        throttle = throttle | np.where(near_limit, THROTTLE_SW_THERMAL, 0)
        throttle = throttle | np.where(near_limit & (self.thermal_ratio < 0.75), THROTTLE_HW_THERMAL, 0)
        self.throttle = throttle.astype(np.int64)

    def _update_gpu_counters(self, tick: float, f_c: np.ndarray) -> None:
        n = len(self.nodes)
        self.energy_mj += self.power * tick * 1000.0
        nvlink_ok = np.ones(n, dtype=bool)
        for fault in self.active_faults:
            if fault.spec.kind == "nvswitch_fatal":
                nvlink_ok[fault.node] = False
        self.nvlink_total += np.where(nvlink_ok[:, None], (f_c + 0.5 * self.f_wait) * 2.0e8 * tick, 0.0)
        # A link trained below its speed replays more, the further down the more (~0.08/s at Gen1).
        gap = np.clip(self.pci_max_gen[:, :G] - self.pci_gen[:, :G], 0, None)
        replay_rate = self.replay_rate + 0.02 * gap
        self.pcie_replay += self.rng.poisson(replay_rate * tick)
        self.ecc_sbe += self.rng.poisson(self.sbe_rate * tick)
        self._precursor_background(tick)
