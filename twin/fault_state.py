"""One injected event's state while the twin runs it: what its kind's handlers keep (``state``), the
jobs it touched and failed, the effects it shows, its truth line and the bookkeeping of its part in
each job's pace; and the per-node modifiers that events put on the physics.

Its own module because every part of the injection reads it (the lifecycle in twin/injection.py, the
kinds' handlers, the truth's accounting in twin/fault_truth.py) and none of them owns it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import hardware as hw
from .scenario_model import FaultSpec


@dataclass
class ActiveFault:
    spec: FaultSpec
    node: int | None
    state: dict[str, Any] = field(default_factory=dict)
    effects: list[dict[str, str]] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    started: bool = False
    ended: bool = False
    # Per job it touched: [steps the job would have made without it, steps it made] while it lasts.
    progress: dict[str, list[float]] = field(default_factory=dict)
    failed_jobs: list[str] = field(default_factory=list)
    truth: dict[str, Any] | None = None
    # Per job, the event's own part in the job's pace (truth "pacing", "masked", "fault_slowdown"):
    # [steps without any event, steps with this event alone] over the compute ticks it set the pace,
    # the sim-time spans [from, to] it set the pace / was masked by a slower node, and its state at
    # the job's last compute tick ("pacing", "masked" or "": no effect on its node).
    own: dict[str, list[float]] = field(default_factory=dict)
    pacing: dict[str, list[list[float]]] = field(default_factory=dict)
    masked: dict[str, list[list[float]]] = field(default_factory=dict)
    pace_state: dict[str, str] = field(default_factory=dict)


# The per-node modifiers the physics reads, and their values on a node without events.
NODE_MODIFIERS: dict[str, Any] = {
    "cap_w": hw.GPU_TDP_W,
    "clock_ratio": 1.0,
    "brake": False,
    "thermal": False,
    "node_slow": 1.0,
    "comm_slow": 1.0,
    "node_stall": 0.0,
    "thermal_ratio": 1.0,
    # What training itself does to a node's share of its job (twin/training_kinds.py): its work against
    # the job's layout (expert routing, pipeline stages), and the share of its compute a pipeline's
    # bubble turns into waiting; and the part of that work that is its experts' (routing only: the
    # tokens it receives in the all-to-all, twin/fabric.py).
    "node_work": 1.0,
    "expert_work": 1.0,
    "bubble": 0.0,
}
