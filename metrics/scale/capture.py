"""One fleet's worth of real expositions, as saved by ``python -m evaluation.scale_capture``: the twin
plays a small cluster (scenario.yaml) and every exporter a node runs answers as a user runs it.

- dcgm-exporter: the twin's ``/dcgm/<node>/metrics`` (dcgm-exporter's default counters for 8 GPUs);
- the FleetSight node agent: ``fleetsight exporter node --once`` over the twin's files and BMCs;
- the fabric exporter: ``fleetsight exporter fabric --once`` over the twin's UFM;
- node_exporter: Debian's ``prometheus-node-exporter`` on this host, with the local stack's flags.

The series budget counts these; the load source replays them for N nodes. Running the twin and the
exporters is the evaluation layer's job (evaluation/scale_capture.py); this module only holds what
was captured, so that the load source reads it without reaching any other component.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SCENARIO = Path(__file__).resolve().parent / "scenario.yaml"
EXPORTERS = ("dcgm", "fleetsight-node", "fleetsight-fabric", "node")


@dataclass
class Capture:
    dcgm: dict[str, str]  # node -> dcgm-exporter's exposition
    node_agent: str  # every node's agent series (each carries `node`)
    fabric: str  # the fabric exporter (one per fabric)
    node_exporter: str  # one host's node_exporter
    nodes: list[str]

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "nodes.json").write_text(json.dumps(self.nodes))
        for node, text in self.dcgm.items():
            (folder / f"dcgm-{node}.prom").write_text(text)
        (folder / "fleetsight-node.prom").write_text(self.node_agent)
        (folder / "fleetsight-fabric.prom").write_text(self.fabric)
        (folder / "node.prom").write_text(self.node_exporter)

    @classmethod
    def load(cls, folder: Path) -> Capture:
        nodes = json.loads((folder / "nodes.json").read_text())
        return cls(
            dcgm={n: (folder / f"dcgm-{n}.prom").read_text() for n in nodes},
            node_agent=(folder / "fleetsight-node.prom").read_text(),
            fabric=(folder / "fleetsight-fabric.prom").read_text(),
            node_exporter=(folder / "node.prom").read_text(),
            nodes=nodes,
        )
