"""What the straggler detector is scored against on the twin: the straggler episodes of a scenario's
ground truth (:class:`Episode`), and one scenario's run (:class:`ScenarioRun`: its episodes and every
method's flag and clear events).

A straggler episode is a fault on a node of a running job while it slows that job. The twin's truth says
when each fault set its job's pace (``pacing``), when a slower node masked it (``masked``) and what it
costs on its own while it paces (``fault_slowdown``); older truth files give the job's whole
``job_slowdown`` over the fault, else it is measured from the step times (anomaly_feed.py). A flag on a
masked fault's node is neither right nor wrong; episodes that slow the job by less than
``NEUTRAL_SLOWDOWN`` or pace it for less than ``NEUTRAL_PACING_S`` are neutral (a flag on them is neither
right nor wrong and they do not count for recall); faults that pace nothing (a loss spike in the
application) are no episode at all.

Its own module: the feed that reads episodes from the twin and the scoring that matches flags to them
both need these types, and neither should import the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from anomaly.detector import Event

NEUTRAL_SLOWDOWN = 0.05
# A fault that sets its job's pace for less than this in all (an IB link down for a few ticks, a mild
# node masked all but a minute) is neutral too: two detection cycles, the least a flag can confirm.
NEUTRAL_PACING_S = 60.0
GRACE_S = 60.0  # a flag this long after the fault's end still belongs to it (window + cycle)


@dataclass
class Episode:
    """A fault on a node of a running job, with what it cost the job and when it set the job's pace."""

    scenario: str
    fault_id: str
    kind: str
    job: str
    node: str
    onset: float
    end: float
    slowdown: float
    benign: bool = False
    # When the fault set its job's pace, and when a slower node masked it (the twin's truth; without
    # it, the whole fault paces). A fault with neither never acted on its node's pace.
    pacing: list[tuple[float, float]] = field(default_factory=list)
    masked: list[tuple[float, float]] = field(default_factory=list)

    @property
    def counted(self) -> bool:
        return self.slowdown >= NEUTRAL_SLOWDOWN and not self.benign and self.pacing_s >= NEUTRAL_PACING_S

    @property
    def pacing_s(self) -> float:
        return sum(b - a for a, b in self.pacing)

    @property
    def neutral(self) -> bool:
        """A real fault that slowed its job too little to call the node a straggler."""
        return not self.benign and not self.counted

    def pacing_at(self, time: float) -> tuple[float, float] | None:
        """The span (start, end) in which the fault set its job's pace at ``time`` (or just before)."""
        return _span_at(self.pacing, time)

    def masked_at(self, time: float) -> bool:
        return _span_at(self.masked, time) is not None


def _span_at(spans: list[tuple[float, float]], time: float) -> tuple[float, float] | None:
    return next(((a, b) for a, b in spans if a <= time <= b + GRACE_S), None)


@dataclass
class ScenarioRun:
    """One scenario through every method: its size, its episodes, and each method's events."""

    name: str
    nodes: int
    hours: float
    fault_free: bool
    episodes: list[Episode]
    events: dict[str, list[Event]]  # method -> its events
    cycle_cpu_s: list[float] = field(default_factory=list)
    truth_source: str = "measured step times"
