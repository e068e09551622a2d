"""The game day's schedule and verdict on histories written here (evaluation/gameday_chaos.py,
evaluation/gameday_verdict.py): the same seed gives the same schedule, every kind is hit before any is hit
twice, and each invariant broken on purpose is caught and named, with its evidence. The live game day on
the real stack is tests/evaluation/test_gameday.py."""

from __future__ import annotations

from typing import Any

import pytest

from evaluation import gameday_chaos as chaos
from evaluation.gameday_verdict import (
    Journey,
    journeys,
    judge,
    markdown,
    non_leader_writes,
    slack_alerts,
    wrongly_out_of_service,
)
from evaluation.health import Timeline
from evaluation.log_ledger import count
from twin.truth import Fault

T0 = 1_800_000_000.0


def test_a_seed_gives_one_schedule_and_every_kind_is_hit_before_any_twice() -> None:
    first = chaos.plan(7, 3600, 90)
    assert first == chaos.plan(7, 3600, 90)
    assert first != chaos.plan(8, 3600, 90)
    assert all(0 < d.at_s < 3600 for d in first)
    assert [d.at_s for d in first] == sorted(d.at_s for d in first)
    opening = [d.kind for d in first[: len(chaos.KINDS)]]
    assert sorted(opening) == sorted(chaos.KINDS)
    for d in first:
        assert d.component in chaos.KINDS[d.kind]
        assert (d.hold_s > 0) == (d.action in ("pause", "cut", "slow"))
        assert (d.kind == "link") == (d.action in ("cut", "slow"))
    with pytest.raises(ValueError):
        chaos.plan(1, 0, 90)


def slack_record(at: float, alertname: str, node: str, resolved: bool = False) -> dict[str, Any]:
    """One message as the Slack stand-in records it, laid out by alerting/alertmanager.yml's template."""
    mark = ":white_check_mark: RESOLVED " if resolved else ""
    text = f"\n{mark}*{alertname}*: something on {node}\nwhat it means\nnode: `{node}`  job: `none`\n"
    status = "RESOLVED" if resolved else "FIRING:1"
    attachment = {"title": f"[{status}] {alertname} on {node}", "text": text}
    return {
        "received_at": at,
        "path": "/services/x",
        "payload": {"channel": "#c", "attachments": [attachment]},
    }


def psu_fault(node: str, onset: float) -> Fault:
    return Fault(id=f"f-{node}", kind="psu_failure", onset=onset, end=onset + 600, node=node)


def timeline(*states: tuple[float, str]) -> Timeline:
    return Timeline(samples=[(t, s, ["psu"] if s != "healthy" else []) for t, s in states])


def test_slack_messages_are_read_per_alert_and_resolved_ones_are_not_firing() -> None:
    alerts = slack_alerts(
        [slack_record(T0, "PSUFailed", "n0002"), slack_record(T0 + 9, "PSUFailed", "n0002", True)]
    )
    assert [(a.alertname, a.node, a.firing) for a in alerts] == [
        ("PSUFailed", "n0002", True),
        ("PSUFailed", "n0002", False),
    ]


def healthy_day() -> dict[str, Any]:
    """A history in which every invariant holds: one PSU fault, alerted and acted on."""
    faults = [psu_fault("n0002", T0)]
    alerts = slack_alerts([slack_record(T0 + 45, "PSUFailed", "n0002")])
    timelines = {
        "n0002": timeline((T0 - 5, "healthy"), (T0 + 50, "degraded")),
        "n0003": timeline((T0 - 5, "healthy"), (T0 + 50, "healthy")),
    }
    events = [
        {"event": "disrupted", "kind": "kafka", "component": "kafka", "action": "kill", "at_s": 10.0},
        {"event": "recovered", "kind": "kafka", "component": "kafka", "action": "kill", "at_s": 10.0,
         "down_s": 12.0, "recovery_s": 12.0},
    ]  # fmt: skip
    return {
        "rows": journeys(faults, alerts, {("PSUFailed", "n0002"): T0 + 31}, timelines, T0 + 900),
        "ledger": count({("a", 0), ("a", 10)}, [("a", 0), ("a", 10)]),
        "wrong_nodes": wrongly_out_of_service(faults, timelines),
        "events": events,
        "wrong_writes": non_leader_writes(
            [{"t": T0 + 50, "replica": "health-a", "what": "n0002 degraded"}],
            [(T0 + 48, "health-a", "leader"), (T0 + 48, "health-b", "follower")],
        ),
    }


def broken_names(**changes: Any) -> list[str]:
    day = {**healthy_day(), **changes}
    verdict = judge(day["rows"], day["ledger"], day["wrong_nodes"], day["events"], day["wrong_writes"])
    return [name for name, ok, _ in verdict.invariants if not ok]


def test_a_day_where_everything_held_is_judged_so_with_the_journey_timed() -> None:
    day = healthy_day()
    verdict = judge(day["rows"], day["ledger"], day["wrong_nodes"], day["events"], day["wrong_writes"])
    assert verdict.holds, verdict.broken()
    (row,) = verdict.journeys
    assert (row.fired_s, row.slack_s, row.slack_alert, row.acted_s) == (31.0, 45.0, "PSUFailed", 50.0)
    assert verdict.recovery == {"kafka": {"disruptions": 1, "recovered": 1, "median_s": 12.0, "max_s": 12.0}}
    table = markdown(verdict, day["ledger"])
    assert "Alerts delivered / expected: 1 / 1" in table and "| kafka | 1 | 1 | 12 s | 12 s |" in table


def test_a_follower_that_decides_is_caught_and_named() -> None:
    writes = non_leader_writes(
        [{"t": T0 + 50, "replica": "health-b", "what": "n0002 drained"}],
        [
            (T0 + 48, "health-a", "leader"),
            (T0 + 48, "health-b", "follower"),
            (T0 + 52, "health-b", "follower"),
        ],
    )
    assert [w["replica"] for w in writes] == ["health-b"]
    day = healthy_day()
    verdict = judge(day["rows"], day["ledger"], day["wrong_nodes"], day["events"], writes)
    assert verdict.broken() == ["no health decision by a non-leader: health-b: n0002 drained"]


def test_a_takeover_between_two_samples_is_not_held_against_the_new_leader() -> None:
    roles = [
        (T0 + 40, "health-a", "leader"),
        (T0 + 40, "health-b", "follower"),
        (T0 + 44, "health-b", "leader"),
    ]
    assert non_leader_writes([{"t": T0 + 43, "replica": "health-b"}], roles) == []


def test_each_broken_invariant_is_caught() -> None:
    assert broken_names(ledger=count({("a", 0), ("a", 10)}, [("a", 0)])) == ["no log line lost"]
    assert broken_names(ledger=count({("a", 0)}, [("a", 0), ("a", 0)])) == ["no log line duplicated"]
    drained = {"n0003": timeline((T0, "healthy"), (T0 + 60, "draining"))}
    assert broken_names(wrong_nodes=wrongly_out_of_service([psu_fault("n0002", T0)], drained)) == [
        "no node out of service without a hardware fault"
    ]
    killed = {"kind": "opensearch", "component": "opensearch", "action": "kill", "at_s": 5.0}
    lost = [{"event": "disrupted", **killed}, {"event": "not_recovered", **killed, "after_s": 300.0}]
    assert broken_names(events=lost) == ["every disrupted component came back"]
    silent = journeys([psu_fault("n0002", T0)], [], {}, {}, T0 + 900)
    assert broken_names(rows=silent) == [
        "every due fault's alert reached Slack",
        "every due hardware fault acted on",
    ]


def test_a_fault_too_recent_for_its_alert_is_not_yet_due() -> None:
    (row,) = journeys([psu_fault("n0002", T0)], [], {}, {}, T0 + 100, allowance_s=120)
    assert isinstance(row, Journey) and not row.due
    assert broken_names(rows=[row]) == []


def test_a_decision_no_role_answer_was_near_is_judged_by_the_replicas_own_leadership_log() -> None:
    # The stack decides while it is still starting (the twin's faults begin before the watch), and a
    # replica too slow to answer its status is "down", which says nothing of its role.
    roles = [(T0 + 30, "health-a", "down"), (T0 + 60, "health-a", "leader")]
    own_log = [
        (T0 - 20, "health-a", "leader"),
        (T0 - 10, "health-b", "leader"),
        (T0 - 9, "health-b", "follower"),
    ]
    early = [{"t": T0, "replica": "health-a", "what": "n0005 draining"}]
    assert non_leader_writes(early, roles, own_log) == []
    assert early[0]["judged_by"] == "own log"
    day = healthy_day()
    verdict = judge(day["rows"], day["ledger"], day["wrong_nodes"], day["events"], [], 1, by_own_log=1)
    assert verdict.holds and "1 with no role sample near" in verdict.invariants[-1][2]
    # ... and that log convicts a replica that had lost the Lease, or never held it.
    by_b = [{"t": T0 + 30, "replica": "health-b", "what": "n0002 drained"}]
    assert [w["replica"] for w in non_leader_writes(by_b, roles, own_log)] == ["health-b"]
    assert non_leader_writes([{"t": T0 + 30, "replica": "health-c"}], roles, own_log) != []
