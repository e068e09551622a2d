"""What the node's own hardware faults do, kind by kind, and the benign disturbances of a job's node: a
PSU failure's power brake, a hot GPU, a PCIe link that trains down, Xids and row remaps, a host crash,
a dead NVSwitch, a slow OST, a gray slow node, a loss spike. Each ``_start_<kind>`` (and
``_end_<kind>``, where the fault leaves something to undo) writes the log lines, counter jumps and
effects of its kind; twin/injection.py calls them by name.

Its own module (a mixin of the Simulation): it changes when a hardware kind's signature does, apart
from the network's kinds (twin/link_faults.py) and what is not the hardware
(twin/blind_spot_faults.py).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from . import faults as fc
from . import hardware as hw
from .counters import THROTTLE_HW_POWER_BRAKE, G, P, stable_hash
from .fault_state import ActiveFault
from .scenario_model import FaultSpec


class NodeFaultsMixin:
    """The node hardware kinds' and the benign kinds' handlers (a mixin: the state lives on the
    Simulation)."""

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
