"""The state machine with an explicit clock: hysteresis, the breaker's window, overrides, the scheduler's
view, failure history and what survives a restart. No servers: the engine is pure logic."""

from __future__ import annotations

from pathlib import Path

import pytest

from health.engine import HealthEngine
from health.model import Observation, SchedulerView, Signal
from health.policy import Breaker, Policy, PolicyError, from_dict, load

NODES = {f"e{i:02d}": ("u1" if i <= 4 else "u2") for i in range(1, 9)}
POLICY = Policy(
    signals={"XidBad": "unhealthy", "Hot": "degraded", "RMA": "repair", "Noise": "ignore"},
    clean_for_s=60,
    breaker=Breaker(window_s=600, max_cluster_fraction=0.5, max_unit_fraction=0.5),
)


def signal(node: str, name: str, since: float = 0.0) -> Signal:
    return Signal(node, name, "alertmanager", since, POLICY.effect(name), evidence={"labels": {"gpu": "1"}})


def observe(*signals: Signal, scheduler: dict[str, SchedulerView] | None = None) -> Observation:
    return Observation(nodes=dict(NODES), signals=list(signals), scheduler=scheduler or {})


def states(engine: HealthEngine) -> dict[str, str]:
    return {n: item["state"] for n, item in engine.snapshot()["nodes"].items()}


def test_hysteresis_holds_the_state_for_clean_for_then_releases() -> None:
    engine = HealthEngine(POLICY)
    engine.update(observe(signal("e01", "Hot")), now=100)
    assert states(engine)["e01"] == "degraded"
    engine.update(observe(), now=110)  # clean from now on
    assert states(engine)["e01"] == "degraded"
    assert "last_seen" in engine.snapshot()["nodes"]["e01"]["reasons"][0]
    engine.update(observe(), now=159)
    assert states(engine)["e01"] == "degraded"
    engine.update(observe(), now=161)  # 61 s after it was last seen
    assert states(engine)["e01"] == "healthy"


def test_a_flapping_signal_never_returns_the_node_in_between() -> None:
    engine = HealthEngine(POLICY)
    for t in range(0, 300, 50):  # present every other refresh, 25 s apart
        engine.update(observe(signal("e02", "Hot")) if t % 100 == 0 else observe(), now=t)
        assert states(engine)["e02"] == "degraded"
    assert [e["to"] for e in engine.events if e["node"] == "e02"] == ["degraded"]


def test_ignored_signals_and_confirm_for() -> None:
    policy = Policy(signals=POLICY.signals, confirm_for_s=30, breaker=POLICY.breaker)
    engine = HealthEngine(policy)
    engine.update(observe(signal("e03", "Noise"), signal("e04", "Hot", since=100)), now=110)
    assert states(engine)["e03"] == "healthy" and states(engine)["e04"] == "healthy"
    engine.update(observe(signal("e04", "Hot", since=100)), now=131)
    assert states(engine)["e04"] == "degraded"


def test_auto_drain_follows_the_scheduler_from_draining_to_drained_to_repair() -> None:
    engine = HealthEngine(POLICY)
    busy = {"e05": SchedulerView(("ALLOCATED",), "", busy=True)}
    engine.update(observe(signal("e05", "RMA"), scheduler=busy), now=0)
    assert states(engine)["e05"] == "draining"
    [drain] = engine.drain_list()
    assert {k: v for k, v in drain.items() if k != "evidence"} == {
        "node": "e05",
        "state": "draining",
        "origin": "auto",
        "reason": "fleetsight: RMA (alertmanager)",
    }
    assert [(e["signal"], e["source"], e["effect"]) for e in drain["evidence"]] == [
        ("RMA", "alertmanager", "repair")
    ]  # the drain names the evidence that allowed it
    applied = {"e05": SchedulerView(("IDLE", "DRAIN"), "fleetsight: RMA (alertmanager)")}
    engine.update(observe(signal("e05", "RMA"), scheduler=applied), now=10)
    assert states(engine)["e05"] == "repair"


def test_an_operators_drain_in_the_scheduler_is_shown_not_owned() -> None:
    engine = HealthEngine(POLICY)
    view = {"e06": SchedulerView(("IDLE", "DRAIN"), "bad DIMM")}
    engine.update(observe(scheduler=view), now=0)
    item = engine.snapshot()["nodes"]["e06"]
    assert item["state"] == "drained" and item["reasons"][0]["signal"] == "scheduler_drain"
    assert engine.drain_list() == []


def test_a_node_an_operator_drained_gets_no_automatic_drain_when_it_fails() -> None:
    engine = HealthEngine(POLICY)
    operator = {"e01": SchedulerView(states=("DOWN", "DRAIN"), reason="bad DIMM, ticket 42")}
    engine.update(observe(signal("e01", "XidBad"), scheduler=operator), now=0)
    assert not engine.grants and not engine.drain_list()  # nothing of the breaker's allowance used
    assert states(engine)["e01"] == "drained"
    engine.update(observe(signal("e02", "XidBad"), signal("e01", "XidBad"), scheduler=operator), now=10)
    assert [d["node"] for d in engine.drain_list()] == ["e02"]


def test_the_breaker_counts_drains_in_its_window_per_unit() -> None:
    engine = HealthEngine(POLICY)  # units of 4: at most 2 per unit, 4 in the cluster, per 600 s
    engine.update(observe(signal("e01", "XidBad")), now=0)
    engine.update(observe(signal("e01", "XidBad"), signal("e02", "XidBad")), now=10)
    engine.update(observe(*(signal(n, "XidBad") for n in ("e01", "e02", "e03"))), now=20)
    assert [states(engine)[n] for n in ("e01", "e02", "e03")] == ["draining", "draining", "unhealthy"]
    assert engine.breaker["open"] and engine.breaker["held"] == ["e03"]
    assert engine.snapshot()["nodes"]["e03"]["reasons"][0]["signal"] == "circuit_breaker"
    # once the first drains leave the window, the held node may go
    engine.update(observe(*(signal(n, "XidBad") for n in ("e01", "e02", "e03"))), now=615)
    assert states(engine)["e03"] == "draining" and not engine.breaker["open"]


def test_overrides_expire_and_failures_feed_the_mtbf(tmp_path: Path) -> None:
    engine = HealthEngine(
        Policy(signals=POLICY.signals, clean_for_s=0, min_failures=2, breaker=POLICY.breaker)
    )
    engine.set_override("e07", "repair", "fan swap", "ops", now=0, ttl=100)
    engine.update(observe(), now=0)
    assert states(engine)["e07"] == "repair"
    engine.update(observe(), now=101)
    assert states(engine)["e07"] == "healthy"
    assert engine.failures == 0  # an operator's action is not a failure
    assert engine.node_mtbf()[1] == "prior"
    for start in (200, 400):
        engine.update(observe(signal("e08", "XidBad")), now=start)
        engine.update(observe(), now=start + 10)
    assert engine.failures == 2
    mtbf, basis = engine.node_mtbf()
    assert basis == "measured" and mtbf == pytest.approx(engine.observed_node_seconds / 2)
    with pytest.raises(ValueError, match="not one of"):
        engine.set_override("e07", "broken", "x", "ops", now=0, ttl=None)


def test_drains_overrides_and_history_survive_a_restart(tmp_path: Path) -> None:
    engine = HealthEngine(POLICY, tmp_path)
    engine.update(observe(signal("e01", "XidBad")), now=0)
    engine.set_override("e06", "draining", "reseat cables", "ops", now=0, ttl=None)
    engine.update(observe(signal("e01", "XidBad")), now=1)
    engine.save()
    again = HealthEngine(POLICY, tmp_path)
    again.update(observe(signal("e01", "XidBad")), now=2)
    assert {d["node"]: d["origin"] for d in again.drain_list()} == {"e01": "auto", "e06": "operator"}
    assert len(again.grants) == 1 and again.events and again.next_event_id == engine.next_event_id


def test_a_quiet_fleet_is_still_listed_after_a_restart(tmp_path: Path) -> None:
    # restored from the state file and then unchanged: every node must still be in the snapshot the API
    # serves (a partial update listed none of them, so every prolog saw an unknown node after a restart)
    engine = HealthEngine(POLICY, tmp_path)
    engine.update(observe(), now=0)
    engine.save()
    again = HealthEngine(POLICY, tmp_path)
    again.set_inventory(dict(NODES))  # the service's sweep: the inventory, then the nodes events named
    assert again.process(now=5) == []  # nothing changed...
    assert states(again) == states(engine) and len(states(again)) == len(NODES)  # ...and all listed


def test_held_reasons_survive_a_restart_inside_clean_for(tmp_path: Path) -> None:
    engine = HealthEngine(POLICY, tmp_path)
    engine.update(observe(signal("e02", "XidBad")), now=0)
    engine.update(observe(), now=10)  # the alert is gone; held until 10 + 60
    engine.save()
    again = HealthEngine(POLICY, tmp_path)
    again.update(observe(), now=20)
    node = again.snapshot()["nodes"]["e02"]
    assert node["state"] == "draining" and node["reasons"][0]["signal"] == "XidBad"
    assert node["reasons"][0]["last_seen"]
    assert [d["node"] for d in again.drain_list()] == ["e02"]
    again.update(observe(), now=71)  # clean_for has passed since it was last seen
    assert again.snapshot()["nodes"]["e02"]["state"] == "healthy" and not again.drain_list()


def test_policy_errors_name_the_key(tmp_path: Path) -> None:
    assert load().signals["GPUFellOffBus"] == "repair"
    for raw, message in (
        ({"signals": {"X": "sick"}}, "signals.X"),
        ({"hysteresis": {"clean_for": "soon"}}, "hysteresis.clean_for"),
        ({"circuit_breaker": {"max_unit_fraction": 2}}, "circuit_breaker.max_unit_fraction"),
        ({"preflight": {"fail": "maybe"}}, "preflight.fail"),
    ):
        with pytest.raises(PolicyError, match=message):
            from_dict(raw)
    bad = tmp_path / "p.yml"
    bad.write_text("signals: [unclosed")
    with pytest.raises(PolicyError, match="not valid YAML"):
        load(bad)


def test_a_refined_cause_updates_the_reason_in_place() -> None:
    """The anomaly service refines a flag's cause while it stands (unknown -> thermal): the node keeps one
    reason for that flag, now naming the new cause, not one reason per cause it was ever given."""

    def straggler(cause: str) -> Signal:
        labels = {"hpc_job": "4101", "cause": cause}
        return Signal("e05", "straggler", "anomaly", 0.0, "degraded", evidence={"labels": labels})

    engine = HealthEngine(POLICY)
    engine.update(observe(straggler("unknown")), now=100)
    engine.update(observe(straggler("thermal")), now=105)
    reasons = engine.snapshot()["nodes"]["e05"]["reasons"]
    assert [r["signal"] for r in reasons] == ["straggler"]
    assert reasons[0]["evidence"]["labels"]["cause"] == "thermal"
    # another job's flag on the same node is another reason
    other = Signal("e05", "straggler", "anomaly", 0.0, "degraded", evidence={"labels": {"hpc_job": "4102"}})
    engine.update(observe(straggler("thermal"), other), now=110)
    assert len(engine.snapshot()["nodes"]["e05"]["reasons"]) == 2


def test_every_signal_of_the_shipped_policy_has_a_runbook_that_exists() -> None:
    """Every runbook the health service hands out resolves to a file, aliases (straggler) included."""
    repo = Path(__file__).resolve().parents[2]
    policy = load()
    missing = {s: policy.runbook(s) for s in policy.signals if not (repo / policy.runbook(s)).is_file()}
    assert not missing, f"signals whose runbook does not exist: {missing}"
    assert policy.runbook("straggler") == "docs/runbooks/StragglerNode.md"


# ------------------------------------------------------------------------------ events (issue 37)
def test_events_re_decide_only_the_nodes_they_name_and_hold_a_cleared_signal() -> None:
    engine = HealthEngine(POLICY)
    engine.update(observe(), now=0)
    engine.set_signal(signal("e02", "XidBad"), now=10)
    [change] = engine.process(now=10)
    assert (change["node"], change["to"]) == ("e02", "draining")
    assert engine.changed == {"e02"}  # not the fleet
    assert engine.process(now=15) == [] and engine.changed == set()  # a quiet tick decides nothing
    engine.clear_signal("e02", signal("e02", "XidBad").key, now=20)
    assert engine.process(now=70) == []  # held for clean_for (60 s) from the clear
    assert engine.snapshot()["nodes"]["e02"]["reasons"][0]["last_seen"]
    [back] = engine.process(now=81)
    assert (back["node"], back["to"]) == ("e02", "healthy")


def test_a_sweep_repairs_and_counts_but_leaves_what_an_event_set_after_its_read() -> None:
    engine = HealthEngine(POLICY)
    engine.update(observe(), now=0)
    engine.set_signal(signal("e01", "Hot"), now=5)  # an event the sweep's read (at 4) predates
    lost = signal("e03", "XidBad")  # firing, but its event never came
    added, removed = engine.replace_source({"alertmanager"}, [lost], now=10, quiet_since=4)
    assert (added, removed) == (1, 0)  # e01 is newer than the read: left alone
    engine.process(now=10)
    assert states(engine)["e03"] == "draining" and states(engine)["e01"] == "degraded"
    added, removed = engine.replace_source({"alertmanager"}, [lost], now=20, quiet_since=12)
    assert (added, removed) == (0, 1)  # now the sweep has seen past e01's event: it is gone
    assert engine.replace_source({"scheduler"}, [], now=20) == (0, 0)  # another source: untouched


def test_a_scheduler_view_that_changes_re_decides_its_node_only() -> None:
    engine = HealthEngine(POLICY)
    engine.update(observe(), now=0)
    engine.set_signal(signal("e05", "RMA"), now=1)
    engine.process(now=1)
    assert engine.awaiting_scheduler()  # draining: the scheduler is read every tick
    engine.set_scheduler({"e05": SchedulerView(("IDLE", "DRAIN"), "fleetsight: RMA", busy=False)})
    engine.process(now=2)
    assert engine.changed == {"e05"} and states(engine)["e05"] == "repair"
    assert not engine.awaiting_scheduler()


# ------------------------------------------------------------------------------ blind is not broken
BLIND_POLICY = load()  # the shipped policy (health/policy.yml), as deployed


def blind_signal(node: str, name: str, **labels: str) -> Signal:
    return Signal(node, name, "alertmanager", 0.0, BLIND_POLICY.effect(name), evidence={"labels": labels})


def test_a_blind_spot_never_drains_and_is_shown_beside_the_state() -> None:
    """Issue 41: a check that could not look (FleetSightBlind) and a silent exporter (ExporterDown) keep
    the node fit; the node's item lists them as blind spots, not as reasons; a node whose dcgm-exporter
    is silent is `unobserved`; a real fault on another node in the same observation still drains."""
    engine = HealthEngine(BLIND_POLICY)
    nodes = {f"b{i:02d}": "u1" for i in range(1, 21)}
    seen = [
        blind_signal("b01", "FleetSightBlind", check="row_remap", reason="unreachable"),
        blind_signal("b02", "ExporterDown", job="dcgm"),
        blind_signal("b03", "ExporterDown", job="node"),
        blind_signal("b04", "PSUFailed", psu="1"),
    ]
    engine.update(Observation(nodes=nodes, signals=seen), now=100)
    items = engine.snapshot()["nodes"]
    assert items["b01"]["state"] == "healthy" and items["b01"]["fit"]
    assert [r["signal"] for r in items["b01"]["blind_spots"]] == ["FleetSightBlind"]
    assert items["b01"]["reasons"] == []
    assert items["b02"]["state"] == "unobserved" and items["b02"]["fit"]  # no GPU signal at all
    assert items["b03"]["state"] == "healthy"  # node_exporter silent: the GPUs are still seen
    assert items["b04"]["state"] == "draining" and not items["b04"]["fit"]
    [drain] = engine.drain_list()
    assert drain["node"] == "b04" and drain["reason"] == "fleetsight: PSUFailed (alertmanager)"
    assert [(e["signal"], e["effect"], e["labels"]) for e in drain["evidence"]] == [
        ("PSUFailed", "repair", {"psu": "1"})
    ]
    assert engine.failures == 1  # only the real fault counts towards the MTBF
    engine.update(Observation(nodes=nodes, signals=seen[2:]), now=200)  # the exporter answers again
    items = engine.snapshot()["nodes"]
    assert items["b02"]["state"] == "healthy" and items["b02"]["blind_spots"] == []


def test_an_operator_cannot_declare_a_node_unobserved() -> None:
    engine = HealthEngine(BLIND_POLICY)
    with pytest.raises(ValueError, match="not one of healthy, degraded"):
        engine.set_override("b01", "unobserved", "why not", "op", now=0, ttl=60)


def test_the_unobserved_list_is_validated() -> None:
    with pytest.raises(PolicyError, match="unobserved: expected a list"):
        from_dict({"unobserved": ["ExporterDown"]})
    policy = from_dict({"unobserved": [{"signal": "TelemetrySilent", "source": "dcgm-exporter"}]})
    assert policy.leaves_unobserved("TelemetrySilent", {"source": "dcgm-exporter", "node": "x"})
    assert not policy.leaves_unobserved("TelemetrySilent", {"source": "bmc"})


def test_an_unknown_result_neither_resumes_nor_fails_a_validation() -> None:
    """The gate (health/validation.py) with the checks service's answers set directly: an unknown after
    the repair keeps the node `validating` (listed under `unknown`), a pass resumes it; a result from a
    checks service older than outcomes (`passed` alone) still counts."""
    from health.validation import ValidationGate

    gate = ValidationGate(None)
    gate.policy = {"after": {"PSUFailed": ["dcgm_diag_r3"]}, "default": []}
    assert not gate.may_release("b04", "PSUFailed (alertmanager)", now=100)
    blind = {"node": "b04", "check": "dcgm_diag_r3", "outcome": "unknown", "reason": "tool_missing"}
    gate.results[("b04", "dcgm_diag_r3")] = {**blind, "passed": None, "summary": "no dcgmi", "finished": 150}
    assert not gate.may_release("b04", "PSUFailed (alertmanager)", now=160)
    entry = gate.nodes["b04"]
    assert entry.phase == "validating" and entry.failed == [] and entry.missing == ["dcgm_diag_r3"]
    assert entry.unknown == [
        {"check": "dcgm_diag_r3", "summary": "no dcgmi", "finished": 150, "reason": "tool_missing"}
    ]
    old_style = {"node": "b04", "check": "dcgm_diag_r3", "passed": True, "summary": "ok", "finished": 170}
    gate.results[("b04", "dcgm_diag_r3")] = old_style
    assert gate.may_release("b04", "PSUFailed (alertmanager)", now=180)
    assert gate.nodes["b04"].phase == "resumed" and gate.nodes["b04"].unknown == []
