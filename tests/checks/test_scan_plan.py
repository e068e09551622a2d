"""The scan plan's decisions (checks/scan.py over checks/plan.py), stated exactly: never-scanned first
then the oldest scan, idle nodes only, after validation work, within the scan's own budget and the leaf
rule; an unknown is no scan and is retried later; the shipped policy's scan is valid. Then the plan over
a simulated busy cluster (tests/scan_sim.py, bench/scan_coverage.py): with enough idle time every node is
scanned within every_days, and a node that is never idle, or whose tool is missing, is reported overdue
with that reason."""

from __future__ import annotations

import pytest
from scan_sim import SimConfig, simulate

from checks.catalog import load_catalog
from checks.plan import Unit, plan
from checks.scan import DAY, NodeScan, ScanPolicy, ScanPolicyError, coverage, load_scans, report, wanted
from checks.service import load_policy, validate_policy

CHECK = "dcgm_diag_r4"
POLICY = ScanPolicy("memory", CHECK, every_days=30, rescan_after_days=20, budget=2, retry_blind_hours=24)
NOW = 100 * DAY
LEAVES = {n: frozenset({f"leaf-{n[-1]}"}) for n in ("a1", "b2", "c3", "d4", "e1")}


def states(**last: float | None) -> dict[str, NodeScan]:
    return {node: NodeScan(node, first_seen=0.0, last=value) for node, value in last.items()}


def test_the_shipped_policy_scans_memory_with_level_4_every_30_days() -> None:
    catalog = load_catalog()
    policy = load_policy()
    validate_policy(policy, catalog)
    scan = load_scans(policy["scans"], catalog)["memory"]
    assert (scan.check, scan.every_days) == ("dcgm_diag_r4", 30.0)
    assert catalog[scan.check].intrusive and "memtest" in catalog[scan.check].summary


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ({"m": {"check": "memtest", "every_days": 30}}, "scan m: check 'memtest' is not in the catalogue"),
        ({"m": {"check": CHECK, "every_days": 0}}, "scan m: every_days must be a positive number"),
        ({"m": {"check": CHECK, "every_days": 7, "rescan_after_days": 9}}, "must not exceed every_days"),
        ({"m": {"check": CHECK, "every_days": 7, "budget": 0}}, "budget must be a whole number of nodes"),
        ({"m": [CHECK]}, "scan m: must be a mapping"),
        ({"m": {"check": "ib_pair_bandwidth", "every_days": 7}}, "runs on two nodes; a scan takes one"),
    ],
)
def test_a_malformed_scan_is_refused_naming_the_scan_and_key(raw: dict, why: str) -> None:
    with pytest.raises(ScanPolicyError, match=why):
        load_scans(raw, load_catalog())


def test_never_scanned_first_then_the_oldest_and_recent_ones_wait() -> None:
    nodes = states(a1=NOW - 25 * DAY, b2=None, c3=NOW - 40 * DAY, d4=NOW - 2 * DAY)
    offered, held = wanted(POLICY, nodes, running=set(), now=NOW)
    assert [u.nodes[0] for u in offered] == ["b2", "c3", "a1"]
    assert held == {"d4": "not_due"}
    _, held = wanted(POLICY, nodes, running={"c3"}, now=NOW)
    assert held["c3"] == "running"


def test_an_unknown_is_no_scan_and_is_retried_after_retry_blind_hours() -> None:
    nodes = states(a1=NOW - 40 * DAY)
    nodes["a1"].blind_at, nodes["a1"].blind_reason = NOW - 3600, "tool_missing"
    offered, held = wanted(POLICY, nodes, set(), NOW)
    assert offered == [] and held == {"a1": "tool_missing"}
    assert coverage(POLICY, nodes, NOW).overdue == ["a1"]  # the unknown did not count as a scan
    offered, _ = wanted(POLICY, nodes, set(), NOW + 24 * 3600)
    assert [u.nodes for u in offered] == [("a1",)]


def test_idle_nodes_oldest_first_after_validation_within_the_scan_budget() -> None:
    nodes = states(a1=None, b2=NOW - 30 * DAY, c3=NOW - 35 * DAY, d4=NOW - 22 * DAY, e1=None)
    offered, held = wanted(POLICY, nodes, set(), NOW)
    validation = Unit("dcgm_diag_r3", ("d4",), validation=True)
    idle = {"b2", "c3", "d4", "e1"}  # a1 runs a job
    decision = plan([*offered, validation], idle, [], LEAVES, budget=8, caps={CHECK: POLICY.budget})
    assert [u.nodes[0] for u in decision.start] == ["d4", "e1", "c3"]  # validation, never scanned, oldest
    waiting = {u.nodes[0]: why for u, why in decision.waiting.items()}
    assert waiting == {
        "a1": "not idle: a1",
        "b2": f"scan budget: 2 of 2 {CHECK} under way",
        "d4": "already under test: d4",  # its validation check took it this pass
    }
    rows = report(POLICY, decision, held)
    assert rows["a1"]["state"] == "not_idle" and rows["b2"]["state"] == "scan_budget"
    assert rows["e1"]["state"] == "started" and rows["d4"]["state"] == "under_test"
    # one per leaf: e1 and a1 share leaf-1, so with a1 idle too the never-scanned a1 goes, e1 waits
    decision = plan(offered, idle | {"a1"}, [], LEAVES, budget=8, caps={CHECK: 4})
    assert {u.nodes[0]: w for u, w in decision.waiting.items()}["e1"] == "leaf busy: leaf-1"


def test_with_enough_idle_time_every_node_is_scanned_within_every_days() -> None:
    result = simulate(SimConfig(nodes=64, days=45, utilisation=0.9))
    assert result.late == [] and result.overdue == {}
    assert result.max_gap_days <= 30
    assert result.days_to_full is not None and result.days_to_full < 30
    assert len(result.first_scan_order) == 64


def test_a_node_never_idle_or_without_the_tool_is_reported_overdue_with_why() -> None:
    config = SimConfig(nodes=64, days=45, never_idle=("n0003",), blind=("n0007",))
    result = simulate(config)
    assert result.overdue == {"n0003": "not idle: n0003", "n0007": "tool_missing"}
    assert result.late == ["n0003", "n0007"]  # every other node made it
    assert result.days_to_full is None


def test_a_scan_budget_too_small_for_the_fleet_leaves_nodes_late() -> None:
    """The simulation can fail: 64 nodes, one 12-hour scan at a time, cannot all fit into 20 days."""
    result = simulate(SimConfig(nodes=64, days=45, every_days=20, rescan_after_days=10, scan_budget=1,
                                scan_hours=12.0))  # fmt: skip
    assert result.late and result.max_gap_days > 20
