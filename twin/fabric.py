"""The node's I/O: InfiniBand port counters, the Lustre client's statistics, and input power."""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from . import faults as fc
from . import hardware as hw
from .counters import P, stable_hash


class FabricMixin:
    """The Simulation's IB ports, Lustre client and PSUs (a mixin: the state lives on the Simulation)."""

    def _update_ib(self, tick: float) -> None:
        n = len(self.nodes)
        rates = np.zeros((n, P))
        for job in self.jobs:
            if job.state != "RUNNING":
                continue
            if job.phase == "compute":
                # Gradient all-reduce: ~2x the model's gradient bytes per step, spread over 8 rails.
                per_step = {
                    "llm-8b": 32e9,
                    "llm-20b": 80e9,
                    "llm-70b": 280e9,
                    "moe-8x22b": 200e9,
                    "vision": 0.2e9,
                }[job.spec.profile] / 8
                share = self._received_share(job)
                rates[job.nodes, : hw.COMPUTE_PORTS] = (per_step / max(job.step_time, 1e-3)) * share[:, None]
            elif job.phase == "stall":
                rates[job.nodes, : hw.COMPUTE_PORTS] = 2e6
        lustre_rate = self._lustre_rates()
        rates[:, hw.COMPUTE_PORTS :] = (lustre_rate[0] + lustre_rate[1])[:, None] / 2.0
        rates += 900.0  # subnet management and IPoIB chatter
        rates *= 1.0 + self.rng.normal(0.0, 0.02, (n, P))
        ceiling = 48e9 * self.ib_width / 4 * self.ib_speed / 100  # a downshifted port carries less
        rates = np.where(self.ib_up & self.alive[:, None], np.clip(rates, 0, ceiling), 0.0)
        bytes_ = rates * tick
        words = np.rint(bytes_ / 4.0).astype(np.uint64)
        packets = np.rint(bytes_ / 4096.0 + (bytes_ > 0) * 3).astype(np.uint64)
        counters = self.ib_counters
        for prefix in ("xmit", "rcv"):
            counters[f"port_{prefix}_data"] += words
            counters[f"port_{prefix}_packets"] += packets
            counters[f"unicast_{prefix}_packets"] += packets
        # port_xmit_wait counts time a port had data but no credits: congestion at the far end. Peers
        # of a slow rank pile up behind it in the collective, so their waits rise with the share of
        # the step they spend waiting; healthy jobs have some (exposed comms, pipeline bubbles).
        waiting = np.zeros((n, P))
        waiting[:, : hw.COMPUTE_PORTS] = (self.comm_slow[:, None] > 1.0) * 5e6
        waiting[:, : hw.COMPUTE_PORTS] += (self.wait_share * tick * 8e5)[:, None]
        counters["port_xmit_wait"] += np.rint(waiting + rates * 1e-5).astype(np.uint64)
        symbols = self.rng.poisson((self.ib_symbol_rate / 5.0 + self.ib_background_rate) * tick)
        symbols = symbols.astype(np.uint64)
        counters["symbol_error"] += symbols
        counters["port_rcv_errors"] += (symbols // np.uint64(4)).astype(np.uint64)
        self.ib_hw_counters["rx_write_requests"] += packets // np.uint64(8)
        self.ib_hw_counters["rx_read_requests"] += packets // np.uint64(64)
        self.ib_hw_counters["out_of_sequence"] += symbols

    def _received_share(self, job: Any) -> np.ndarray:
        """Per node of the job: its bytes against the job's mean. An MoE job's token all-to-all
        (``all_to_all_share`` of the bytes) sends each token to the nodes that hold its experts, so a
        node whose experts are busier (the profile's own wander, a routing event) receives more; the
        job's total stays. A slow node receives what it always did: it is not sent more tokens."""
        share = job.profile.get("all_to_all_share", 0.0)
        size = len(job.nodes)
        if not share or len(job.expert_load) != size:
            return np.ones(size)
        load = self.expert_work[job.nodes] * (1.0 + job.expert_load)
        return (1.0 - share) + share * load / max(float(load.mean()), 1e-9)

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
            elif phase in ("compute", "stall", "eval"):
                read[i] = 3.0e6
            elif phase == "checkpoint":
                write[i] = 6.0e9 / max(1.0, float(np.max(self.ost_slow)) * 0.2 + 0.8)
        return read * self.alive, write * self.alive

    def _update_lustre(self, tick: float) -> None:
        read, write = self._lustre_rates()
        small = np.array([p in ("compute", "stall", "eval") for p in self._phase_of_node])
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
        for fault in self.active_faults:
            if fault.spec.kind != "lustre_ost_slow":
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
