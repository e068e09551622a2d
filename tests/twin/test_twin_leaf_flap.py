"""The `leaf_flap` fault (case_13): every port of one leaf switch goes down and up together, as the hosts
cabled to it (sysfs counters and state, kernel log) and UFM (its port list and events) both see it;
no other leaf, host or rail is touched."""

from __future__ import annotations

import datetime as dt

from twin import hardware as hw
from twin import render
from twin.fault_kinds import FAULT_KINDS
from twin.scenario import SHIPPED_DIR, load
from twin.sim import Simulation

LEAF = "leaf-su01-rail3"
BEHIND = ["n0001", "n0002", "n0003", "n0004"]
RAIL = 3


def down_switch_ports(sim: Simulation) -> set[tuple[str, str]]:
    """(switch, port) of every switch port UFM lists as Down."""
    return {
        (p["system_name"], p["dname"])
        for p in render.ufm_ports(sim)
        if p["description"] == "Switch IB Port" and p["logical_state"] == "Down"
    }


def test_a_leaf_flap_takes_every_port_of_that_leaf_down_and_no_other() -> None:
    scenario = load(SHIPPED_DIR / "case_13.yaml")
    sim = Simulation(scenario, dt.datetime(2026, 11, 21, 11, 0, tzinfo=dt.UTC))
    [fault] = [f for f in sim.faults if f.spec.kind == "leaf_flap"]
    seen_down: list[set[tuple[str, str]]] = []
    while sim.t < scenario.duration:
        sim.advance()
        if fault.state.get("down"):
            seen_down.append(down_switch_ports(sim))
    # Each time the leaf was down, UFM listed exactly its four host-facing ports as Down.
    expected = {(LEAF, str(sim.topology.leaf(sim.nodes.index(n), RAIL)[1])) for n in BEHIND}
    assert seen_down and all(ports == expected for ports in seen_down), seen_down
    assert not down_switch_ports(sim), "the leaf is back up when the fault ends"
    flaps = int(fault.spec.magnitude)
    for i, node in enumerate(sim.nodes):
        downed = [int(v) for v in sim.ib_counters["link_downed"][i]]
        behind = node in BEHIND
        assert downed == [flaps if (behind and p == RAIL) else 0 for p in range(len(hw.IB_DEVICES))], node
    events = [e for e in sim.ufm_events if f"({LEAF}:" in e["description"]]
    assert len(events) == 2 * flaps * len(BEHIND) and len(events) == len(sim.ufm_events)
    assert fault.truth is not None and fault.truth["nodes"] == BEHIND


def test_leaf_flap_is_never_drawn_at_random() -> None:
    # Seeded scenarios draw from FAULT_KINDS: adding a switch kind there would change every one of them.
    assert "leaf_flap" not in FAULT_KINDS
