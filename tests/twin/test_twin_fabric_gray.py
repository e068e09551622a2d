"""The fabric's gray failures in the twin (twin/fabric_gray_faults.py): each kind's signature, checked on
the simulation's state tick by tick and on what the host's sysfs and UFM would show. One short scenario,
simulated in-process, carries all four kinds on different nodes and rails."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import numpy as np
import pytest

from twin import hardware as hw
from twin import render
from twin.fabric_gray_faults import HEALTHY_BER
from twin.fault_kinds import ALL_KINDS, FABRIC_GRAY_KINDS, FABRIC_NOT_HARDWARE_KINDS, FAULT_KINDS
from twin.scenario import ScenarioError, from_dict
from twin.sim import Simulation
from twin.sysfs_tree import ib_rate_text

START = dt.datetime(2026, 11, 22, 9, 0, tzinfo=dt.UTC)


def fault(kind: str, node: str, port: str, onset: str, duration: str, magnitude: float | None = None, **more):
    """One fault of the scenario: ``more`` are extra target keys."""
    spec = {
        "kind": kind,
        "target": {"node": node, "port": port, **more},
        "onset": onset,
        "duration": duration,
    }
    return spec if magnitude is None else {**spec, "magnitude": magnitude}


RAW = {
    "name": "gray-format",
    "seed": 77,
    "start": "2026-11-22T09:00:00Z",
    "duration": "40m",
    "tick": "5s",
    "cluster": {"name": "fmt", "nodes": 8},
    "jobs": [{"id": "77", "name": "llm", "nodes": 8, "profile": "llm-70b", "checkpoint_interval": "2h"}],
    "faults": [
        fault("ib_flash_cut", "n0002", "mlx5_1", "5m", "10m", magnitude=4),
        fault("ib_lane_downshift", "n0003", "mlx5_2", "5m", "15m", magnitude=2),
        fault("ib_lane_downshift", "n0005", "mlx5_5", "5m", "15m", magnitude=4, speed="HDR"),
        fault("ib_congestion", "n0006", "mlx5_4", "5m", "15m", magnitude=1.5),
        fault("ib_degrading_link", "n0004", "mlx5_3", "2m", "32m"),
    ],
    "realism": "off",
}  # fmt: skip


@pytest.fixture(scope="module")
def run() -> Iterator[dict]:
    """The simulation, advanced to its end, with what was seen at every tick."""
    scenario = from_dict(RAW)
    sim = Simulation(scenario, START)
    seen: dict[str, list] = {
        "up": [],
        "width": [],
        "speed": [],
        "symbols": [],
        "step": [],
        "ufm": [],
        "attempt": [],
    }
    while sim.t < scenario.duration:
        sim.advance()
        seen["up"].append(sim.ib_up.copy())
        seen["width"].append(sim.ib_width.copy())
        seen["speed"].append(sim.ib_speed.copy())
        seen["symbols"].append(int(sim.ib_counters["symbol_error"][3, 3]))
        seen["step"].append((sim.t, sim.jobs[0].step_time, sim.jobs[0].nominal_step_time))
        seen["attempt"].append((sim.t, sim.jobs[0].attempt, sim.jobs[0].state))
        if 600 <= sim.t < 605:
            seen["ufm"] = render.ufm_ports(sim)
    sim.refresh_truth()
    yield {"sim": sim, "seen": seen, "truth": {line["kind"] + str(line["target"].get("node")): line
                                               for line in sim.truth_lines}}  # fmt: skip


def test_the_kinds_are_catalogued_apart_from_the_drawn_ones() -> None:
    for kind in (*FABRIC_GRAY_KINDS, *FABRIC_NOT_HARDWARE_KINDS):
        assert kind in ALL_KINDS and kind not in FAULT_KINDS


def test_a_flash_cut_moves_the_counters_and_logs_its_times_but_no_tick_sees_the_port_down(run: dict) -> None:
    sim, truth = run["sim"], run["truth"]["ib_flash_cutn0002"]
    assert all(up[1, 1] for up in run["seen"]["up"]), "a flash cut is never seen down"
    assert int(sim.ib_counters["link_downed"][1, 1]) == 4
    assert int(sim.ib_counters["link_error_recovery"][1, 1]) == 4
    cuts = truth["cuts"]
    assert len(cuts) == 4 and all(0.005 <= length < 0.8 for _, length in cuts)
    assert all(truth["onset_unix"] <= at <= truth["end_unix"] for at, _ in cuts)
    events = [e for e in sim.ufm_events if f"(n0002:{hw.IB_DEVICES[1]}:1)" in e["description"]]
    assert [e["name"] for e in events] == ["Link went down", "Link went up"] * 4
    during = {(attempt, state) for t, attempt, state in run["seen"]["attempt"] if 240 <= t <= 960}
    assert truth["job_failed"] is False and len(during) == 1, "a sub-second cut kills no job"


def test_a_downshift_reads_as_the_kernel_and_ufm_write_it_and_slows_the_job(run: dict) -> None:
    seen = run["seen"]
    during = [i for i, (t, _, _) in enumerate(seen["step"]) if 400 <= t < 1150]
    assert all(seen["width"][i][2, 2] == 2 and seen["speed"][i][4, 5] == 50 for i in during)
    assert ib_rate_text(2, 100) == "200 Gb/sec (2X NDR)" and ib_rate_text(4, 50) == "200 Gb/sec (4X HDR)"
    ports = {(p["system_name"], p["dname"]): p for p in seen["ufm"]}
    assert ports[("n0003", "mlx5_2/1")]["active_width"] == "2x"
    assert ports[("n0005", "mlx5_5/1")]["active_speed"] == "HDR"
    assert ports[("n0005", "mlx5_5/1")]["enabled_speed"][-1] == "NDR"
    slow = [step / nominal for t, step, nominal in seen["step"] if 600 <= t < 1100 and nominal]
    assert min(slow) > 1.05, "the job's collectives run at the downshifted rail's pace"
    assert seen["width"][-1][2, 2] == 4 and seen["speed"][-1][4, 5] == 100, "back at full rate after"


def test_a_degrading_link_climbs_exponentially_and_fails_at_the_fault_end(run: dict) -> None:
    sim, seen, truth = run["sim"], run["seen"], run["truth"]["ib_degrading_linkn0004"]
    symbols = np.array(seen["symbols"])
    ticks = len(symbols)
    quarters = [int(symbols[min(ticks - 1, (q + 1) * 24 * 12 // 4 + 24)] - symbols[q * 24 * 12 // 4 + 24])
                for q in range(4)]  # fmt: skip
    assert quarters[0] < quarters[1] < quarters[2] < quarters[3], quarters
    assert quarters[3] > 20 * max(quarters[0], 1), "orders of magnitude over the fault"
    assert int(sim.ib_counters["link_error_recovery"][3, 3]) > 0
    up_at_end = [up[3, 3] for (t, _, _), up in zip(seen["step"], seen["up"], strict=True)]
    end = truth["end_unix"] - START.timestamp()
    assert all(up_at_end[i] for i, (t, _, _) in enumerate(seen["step"]) if t < end)
    assert not up_at_end[-1], "the link is down after the fault's end"
    assert sim.degrading_ber(sim.faults[0].spec, 0.0) == pytest.approx(HEALTHY_BER)


def test_congestion_makes_the_leafs_hosts_wait_with_no_error_and_is_not_the_hardware(run: dict) -> None:
    sim, truth = run["sim"], run["truth"]["ib_congestionn0006"]
    assert truth["hardware"] is False
    leaf = sim.topology.leaf(5, 4)[0]
    behind = [i for i in range(len(sim.nodes)) if sim.topology.leaf(i, 4)[0] == leaf]
    assert truth["nodes"] == [sim.nodes[i] for i in behind]
    waits = sim.ib_counters["port_xmit_wait"].astype(float)
    assert all(waits[i, 4] > 1.1 * waits[i, 6] for i in behind), "the congested rail waits most"
    assert all(int(sim.ib_counters["link_downed"][i, 4]) == 0 for i in behind)
    assert all(int(sim.ib_counters["symbol_error"][i, 4]) == 0 for i in behind)


def test_bad_targets_are_refused_with_the_reason() -> None:
    raw = {**RAW, "faults": [{"kind": "ib_lane_downshift", "target": {"node": "n0001"}, "onset": "1m",
                              "magnitude": 3}]}  # fmt: skip
    sim = Simulation(from_dict(raw), START)
    with pytest.raises(ValueError, match="width of 1, 2 or 4"):
        while sim.t < 120:
            sim.advance()
    with pytest.raises(ScenarioError):
        from_dict({**RAW, "faults": [{"kind": "ib_flash_cut", "target": {"node": "n0001", "lane": 2}}]})
