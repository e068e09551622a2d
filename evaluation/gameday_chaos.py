"""The game day's disruptions: a seeded plan of kills, pauses and restarts of FleetSight's own processes,
and the thread that carries it out on a running stack while recording what it did and how long each
component took to come back.

A disruption names a *kind* of component (``prometheus``: either replica of the pair) and the plan picks
the replica, so the whole plan follows from the seed alone. Actions, as production breaks a process:
- ``kill``: SIGKILL to the component's process group (a crash, an OOM kill): nothing saved, no goodbye;
- ``restart``: SIGTERM, as a deploy or a host reboot does: the component may save and close;
- ``pause``: SIGSTOP for ``hold_s`` seconds, then SIGCONT: a process that hangs (a long GC, a stuck disk,
  a frozen VM) is alive to its supervisor but answers nobody, the gray failure a kill never shows.
And on the loopback links the game day routes through a proxy (evaluation/gameday_links.py), kind
``link``: ``cut`` (every connection dropped, new ones refused) or ``slow`` (each chunk held ``LINK_DELAY_S``)
for ``hold_s`` seconds.

The stack's supervisor restarts what exits (fleetsight/supervisor.py); the chaos only sends signals and
watches the component's own readiness check for its recovery.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

ACTIONS = ("kill", "restart", "pause")
ACTION_WEIGHTS = (0.5, 0.2, 0.3)
LINK_ACTIONS = ("cut", "slow")
LINK_WEIGHTS = (0.7, 0.3)
LINK_DELAY_S = 2.0
PAUSE_S = (5.0, 30.0)  # a pause (or a link's cut) lasts this long, uniformly drawn
LINK = "link"
RECOVERY_DEADLINE_S = 300.0  # after this, a component that is not back is reported as not recovered
POLL_S = 0.5

# Component kinds the game day disrupts -> the stack's components of that kind (replicas of a pair).
KINDS: dict[str, tuple[str, ...]] = {
    "prometheus": ("prometheus", "prometheus-b"),
    "alertmanager": ("alertmanager", "alertmanager-b"),
    "thanos-sidecar": ("thanos-sidecar", "thanos-sidecar-b"),
    "thanos-query": ("thanos-query",),
    "kafka": ("kafka",),
    "opensearch": ("opensearch",),
    "logs-node": ("logs-node",),
    "logs-shipper": ("logs-shipper",),
    "exporter-node": ("exporter-node",),
    "exporter-fabric": ("exporter-fabric",),
    "health": ("health-leader", "health-follower"),  # a role: whichever replica holds it at the time
    "health-lease": ("health-lease",),
    "anomaly": ("anomaly",),
    "checks": ("checks",),
    LINK: ("health->prometheus", "health->alertmanager"),
}


@dataclass(frozen=True)
class Disruption:
    at_s: float  # seconds after the game day's chaos began
    action: str  # kill | restart | pause; a link's: cut | slow
    kind: str
    component: str
    hold_s: float = 0.0  # a pause's length

    def describe(self) -> str:
        hold = f" for {self.hold_s:.0f} s" if self.hold_s else ""
        return f"+{self.at_s:.0f} s {self.action} {self.component}{hold}"


def plan(
    seed: int,
    duration_s: float,
    mean_gap_s: float,
    kinds: dict[str, tuple[str, ...]] | None = None,
) -> list[Disruption]:
    """The disruptions of one game day: gaps drawn from an exponential distribution (disruptions arrive
    at random, sometimes close together), kinds dealt from a shuffled deck that is dealt again when
    empty (every kind is hit before any is hit twice), action and replica drawn at random."""
    if duration_s <= 0 or mean_gap_s <= 0:
        raise ValueError("the duration and the mean gap must be positive")
    kinds = kinds or KINDS
    rng = random.Random(seed)
    deck: list[str] = []
    disruptions: list[Disruption] = []
    at = rng.expovariate(1 / mean_gap_s)
    while at < duration_s:
        if not deck:
            deck = sorted(kinds)
            rng.shuffle(deck)
        kind = deck.pop()
        if kind == LINK:
            action = rng.choices(LINK_ACTIONS, LINK_WEIGHTS)[0]
        else:
            action = rng.choices(ACTIONS, ACTION_WEIGHTS)[0]
        hold = round(rng.uniform(*PAUSE_S), 1) if action in ("pause", *LINK_ACTIONS) else 0.0
        disruptions.append(Disruption(round(at, 1), action, kind, rng.choice(kinds[kind]), hold))
        at += rng.expovariate(1 / mean_gap_s)
    return disruptions


class History:
    """The game day's record: one dict per event with its wall time; appended from several threads."""

    def __init__(self, sink: Callable[[dict[str, Any]], None] = lambda _event: None) -> None:
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.sink = sink

    def add(self, event: str, **fields: Any) -> dict[str, Any]:
        entry = {"t": time.time(), "event": event, **fields}
        with self.lock:
            self.events.append(entry)
        self.sink(entry)
        return entry

    def of(self, event: str) -> list[dict[str, Any]]:
        with self.lock:
            return [e for e in self.events if e["event"] == event]


class Link(Protocol):
    """A link the chaos can cut or slow (evaluation/gameday_links.py's LinkProxy)."""

    def cut_for(self, seconds: float, stopping: threading.Event) -> None: ...

    def slow_for(self, delay_s: float, seconds: float, stopping: threading.Event) -> None: ...


@dataclass
class Target:
    """How the chaos reaches one component: its current process group (None while it is down) and its
    readiness check."""

    pid: Callable[[], int | None]
    ready: Callable[[], bool]


class Chaos(threading.Thread):
    """Carries out a plan on a running stack: each disruption at its time, each in a thread of its own
    (a pause holds, and the recovery is watched while later disruptions go on)."""

    def __init__(
        self,
        disruptions: list[Disruption],
        targets: dict[str, Target],
        history: History,
        links: dict[str, Link] | None = None,
        roles: dict[str, Callable[[], str | None]] | None = None,
    ) -> None:
        super().__init__(name="gameday-chaos", daemon=True)
        self.disruptions = disruptions
        self.targets = targets
        self.links = links or {}
        self.roles = roles or {}  # a role (health-leader) -> the component that holds it now
        self.history = history
        self.stopping = threading.Event()
        self.busy: set[str] = set()  # components disrupted and not yet back
        self.workers: list[threading.Thread] = []
        self.began = 0.0

    def run(self) -> None:
        self.began = time.monotonic()
        for disruption in self.disruptions:
            if self.stopping.wait(max(0.0, self.began + disruption.at_s - time.monotonic())):
                return
            worker = threading.Thread(target=self.carry_out, args=(disruption,), daemon=True)
            self.workers.append(worker)
            worker.start()

    def stop(self) -> None:
        self.stopping.set()

    def wait_recovered(self, timeout_s: float) -> bool:
        """Wait for every disruption's worker (its pause released, its recovery seen or given up)."""
        deadline = time.monotonic() + timeout_s
        self.join(max(0.0, deadline - time.monotonic()))
        for worker in list(self.workers):
            worker.join(max(0.0, deadline - time.monotonic()))
        return not any(w.is_alive() for w in self.workers)

    def carry_out(self, disruption: Disruption) -> None:
        name = disruption.component
        fields = asdict(disruption)
        if disruption.kind == LINK:
            self._disrupt_link(disruption, fields)
            return
        if name in self.roles:
            holder = self.roles[name]()
            if holder is None:
                self.history.add("skipped", **fields, reason=f"no replica is {name.split('-', 1)[1]} now")
                return
            name = fields["process"] = holder
        target = self.targets.get(name)
        if target is None:
            self.history.add("skipped", **fields, reason="not part of this stack")
            return
        if name in self.busy:
            self.history.add("skipped", **fields, reason="still recovering from the last disruption")
            return
        pid = target.pid()
        if pid is None:
            self.history.add("skipped", **fields, reason="not running (its supervisor is restarting it)")
            return
        self.busy.add(name)
        try:
            self._disrupt(disruption, target, pid, fields)
        finally:
            self.busy.discard(name)

    def _disrupt(self, disruption: Disruption, target: Target, pid: int, fields: dict[str, Any]) -> None:
        started = time.monotonic()
        if disruption.action == "pause":
            send(pid, signal.SIGSTOP)
            self.history.add("disrupted", **fields, pid=pid)
            self.stopping.wait(disruption.hold_s)  # the pause's length: the experiment, not a sync
            send(pid, signal.SIGCONT)
            self.history.add("released", **fields, pid=pid)
            released = time.monotonic()
            back = self._wait(lambda: target.ready())
        else:
            send(pid, signal.SIGKILL if disruption.action == "kill" else signal.SIGTERM)
            self.history.add("disrupted", **fields, pid=pid)
            released = started
            back = self._wait(lambda: target.pid() not in (None, pid) and target.ready())
        if back is None:
            self.history.add("not_recovered", **fields, after_s=round(time.monotonic() - started, 1))
            return
        self.history.add(
            "recovered",
            **fields,
            down_s=round(back - started, 1),  # from the signal to ready again
            recovery_s=round(back - released, 1),  # from the release (a pause's SIGCONT) to ready
        )

    def _disrupt_link(self, disruption: Disruption, fields: dict[str, Any]) -> None:
        link = self.links.get(disruption.component)
        if link is None:
            self.history.add("skipped", **fields, reason="no proxy on this link in this stack")
            return
        self.history.add("disrupted", **fields)
        if disruption.action == "cut":
            link.cut_for(disruption.hold_s, self.stopping)
        else:
            link.slow_for(LINK_DELAY_S, disruption.hold_s, self.stopping)
        self.history.add("restored", **fields)

    def _wait(self, condition: Callable[[], bool]) -> float | None:
        deadline = time.monotonic() + RECOVERY_DEADLINE_S
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # a readiness check that raises is a "not yet"
                if condition():
                    return time.monotonic()
            time.sleep(POLL_S)
        return None


def send(pid: int, signum: int) -> None:
    """A signal to the component's whole process group (its children too: a wrapper's server)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)
