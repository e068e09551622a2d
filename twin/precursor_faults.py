"""Hardware that announces its failure: one GPU's NVLink whose CRC, replay and recovery counters climb
for days until the link fails (Xid 74), and one GPU's HBM whose correctable ECC errors and correctable
row remaps climb until an uncorrectable error (DBE, Xid 48, an uncorrectable remap pending: Xid 63).

The shape of the climb, and why (docs/twin.md, "Precursors"): the error rate grows exponentially from
near the healthy background to the rate at failure, by a factor drawn per fault between 10^2.5 and
10^3.5 over the fault's duration; every tick's count is a Poisson draw of that rate, so a climb is
noisy as real counters are. ``magnitude`` is the primary counter's total over the fault (NVLink
recovery events; HBM correctable errors); the other counters follow by fixed ratios. The failure
lands at the fault's end: the truth's ``end`` is the failure time a forecast is scored against.

Healthy GPUs have background NVLink errors too (``realism.background_errors``): a per-GPU log-normal
rate, most GPUs at zero for days, a few counting steadily. Random numbers come from generators of
their own, so that scenarios without these kinds draw exactly what they drew before.

Its own module (a mixin of the Simulation): the precursor kinds change with what is known about
failure trajectories, apart from the sudden hardware faults (twin/node_faults.py).
"""

from __future__ import annotations

import math
import random

import numpy as np

from . import hardware as hw
from .counters import stable_hash
from .fault_state import ActiveFault
from .scenario_model import FaultSpec

# NVLink counters per recovery event while a link degrades (our assumption: every flit that fails its
# CRC is replayed, so replays follow flit CRC errors one for one; a recovery, a retrain of the link,
# follows when replays keep failing; data CRC errors are a share of the flit ones).
NVLINK_PER_RECOVERY = {"nvlink_crc_flit": 20.0, "nvlink_crc_data": 4.0, "nvlink_replay": 20.0}
NVLINK_COUNTERS = ("nvlink_crc_flit", "nvlink_crc_data", "nvlink_replay", "nvlink_recovery")
# Correctable errors per correctable row remap while HBM degrades (our assumption: a weak row repeats
# its single-bit error tens of times before the driver remaps it).
SBE_PER_REMAP = 50.0
# The growth of the error rate over a fault, as a power of ten drawn per fault (three decades: from
# near the background to the rate at failure).
GROWTH_DECADES = (2.5, 3.5)
# Healthy NVLinks: flit CRC errors per second, per GPU log-normal (median 1e-6/s, ~0.1 a day; most
# GPUs show none for days, a few count steadily); the other counters by the same ratios as above, a
# recovery 1 in 100 flit errors (our assumption: no public per-link figure).
NVLINK_BACKGROUND_MEDIAN = 1e-6
NVLINK_BACKGROUND_SIGMA = 1.5
NVLINK_BACKGROUND_SHARE = {
    "nvlink_crc_flit": 1.0,
    "nvlink_crc_data": 0.2,
    "nvlink_replay": 1.0,
    "nvlink_recovery": 0.01,
}


class PrecursorFaultsMixin:
    """The precursor kinds' handlers and the healthy NVLinks' background (a mixin: the state lives on
    the Simulation)."""

    def _init_precursor_rates(self) -> None:
        """Per-GPU background NVLink error rates, from a generator of their own."""
        n = len(self.nodes)
        self.precursor_rng = np.random.default_rng([self.scenario.seed, 43])
        if self.scenario.realism.background_errors:
            log_median = math.log(NVLINK_BACKGROUND_MEDIAN)
            self.nvlink_error_rate = np.exp(
                self.precursor_rng.normal(log_median, NVLINK_BACKGROUND_SIGMA, (n, len(hw.GPU_BDFS)))
            )
        else:
            self.nvlink_error_rate = np.zeros((n, len(hw.GPU_BDFS)))

    def _precursor_background(self, tick: float) -> None:
        """Healthy NVLinks' occasional errors, on the nodes that are up."""
        if not self.nvlink_error_rate.any():
            return
        up = self.alive[:, None]
        for name, share in NVLINK_BACKGROUND_SHARE.items():
            counts = self.precursor_rng.poisson(self.nvlink_error_rate * share * tick)
            getattr(self, name)[:] += np.where(up, counts, 0)

    # ------------------------------------------------------------------------------ the climb
    def _climb(self, fault: ActiveFault, spec: FaultSpec) -> None:
        """The fault's trajectory: time constant and the primary counter's rate at failure."""
        rng = random.Random(stable_hash(self.scenario.seed, spec.id, "climb") & 0xFFFFFFFF)
        growth = 10.0 ** rng.uniform(*GROWTH_DECADES)
        tau = spec.duration / math.log(growth)
        # The total over the fault is magnitude: integral of r_end * exp(-(D - t) / tau) dt.
        r_end = spec.magnitude / (tau * (1.0 - 1.0 / growth))
        fault.state.update(tau=tau, r_end=r_end, growth=round(growth, 1))
        fault.state["rng"] = np.random.default_rng([self.scenario.seed, stable_hash(spec.id) & 0xFFFF])

    def _rate_now(self, fault: ActiveFault) -> float:
        """The primary counter's rate (per second) at this tick."""
        left = fault.spec.onset + fault.spec.duration - self.t
        return fault.state["r_end"] * math.exp(-max(0.0, left) / fault.state["tau"])

    def _precursor_tick(self, fault: ActiveFault) -> None:
        node, gpu = fault.node, fault.state["gpu"]
        if not self.alive[node]:
            return
        expected = self._rate_now(fault) * self.scenario.tick
        rng = fault.state["rng"]
        if fault.spec.kind == "nvlink_degrading":
            self.nvlink_recovery[node, gpu] += rng.poisson(expected)
            for name, ratio in NVLINK_PER_RECOVERY.items():
                getattr(self, name)[node, gpu] += rng.poisson(expected * ratio)
        else:
            self.ecc_sbe[node, gpu] += rng.poisson(expected)
            self.remap_correctable[node, gpu] += rng.poisson(expected / SBE_PER_REMAP)

    # ------------------------------------------------------------------------------ NVLink
    def _start_nvlink_degrading(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        gpu = self._gpu_target(spec)
        fault.state.update(gpu=gpu)
        self._climb(fault, spec)
        self._effect(
            fault,
            "dcgm",
            f"gpu {gpu}: DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL climbs to ~{spec.magnitude:g}, "
            "REPLAY and CRC_FLIT ~20x, CRC_DATA ~4x that, the rate growing "
            f"x{fault.state['growth']:g} over the fault",
        )
        self._effect(
            fault, "kern.log", "at the end: NVRM Xid 74 (NVLink fatal error); the job on the node fails"
        )

    def _end_nvlink_degrading(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        gpu = fault.state["gpu"]
        if not self.alive[node]:
            return
        self._emit_xid(fault, node, gpu, 74)
        self._fail_job(fault, node, gpu, "xid74", "NCCL error over the failed NVLink; job fails")

    # ------------------------------------------------------------------------------ HBM
    def _start_hbm_degrading(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        gpu = self._gpu_target(spec)
        fault.state.update(gpu=gpu)
        self._climb(fault, spec)
        self._effect(
            fault,
            "dcgm",
            f"gpu {gpu}: DCGM_FI_DEV_ECC_SBE_VOL_TOTAL climbs by ~{spec.magnitude:g}, "
            f"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS by ~{spec.magnitude / SBE_PER_REMAP:.0f}, the rate "
            f"growing x{fault.state['growth']:g} over the fault",
        )
        self._effect(
            fault,
            "dcgm",
            "at the end: DCGM_FI_DEV_ECC_DBE_VOL_TOTAL +1, UNCORRECTABLE_REMAPPED_ROWS +1, REMAP_PENDING=1",
        )
        self._effect(fault, "kern.log", "at the end: NVRM Xid 48 (DBE) then Xid 63 (row remap pending)")

    def _end_hbm_degrading(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        gpu = fault.state["gpu"]
        if not self.alive[node]:
            return
        self.ecc_dbe[node, gpu] += 1
        self.remap_uncorrectable[node, gpu] += 1
        self.remap_pending[node, gpu] = 1
        self._emit_xid(fault, node, gpu, 48)
        self._emit_xid(fault, node, gpu, 63)
        self._fail_job(fault, node, gpu, "xid48", "CUDA error (uncorrectable ECC) in the rank; job fails")

    def _fail_job(self, fault: ActiveFault, node: int, gpu: int, reason: str, effect: str) -> None:
        job = self._job_on(node)
        if job is not None and job.state == "RUNNING":
            if job.spec.id not in fault.jobs:
                fault.jobs.append(job.spec.id)
            self._effect(fault, "app_log", effect)
            self._kill_job(job, reason, node, self.t + 2.0, gpu=gpu)
