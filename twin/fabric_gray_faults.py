"""The fabric's gray failures: faults that hurt without a port ever reading DOWN at a scrape.

- ``ib_flash_cut``: the port goes down and back up within milliseconds to under a second, between two
  scrapes; its counters (link_downed, link_error_recovery) move, the kernel logs "Link down"/"Link up"
  at their real times, UFM raises its events, and ``state`` reads ACTIVE at every scrape. NCCL's IB
  timeout is ~7 s (ibv timeout 18 x 7 retries), so a sub-second cut leaves the job alive.
- ``ib_lane_downshift``: the link retrains (a sub-second cut) at fewer lanes (4X -> 2X/1X) or a lower
  speed (NDR -> HDR) and stays up; the job behind it runs its collectives at that rail's pace.
- ``ib_degrading_link``: symbol errors (and link error recoveries) on one port climb exponentially for
  hours until the link fails at the fault's end (the port goes down, as ib_port_down).
- ``ib_congestion``: the leaf one node's port is cabled to congests: every host on it waits for credits
  (port_xmit_wait climbs) and its job runs somewhat slower; no errors, no downshift, no faulty link.

Its own module (a mixin of the Simulation): these kinds change with what gray failures look like, apart
from the loud port kinds (twin/link_faults.py), whose port down/up and UFM events they reuse.
"""

from __future__ import annotations

import datetime as dt
import math
import random

import numpy as np

from . import faults as fc
from . import hardware as hw
from .counters import P, stable_hash
from .fault_state import ActiveFault
from .scenario_model import FaultSpec

# Post-FEC bit error rate of a healthy NDR link: "essentially error free", 1e-15 (the twin's background
# symbol errors; ibdiagnet flags a port above 1e-12). A degrading link climbs from here to the
# fault's magnitude (1e-9 by default) when it fails.
HEALTHY_BER = 1e-15
NDR_LANE_BITS_PER_S = 100e9  # one NDR lane's data rate (4X: 400 Gb/s)
SYMBOLS_PER_RECOVERY = 2000.0  # symbol errors per link error recovery (an assumption: docs/twin.md)
LANE_GBPS = {"NDR": 100, "HDR": 50, "EDR": 25}
NCCL_IB_TIMEOUT_S = 7.0  # a cut shorter than this leaves NCCL's queue pairs alive
SHORTEST_CUT_S = 0.005


class FabricGrayFaultsMixin:
    """Handlers of the fabric's gray failure kinds (a mixin: the state lives on the Simulation)."""

    # ------------------------------------------------------------------------------- flash cut
    def _start_ib_flash_cut(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        port = self._port_target(spec)
        longest = float(spec.target.get("cut_s", 0.8))
        if not SHORTEST_CUT_S < longest < NCCL_IB_TIMEOUT_S:
            raise ValueError(f"fault {spec.id}: cut_s {longest} must be above 0.005 and below 7 s")
        rng = random.Random(stable_hash(self.scenario.seed, spec.id) & 0xFFFFFFFF)
        cuts = max(1, int(spec.magnitude))
        times = sorted(rng.uniform(0.0, spec.duration * 0.9) for _ in range(cuts))
        # Log-uniform lengths: most cuts are a few ms to tens of ms, a few last hundreds of ms.
        lengths = [math.exp(rng.uniform(math.log(SHORTEST_CUT_S), math.log(longest))) for _ in times]
        fault.state.update(port=port, cuts=list(zip(times, lengths, strict=True)), next=0)
        device = hw.IB_DEVICES[port]
        self._effect(fault, "sysfs", f"class/infiniband/{device}/ports/1/counters/link_downed +{cuts}")
        self._effect(fault, "sysfs", f"class/infiniband/{device}/ports/1/state 4: ACTIVE at every scrape")
        self._effect(
            fault, "kern.log", f"mlx5_core {hw.HCA_BDFS[port]}: ... Link down / Link up < {longest} s"
        )
        self._effect(fault, "ufm", "events 'Link went down' / 'Link went up' on the port")

    def _flash_cut_tick(self, fault: ActiveFault) -> None:
        # The cuts that happened since the last tick (their up line may fall just after now): the
        # counters a scrape reads at this tick include them, never a cut still to come.
        state = fault.state
        cuts = state["cuts"]
        while state["next"] < len(cuts) and fault.spec.onset + cuts[state["next"]][0] <= self.t:
            at, length = cuts[state["next"]]
            state["next"] += 1
            if self.alive[fault.node] and self.ib_up[fault.node, state["port"]]:
                offset = fault.spec.onset + at - self.t  # <= 0: when it happened
                self._cut(fault.node, state["port"], offset, length)
                if fault.truth is not None:  # each cut's unix time and length: a scorer times each one
                    fault.truth.setdefault("cuts", []).append(
                        [round(self.unix() + offset, 3), round(length, 4)]
                    )

    def _cut(self, node: int, port: int, offset: float, length: float) -> None:
        """The port down and up again ``length`` seconds later, inside this tick: counters, the kernel's
        lines at their own times, UFM's events; ``ib_up`` never changes, so no scrape sees it down."""
        self.ib_counters["link_downed"][node, port] += np.uint64(1)
        self.ib_counters["link_error_recovery"][node, port] += np.uint64(1)
        self.ib_counters["symbol_error"][node, port] += np.uint64(self.prng.randrange(1, 20))
        bdf = hw.HCA_BDFS[port]
        for up, at in ((False, offset), (True, offset + length)):
            for line in fc.ib_link_lines(bdf, hw.netdev_name(bdf), hw.IB_DEVICES[port], up=up):
                self.klog(node, line, at)
            self._ufm_port_event(node, port, down=not up)
            stamp = dt.datetime.fromtimestamp(self.unix() + at, dt.UTC)
            self.ufm_events[-1]["timestamp"] = stamp.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]

    # --------------------------------------------------------------------------- lane downshift
    def _start_ib_lane_downshift(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        port = self._port_target(spec)
        width = int(spec.magnitude)
        speed = str(spec.target.get("speed", "NDR")).upper()
        if width not in (1, 2, 4):
            raise ValueError(f"fault {spec.id}: magnitude {spec.magnitude} is not a width of 1, 2 or 4 lanes")
        if speed not in LANE_GBPS:
            raise ValueError(f"fault {spec.id}: speed {speed!r} is not one of {', '.join(LANE_GBPS)}")
        if width == 4 and speed == "NDR":
            raise ValueError(f"fault {spec.id}: 4X NDR is the full rate; give fewer lanes or speed HDR/EDR")
        fault.state.update(port=port, width=width, speed=LANE_GBPS[speed])
        # The link retrains (a sub-second cut) and comes back narrower or slower.
        self._cut(node, port, 0.0, 0.3)
        self.ib_width[node, port] = width
        self.ib_speed[node, port] = LANE_GBPS[speed]
        rate = width * LANE_GBPS[speed]
        device = hw.IB_DEVICES[port]
        self._effect(
            fault, "sysfs", f"class/infiniband/{device}/ports/1/rate {rate} Gb/sec ({width}X {speed})"
        )
        self._effect(fault, "ufm", f"port active_width {width}x, active_speed {speed}; enabled 4x NDR")
        self._effect(fault, "job", f"collectives at the slowest rail's pace: {400 / rate:.1f}x comm time")

    def _end_ib_lane_downshift(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        port = fault.state["port"]
        # The repair (a reseat, a new cable) is the operator's, after the fault: as for the other port
        # kinds (twin/link_faults.py), the port is simply back at full rate, with no cut of its own.
        self.ib_width[node, port] = 4
        self.ib_speed[node, port] = LANE_GBPS["NDR"]

    # --------------------------------------------------------------------------- degrading link
    def _start_ib_degrading_link(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        port = self._port_target(spec)
        fault.state.update(port=port, recoveries=0.0)
        device = hw.IB_DEVICES[port]
        self._effect(
            fault,
            "sysfs",
            f"class/infiniband/{device}/ports/1/counters/symbol_error climbing exponentially, "
            f"BER {HEALTHY_BER:.0e} -> {spec.magnitude:.0e}",
        )
        self._effect(fault, "sysfs", f"class/infiniband/{device}/ports/1/counters/link_error_recovery rising")
        self._effect(fault, "sysfs", f"class/infiniband/{device}/ports/1/state 1: DOWN at the fault's end")

    def degrading_ber(self, spec: FaultSpec, elapsed: float) -> float:
        """The link's post-FEC bit error rate ``elapsed`` seconds into the fault: exponential from a
        healthy link's to the fault's magnitude at its end (a straight line on a log scale)."""
        share = min(1.0, max(0.0, elapsed / max(spec.duration, 1.0)))
        return HEALTHY_BER * (spec.magnitude / HEALTHY_BER) ** share

    def _degrading_tick(self, fault: ActiveFault) -> None:
        node, port = fault.node, fault.state["port"]
        if not (self.alive[node] and self.ib_up[node, port]):
            return
        bits = NDR_LANE_BITS_PER_S * self.ib_width[node, port] * self.ib_speed[node, port] / 100.0
        errors_per_s = self.degrading_ber(fault.spec, self.t - fault.spec.onset) * bits
        self.ib_symbol_rate[node, port] = 5.0 * errors_per_s  # twin/fabric.py draws rate / 5 per second
        fault.state["recoveries"] += errors_per_s * self.scenario.tick / SYMBOLS_PER_RECOVERY
        whole = int(fault.state["recoveries"])
        if whole:
            fault.state["recoveries"] -= whole
            self.ib_counters["link_error_recovery"][node, port] += np.uint64(whole)

    def _end_ib_degrading_link(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        port = fault.state["port"]
        self.ib_symbol_rate[node, port] = 0.0
        if not (self.alive[node] and self.ib_up[node, port]):
            return
        self._ib_port_down(node, port)  # it stays down: the cable or transceiver needs replacing
        self._effect(fault, "ufm", "port logical_state Down; event 'Link went down'")
        job = self._job_on(node)
        if port < hw.COMPUTE_PORTS and job is not None and job.state == "RUNNING":
            self._effect(fault, "app_log", "NCCL WARN NET/IB ... transport retry counter exceeded; job fails")
            self._kill_job(job, "nccl_ib", node, self.t + 30.0)
            if job.spec.id not in fault.failed_jobs:
                fault.failed_jobs.append(job.spec.id)

    # ------------------------------------------------------------------------------- congestion
    def _start_ib_congestion(self, fault: ActiveFault, spec: FaultSpec, node: int) -> None:
        """Every host port on the leaf that ``node``'s port is cabled to waits for credits."""
        port = self._port_target(spec)
        leaf = self.topology.leaf(node, port)[0]
        ports = [
            (i, p) for i in range(len(self.nodes)) for p in range(P) if self.topology.leaf(i, p)[0] == leaf
        ]
        nodes = sorted({self.nodes[i] for i, _ in ports})
        fault.state.update(
            port=port, leaf=leaf, ports=ports, victims=sorted({i for i, _ in ports}), nodes=nodes
        )
        for i in fault.state["victims"]:
            job = self._job_on(i)
            if job is not None and job.state == "RUNNING" and job.spec.id not in fault.jobs:
                fault.jobs.append(job.spec.id)
        self._effect(
            fault,
            "sysfs",
            f"counters/port_xmit_wait climbing on every host port of {leaf} ({len(nodes)} hosts)",
        )
        self._effect(fault, "sysfs", "no symbol errors, no link_downed, rate unchanged")
        self._effect(fault, "job", f"communication {spec.magnitude:.2f}x slower on the leaf's hosts")

    def _congestion_tick(self, fault: ActiveFault) -> None:
        # The share of the time a victim port waits for credits: the job's extra communication time.
        share = 1.0 - 1.0 / max(fault.spec.magnitude, 1.0)
        waits = self.ib_counters["port_xmit_wait"]
        for i, p in fault.state["ports"]:
            if self.alive[i] and self.node_job[i] >= 0:
                waits[i, p] += np.uint64(round(share * 1e6 * self.scenario.tick))

    def _gray_during(self, fault: ActiveFault) -> bool:
        """Runs the tick of a gray kind; False when ``fault`` is not one."""
        kind = fault.spec.kind
        if kind == "ib_flash_cut":
            self._flash_cut_tick(fault)
        elif kind == "ib_degrading_link":
            self._degrading_tick(fault)
        elif kind == "ib_congestion":
            self._congestion_tick(fault)
        else:
            return False
        return True

    def _gray_modify(self, fault: ActiveFault, m: object) -> None:
        """A gray kind's share of the per-tick modifiers (see FaultMixin._modify)."""
        kind, state = fault.spec.kind, fault.state
        if kind == "ib_lane_downshift" and self.ib_up[fault.node, state["port"]]:
            # NCCL stripes a collective over every rail: it ends when the slowest rail's share does.
            m.comm_slow[fault.node] *= 400.0 / (state["width"] * state["speed"])
        elif kind == "ib_congestion":
            for i in state["victims"]:
                m.comm_slow[i] *= fault.spec.magnitude
