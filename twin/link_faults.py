"""What the InfiniBand fabric's faults do: a port that flaps or goes down on one host, and a leaf switch
whose every port flaps (each host cabled to it sees its own port on that rail go down and up). Ports
going down and up write the kernel's mlx5 lines, bump the port counters and raise UFM's events.

Its own module (a mixin of the Simulation): the fabric's kinds change with the topology
(twin/hardware.py) and UFM's event format, not with the node's hardware kinds (twin/node_faults.py).
"""

from __future__ import annotations

import datetime as dt
import random

import numpy as np

from . import faults as fc
from . import hardware as hw
from .counters import P, stable_hash
from .fault_state import ActiveFault
from .scenario_model import FaultSpec


class LinkFaultsMixin:
    """The IB port and leaf switch kinds' handlers, and the port's down and up (a mixin: the state
    lives on the Simulation)."""

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
