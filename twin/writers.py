"""Writes the simulation's state as the files a real host has, under OUT/nodes/<node>/: a sysfs tree
(twin/sysfs_tree.py), the Lustre client's sysfs and procfs files (twin/lustre_client_files.py), the
kernel, Fabric Manager, SEL and per-rank logs (twin/log_files.py) and the PCIe bandwidth probe's JSON;
the Lustre servers' job_stats (twin/lustre_servers.py); plus the run's meta.json (what a real
cluster's inventory and scheduler show) and, outside the output folder, the ground truth
(twin/truth.py).

This module is the conductor: it makes the tree, and each tick asks each file family to write what
changed, through one cache (twin/file_cache.py) that writes a file only when its content changes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from . import hardware as hw
from . import layout
from . import sim as simmod
from . import truth as truthmod
from .file_cache import FileCache
from .log_files import LogFiles
from .lustre_client_files import LustreClientFiles
from .lustre_servers import LustreServers, server_names
from .sim import Simulation
from .sysfs_tree import SysfsTree


class TreeWriter:
    """Per-node file trees under OUT/nodes/<node>/ and the run's files under OUT/."""

    def __init__(self, out: Path, sim: Simulation, truth: Path | None = None) -> None:
        self.out = out
        self.sim = sim
        self.truth_path = truth if truth is not None else truthmod.default_truth_path(out)
        truthmod.check_outside(self.truth_path, out)
        self.cache = FileCache()
        self.node_roots = [str(layout.node_root(out, name)) for name in sim.nodes]
        self.agent_down: dict[int, bool] = {}
        self.truth_text = ""
        self.meta_text = ""
        self.meta_jobs: list[tuple[str, int]] | None = None
        self.sysfs = SysfsTree(self.cache, sim, self.node_roots)
        self.lustre = LustreClientFiles(self.cache, sim)
        self.logs = LogFiles(out, sim)
        self.servers = LustreServers(out, sim)  # the OSS and MDS job_stats of the jobs' I/O

    # ------------------------------------------------------------------------------- layout
    def create(self) -> None:
        """The directory skeleton and the files that never change."""
        self.out.mkdir(parents=True, exist_ok=True)
        truthmod.write_lines(self.truth_path, [])
        truthmod.write_scenario(truthmod.scenario_path(self.truth_path), scenario_info(self.sim))
        self.write_meta()
        for index, root in enumerate(self.node_roots):
            self._create_node(index, Path(root))
        self.servers.create()

    def _create_node(self, index: int, root: Path) -> None:
        for path in ("var/log", "fleetsight", "sys/bus/pci/devices", "sys/class/infiniband", "sys/fs/lustre"):
            (root / path).mkdir(parents=True, exist_ok=True)
        layout.kernel_log(self.out, self.sim.nodes[index]).touch()
        self.sysfs.create(index, root)
        self.lustre.create(index, root)

    def meta(self) -> dict[str, Any]:
        sim = self.sim
        scenario = sim.scenario
        topo = sim.topology
        nodes = []
        for index, name in enumerate(sim.nodes):
            nodes.append(
                {
                    "name": name,
                    "rack": topo.rack(index),
                    "scalable_unit": topo.su(index),
                    "gpus": [
                        {"gpu": g, "pci_bdf": bdf, "uuid": sim.gpu_uuids[index][g], "model": hw.GPU_MODEL}
                        for g, bdf in enumerate(hw.GPU_BDFS)
                    ],
                    "hcas": [
                        {
                            "device": dev,
                            "port": 1,
                            "pci_bdf": hw.HCA_BDFS[p],
                            "guid": hw.hca_guid(scenario.seed, name, p),
                            "netdev": hw.netdev_name(hw.HCA_BDFS[p]),
                            "fabric": "compute" if p < hw.COMPUTE_PORTS else "storage",
                            "leaf": topo.leaf(index, p)[0],
                            "leaf_port": topo.leaf(index, p)[1],
                        }
                        for p, dev in enumerate(hw.IB_DEVICES)
                    ],
                    "psus": [f"PSU{i}" for i in range(scenario.cluster.psus_per_node)],
                    # Where the node's sources lie, relative to OUT (and its BMC, below the twin's URL):
                    # what a stack runner needs to point a node agent at this node, without this code.
                    "sources": layout.node_sources(name),
                }
            )
        return {
            "cluster": scenario.cluster.name,
            "start": sim.iso(0.0),
            "start_unix": sim.start_unix,
            "tick_seconds": scenario.tick,
            "duration_seconds": scenario.duration,
            "sku": scenario.cluster.sku,
            "lustre": {
                "fsname": scenario.cluster.lustre_fsname,
                "osts": scenario.cluster.lustre_osts,
                "servers": server_names(scenario.cluster.lustre_osts),
            },
            "jobs": [
                {
                    "id": job.spec.id,
                    "name": job.spec.name,
                    "user": job.spec.user,
                    "state": job.state,
                    "nodes": [sim.nodes[i] for i in job.nodes] if job.state == "RUNNING" else [],
                    "allocations": job.allocations,
                }
                for job in sim.jobs
            ],
            "nodes": nodes,
        }

    # ------------------------------------------------------------------------------- per tick
    def write_state(self) -> None:
        """Everything that changes: IB ports and counters, PCIe links, Lustre stats, the probe's JSON.

        A crashed host writes nothing. IB and PCIe values are compared with what was last written as
        arrays, so only the files whose value changed are formatted and written (twin/sysfs_tree.py)."""
        sim = self.sim
        self.sysfs.write(sim.alive[:, None])
        for index, root in enumerate(self.node_roots):
            if sim.alive[index]:
                self.lustre.write(index, root)
                self._write_probe(index, root)
            self._mark_agent(index, root, sim.answers(index, "node_agent"))
        # The servers stay up when a client dies; their job_stats grow by what the clients sent.
        self.servers.update()
        for path, text in self.servers.files().items():
            self.cache.put(path, text, atomic=True)

    def _mark_agent(self, index: int, root: str, answers: bool) -> None:
        """The node agent's down marker (layout.AGENT_DOWN_FILE), written or removed when it changes."""
        if self.agent_down.get(index, False) == (not answers):
            return
        marker = Path(root) / layout.AGENT_DOWN_FILE
        if answers:
            marker.unlink(missing_ok=True)
        else:
            marker.write_text("the node agent does not answer (host down or telemetry_dropout)\n")
        self.agent_down[index] = not answers

    def _write_probe(self, index: int, root: str) -> None:
        sim = self.sim
        gpus = [
            {
                "gpu": g,
                "pci_bdf": hw.GPU_BDFS[g],
                "uuid": sim.gpu_uuids[index][g],
                "host_to_device_bytes_per_second": round(float(sim.h2d_bandwidth[index, g]), -6),
            }
            for g in range(simmod.G)
            if sim.gpu_present[index, g]
        ]
        # The probe runs between jobs in real life; the twin re-measures at most once a minute.
        measured = sim.unix() - (sim.t % 60.0)
        self.cache.put(
            str(layout.pcie_bandwidth_file(self.out, self.sim.nodes[index])),
            json.dumps({"measured_at": round(measured, 3), "gpus": gpus}) + "\n",
            atomic=True,
        )

    # ------------------------------------------------------------------------------- logs
    def flush_logs(self) -> None:
        """Append the kernel and application log lines produced since the last flush, and new truth."""
        self.logs.flush()
        self.flush_truth()

    def flush_truth(self) -> None:
        """Rewrite the truth file (outside OUT) when a line or a measured slowdown changed, and
        meta.json when a job's node list did."""
        sim = self.sim
        sim.refresh_truth()
        text = json.dumps(sim.truth_lines, sort_keys=True)
        if text != self.truth_text:
            truthmod.write_lines(self.truth_path, sim.truth_lines)
            self.truth_text = text
        self.write_meta()

    def write_meta(self) -> None:
        """meta.json, rewritten (by rename) only when a job's state or node list changed."""
        jobs = [(job.state, len(job.allocations)) for job in self.sim.jobs]
        if jobs == self.meta_jobs:
            return
        self.meta_jobs = jobs
        text = json.dumps(self.meta(), indent=2) + "\n"
        if text != self.meta_text:
            path = layout.meta_file(self.out)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, path)
            self.meta_text = text


def scenario_info(sim: Simulation) -> dict[str, Any]:
    """The scenario's identity, for the scorer only (beside the truth file, never in OUT)."""
    scenario = sim.scenario
    return {
        "scenario": scenario.name,
        "description": scenario.description,
        "source": str(scenario.source) if scenario.source else None,
        "seed": scenario.seed,
        "start": sim.iso(0.0),
        "duration_seconds": scenario.duration,
        "realism": scenario.realism.__dict__,
        "jobs": [
            {"id": j.id, "profile": j.profile, "nodes": j.size, "pipeline_stages": j.pipeline_stages}
            for j in scenario.jobs
        ],
    }
