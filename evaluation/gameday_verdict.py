"""The game day's verdict: what a bad hour did to FleetSight, judged from its history alone (pure: no
process, no network), so that a history written by hand (a test's, with an invariant broken on purpose)
is judged as a real one.

Each hardware fault's journey: onset -> its rule firing in Prometheus -> its message in Slack -> the
health service acting on its node. And the invariants, each with the evidence that broke it:
- every due fault's alert reached Slack;
- no log line lost, none duplicated;
- no node taken out of service without a hardware fault of its own;
- every hardware fault acted on (its node left healthy);
- every disrupted component came back;
- no health decision made by a replica that was not the leader at the time.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from twin.truth import Fault

from .alert_scoring import expected_alerts
from .health import DRAIN_STATES, Timeline
from .log_ledger import LedgerCount

# A fault counts for alert delivery once this long has passed since its onset by the end of the watch:
# room for its rule's `for:` (up to 5 minutes), Alertmanager's group_wait and a restart or two.
ALERT_ALLOWANCE_S = 420.0
ACTED_STATES = ("degraded", *DRAIN_STATES)
# A decision this close to a change of leader is not held against either replica: the roles are sampled
# every couple of seconds, and the Lease changes hands between two samples.
LEADER_GRACE_S = 5.0

_ALERT_IN_TEXT = re.compile(r"(:white_check_mark: RESOLVED )?\*(\w+)\*:.*?\nnode: `([^`]+)`", re.DOTALL)


@dataclass(frozen=True)
class SlackAlert:
    received_at: float
    alertname: str
    node: str
    firing: bool
    channel: str


def slack_alerts(records: list[dict[str, Any]]) -> list[SlackAlert]:
    """Each alert of each Slack message (Alertmanager's text lists them: ``*Name*: ... node: `n```)."""
    found = []
    for record in records:
        payload = record.get("payload") or {}
        for attachment in payload.get("attachments") or []:
            for resolved, name, node in _ALERT_IN_TEXT.findall(attachment.get("text") or ""):
                alert = SlackAlert(
                    record["received_at"], name, node, not resolved, payload.get("channel", "")
                )
                found.append(alert)
    return found


@dataclass
class Journey:
    """One hardware fault on one node, from onset to the health service's action."""

    fault: str
    kind: str
    node: str
    onset: float
    expected: tuple[str, ...]
    due: bool
    fired_s: float | None = None  # its rule firing in Prometheus, after onset
    slack_s: float | None = None  # its first firing message in Slack
    slack_alert: str = ""
    acted_s: float | None = None  # the health service's first state out of healthy
    acted_state: str = ""


def journeys(
    faults: list[Fault],
    alerts: list[SlackAlert],
    firings: dict[tuple[str, str], float],
    timelines: dict[str, Timeline],
    watched_until: float,
    allowance_s: float = ALERT_ALLOWANCE_S,
) -> list[Journey]:
    """Every hardware fault that an alert is expected to catch, per node it touched; due when its onset
    was at least allowance_s before the end of the watch."""
    rows = []
    for fault in faults:
        expected = expected_alerts(fault)
        if not fault.hardware or not expected:
            continue
        for node in fault.nodes:
            row = Journey(
                fault.id, fault.kind, node, fault.onset, expected, fault.onset + allowance_s <= watched_until
            )
            fired = [firings[(name, node)] for name in expected if (name, node) in firings]
            fired = [t for t in fired if t >= fault.onset]
            if fired:
                row.fired_s = round(min(fired) - fault.onset, 1)
            mine = [a for a in alerts if a.firing and a.node == node and a.alertname in expected]
            mine = sorted((a for a in mine if a.received_at >= fault.onset), key=lambda a: a.received_at)
            if mine:
                row.slack_s, row.slack_alert = round(mine[0].received_at - fault.onset, 1), mine[0].alertname
            samples = (timelines.get(node) or Timeline()).samples
            acted = [(t, s) for t, s, _ in samples if t >= fault.onset and s in ACTED_STATES]
            if acted:
                row.acted_s, row.acted_state = round(acted[0][0] - fault.onset, 1), acted[0][1]
            rows.append(row)
    return rows


def wrongly_out_of_service(faults: list[Fault], timelines: dict[str, Timeline]) -> dict[str, str]:
    """Nodes with no hardware fault of their own that the health service took out of service: node ->
    the state and the reasons it gave."""
    faulty = {node for f in faults if f.hardware for node in f.nodes}
    wrong = {}
    for node, timeline in sorted(timelines.items()):
        if node in faulty:
            continue
        out = [(s, r) for _, s, r in timeline.samples if s in DRAIN_STATES]
        if out:
            wrong[node] = f"{out[0][0]} ({', '.join(out[0][1]) or 'no reason given'})"
    return wrong


def non_leader_writes(
    decisions: list[dict[str, Any]],
    leadership: list[tuple[float, str, str]],
    own_log: list[tuple[float, str, str]] | None = None,
) -> list[dict[str, Any]]:
    """Decisions (``{"t", "replica", ...}``) whose replica was not the leader when it made them.

    Judged by the role samples (wall time, replica, role; "down" when it did not answer, which is no
    evidence either way) where one of the replica's answers lies within LEADER_GRACE_S of the decision:
    one that showed it leading clears it (the Lease may change hands between two samples). A decision
    no answer was near (made before the watch began, or in a gap while
    the machine was loaded) is judged by ``own_log``, the replica's own role changes: its last change
    before the decision must be to leader. Such a decision is marked ``judged_by: "own log"``."""
    sampled: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for t, replica, role in leadership:
        if role != "down":  # no answer (paused, or slow on a loaded machine) says nothing of its role
            sampled[replica].append((t, role))
    wrong = []
    for decision in decisions:
        replica, at = decision.get("replica", ""), decision["t"]
        near = [role for t, role in sampled.get(replica, []) if abs(t - at) <= LEADER_GRACE_S]
        if near:
            leading = "leader" in near
        else:
            decision["judged_by"] = "own log"
            said = [(t, role) for t, who, role in own_log or [] if who == replica and t <= at]
            leading = bool(said) and max(said, key=lambda change: change[0])[1] == "leader"
        if not leading:
            wrong.append(decision)
    return wrong


@dataclass
class Verdict:
    journeys: list[Journey]
    invariants: list[tuple[str, bool, str]] = field(default_factory=list)
    recovery: dict[str, dict[str, Any]] = field(default_factory=dict)
    disruptions: int = 0
    kinds: int = 0
    decisions: int = 0  # health decisions checked against the leader of the time

    @property
    def holds(self) -> bool:
        return all(ok for _, ok, _ in self.invariants)

    def broken(self) -> list[str]:
        return [f"{name}: {detail}" for name, ok, detail in self.invariants if not ok]


def recovery_by_kind(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per component kind: disruptions, how many came back, and the seconds to come back (median, max)
    from the release (a kill's signal, a pause's SIGCONT) to the component's readiness."""
    table: dict[str, dict[str, Any]] = {}
    for event in events:
        if event["event"] not in ("recovered", "not_recovered"):
            continue
        row = table.setdefault(event["kind"], {"disruptions": 0, "recovered": 0, "recovery_s": []})
        row["disruptions"] += 1
        if event["event"] == "recovered":
            row["recovered"] += 1
            row["recovery_s"].append(event["recovery_s"])
    for row in table.values():
        times = sorted(row.pop("recovery_s"))
        row["median_s"] = round(statistics.median(times), 1) if times else None
        row["max_s"] = times[-1] if times else None
    return dict(sorted(table.items()))


def judge(
    rows: list[Journey],
    ledger: LedgerCount | None,
    wrong_nodes: dict[str, str],
    events: list[dict[str, Any]],
    wrong_writes: list[dict[str, Any]] | None,
    decisions_checked: int = 0,
    by_own_log: int = 0,
) -> Verdict:
    """The invariants over a game day's history. ``ledger`` None: the log path was not part of the game
    day; ``wrong_writes`` None: one health replica, no leader to check;
    ``by_own_log``: how many decisions were judged by a replica's own leadership log (no role sample near)."""
    verdict = Verdict(rows, recovery=recovery_by_kind(events))
    disrupted = [e for e in events if e["event"] == "disrupted"]
    verdict.disruptions, verdict.kinds = len(disrupted), len({e["kind"] for e in disrupted})
    due = [r for r in rows if r.due]
    undelivered = [f"{r.kind} on {r.node} ({'/'.join(r.expected)})" for r in due if r.slack_s is None]
    add = verdict.invariants.append
    add(
        (
            "every due fault's alert reached Slack",
            not undelivered,
            "; ".join(undelivered) or f"{len(due)} of {len(due)}",
        )
    )
    if ledger is not None:
        add(("no log line lost", ledger.lost == 0, f"{ledger.lost} of {ledger.written} never indexed"))
        add(("no log line duplicated", ledger.duplicated == 0 and ledger.unexpected == 0,
             f"{ledger.duplicated} duplicates, {ledger.unexpected} indexed lines never written"))  # fmt: skip
    add(("no node out of service without a hardware fault", not wrong_nodes,
         "; ".join(f"{n}: {s}" for n, s in wrong_nodes.items()) or "none"))  # fmt: skip
    unacted = [f"{r.kind} on {r.node}" for r in due if r.acted_s is None]
    add(("every due hardware fault acted on", not unacted, "; ".join(unacted) or f"{len(due)} of {len(due)}"))
    lost = [
        f"{e['component']} ({e['action']} at +{e['at_s']:.0f} s)"
        for e in events
        if e["event"] == "not_recovered"
    ]
    add(
        (
            "every disrupted component came back",
            not lost,
            "; ".join(lost) or f"{len(disrupted)} of {len(disrupted)}",
        )
    )
    if wrong_writes is not None:
        detail = "; ".join(
            f"{w.get('replica') or '?'}: {w.get('what', 'a decision')}" for w in wrong_writes[:5]
        )
        checked = f"none of {decisions_checked}"
        if by_own_log:
            checked += f" ({by_own_log} with no role sample near: by the replica's own leadership log)"
        add(("no health decision by a non-leader", not wrong_writes, detail or checked))
        verdict.decisions = decisions_checked
    return verdict


def delay_summary(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return f"median {statistics.median(ordered):.0f} s, p90 {p90:.0f} s, max {ordered[-1]:.0f} s"


def markdown(verdict: Verdict, ledger: LedgerCount | None) -> str:
    """The verdict as an operator reads it: the invariants, the faults' journeys, the logs, the recovery."""
    due = [r for r in verdict.journeys if r.due]
    delivered = [r for r in due if r.slack_s is not None]
    lines = [
        f"Disruptions: {verdict.disruptions} across {verdict.kinds} component kinds.",
        f"Alerts delivered / expected: {len(delivered)} / {len(due)}; Slack delay after onset: "
        f"{delay_summary([r.slack_s for r in delivered if r.slack_s is not None])}.",
        "",
        "| invariant | holds | evidence |",
        "|---|---|---|",
        *[f"| {name} | {'yes' if ok else 'NO'} | {detail} |" for name, ok, detail in verdict.invariants],
        "",
        "| fault | node | expected alerts | rule fired | in Slack | health acted | due |",
        "|---|---|---|---|---|---|---|",
    ]

    def secs(value: float | None, what: str = "") -> str:
        return "-" if value is None else f"{value:.0f} s{' ' + what if what else ''}"

    for r in verdict.journeys:
        lines.append(
            f"| {r.kind} | {r.node} | {', '.join(r.expected)} | {secs(r.fired_s)} | "
            f"{secs(r.slack_s, r.slack_alert)} | {secs(r.acted_s, r.acted_state)} | "
            f"{'yes' if r.due else 'no'} |"
        )
    if ledger is not None:
        lines += [
            "",
            f"Log lines: {ledger.written} written, {ledger.indexed} indexed, {ledger.lost} lost, "
            f"{ledger.duplicated} duplicated (all indexed {ledger.waited_s:.0f} s after the twin stopped).",
        ]
    lines += [
        "",
        "| component kind | disruptions | came back | recovery median | recovery max |",
        "|---|---|---|---|---|",
    ]
    for kind, row in verdict.recovery.items():
        lines.append(
            f"| {kind} | {row['disruptions']} | {row['recovered']} | {secs(row['median_s'])} | "
            f"{secs(row['max_s'])} |"
        )
    return "\n".join(lines)
