"""Which intrusive work may start now: idle nodes only, never two on one fabric leaf, at most
``budget`` nodes of the cluster under test; and the pair schedule of the InfiniBand check.

Pure decisions over what the scheduler said (idle or not) and the node -> leaf map, so the Slurm and the
Kubernetes runners share them and the tests can state them exactly."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml


@dataclass(frozen=True)
class Unit:
    """One piece of intrusive work: a check on one node, or the pair check on two."""

    check: str
    nodes: tuple[str, ...]
    validation: bool = False  # asked for by the health service's validation gate: goes first
    # order among units of equal standing, lowest first: a scan's last completed run (checks/scan.py),
    # so the longest-unscanned node goes first; not part of the unit's identity
    rank: float = field(default=0.0, compare=False)


@dataclass
class Decision:
    start: list[Unit] = field(default_factory=list)
    waiting: dict[Unit, str] = field(default_factory=dict)  # unit -> why not now


def load_leaf_map(path: Path) -> dict[str, frozenset[str]]:
    """``node: leaf`` or ``node: [leaf, ...]`` (a rail-optimised node reaches one leaf per rail)."""
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping node -> leaf or list of leaves")
    leaves = {}
    for node, value in raw.items():
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise ValueError(f"{path}: node {node}: expected a leaf name or a list of them")
        leaves[str(node)] = frozenset(names)
    return leaves


def leaves_of(nodes: Iterable[str], leaf_map: Mapping[str, frozenset[str]]) -> frozenset[str]:
    # a node the map does not know is its own leaf: it conflicts with nothing but itself
    return frozenset().union(*(leaf_map.get(n, frozenset({f"unknown:{n}"})) for n in nodes))


def plan(
    wanted: list[Unit],
    idle: set[str],
    running: list[Unit],
    leaf_map: Mapping[str, frozenset[str]],
    budget: int,
    unit_size: Mapping[str, int] | None = None,
    caps: Mapping[str, int] | None = None,
) -> Decision:
    """Greedy, validation first, then pairs: a unit starts when all its nodes are idle and not under test, its
    leaves are free, and the budget of nodes under test allows it. ``caps``: at most so many units of a
    check not asked for by validation at once (a scan plan's own budget, checks/scan.py)."""
    decision = Decision()
    busy_nodes = {n for unit in running for n in unit.nodes}
    busy_leaves = set(leaves_of(busy_nodes, leaf_map))
    under_test = len(busy_nodes)
    capped = {check: sum(1 for u in running if u.check == check) for check in caps or {}}
    # validation first; then pairs, which need two free nodes and leaves at once and would starve
    # behind single-node work that keeps taking one of them
    for unit in sorted(wanted, key=lambda u: (not u.validation, -len(u.nodes), u.rank, u.nodes, u.check)):
        why = _why_not(unit, idle, busy_nodes, busy_leaves, leaf_map, unit_size or {})
        cap = (caps or {}).get(unit.check)
        if why is None and cap is not None and not unit.validation and capped[unit.check] >= cap:
            why = f"scan budget: {capped[unit.check]} of {cap} {unit.check} under way"
        if why is None and under_test + len(unit.nodes) > budget:
            why = f"budget: {under_test} of {budget} nodes under test"
        if why is not None:
            decision.waiting[unit] = why
            continue
        decision.start.append(unit)
        if unit.check in capped and not unit.validation:
            capped[unit.check] += 1
        busy_nodes.update(unit.nodes)
        busy_leaves.update(leaves_of(unit.nodes, leaf_map))
        under_test += len(unit.nodes)
    return decision


def _why_not(
    unit: Unit,
    idle: set[str],
    busy_nodes: set[str],
    busy_leaves: set[str],
    leaf_map: Mapping[str, frozenset[str]],
    unit_size: Mapping[str, int],
) -> str | None:
    if len(unit.nodes) < unit_size.get(unit.check, 1):
        return "no partner: no healthy idle node to pair with"
    not_idle = [n for n in unit.nodes if n not in idle]
    if not_idle:
        return f"not idle: {', '.join(not_idle)}"
    testing = [n for n in unit.nodes if n in busy_nodes]
    if testing:
        return f"already under test: {', '.join(testing)}"
    shared = sorted(leaves_of(unit.nodes, leaf_map) & busy_leaves)
    if shared:
        return f"leaf busy: {shared[0]}"
    return None


def with_partners(
    wanted: list[Unit],
    pair_checks: set[str],
    healthy_idle: set[str],
    leaf_map: Mapping[str, frozenset[str]],
) -> list[Unit]:
    """A pair check asked for on one node (a validation after an InfiniBand fault) gets a partner: a
    healthy idle node, preferring one that holds no leaf beyond the node's own (a pair holds the leaves
    of both nodes). A unit with no partner to be had keeps one node and waits (``no partner``)."""
    taken = {n for u in wanted for n in u.nodes}
    out = []
    for unit in wanted:
        if unit.check not in pair_checks or len(unit.nodes) != 1:
            out.append(unit)
            continue
        own = leaves_of(unit.nodes, leaf_map)
        spare = sorted(healthy_idle - taken, key=lambda n: (len(leaves_of([n], leaf_map) - own), n))
        if spare:
            taken.add(spare[0])
            unit = Unit(unit.check, (*unit.nodes, spare[0]), unit.validation)
        out.append(unit)
    return out


def round_robin(nodes: list[str], rounds: int | None = None) -> list[list[tuple[str, str]]]:
    """The circle method: n-1 rounds (n even; an odd list gets a bye) in which every node meets every
    other once. Each round pairs every node, so ONE round already measures every port; a few rounds give
    each port several partners, which tells a bad port (low with every partner) from a bad partner."""
    players: list[str | None] = sorted(nodes)
    if len(players) % 2:
        players.append(None)
    n = len(players)
    schedule = []
    for r in range(min(n - 1, rounds if rounds is not None else n - 1)):
        ring = players[:1] + players[1:][-r:] + players[1:][:-r] if r else players
        pairs = [(ring[i], ring[n - 1 - i]) for i in range(n // 2)]
        schedule.append([(a, b) for a, b in pairs if a is not None and b is not None])
    return schedule


def port_verdicts(
    measured: Mapping[tuple[str, str, str], float], min_gbits: float
) -> dict[tuple[str, str], dict[str, object]]:
    """(node, port) -> pass/fail from pair measurements ``(node, partner, port) -> Gb/s``: a port fails
    when it was slow with most of its partners (one slow partner blames the partner, not the port)."""
    by_port: dict[tuple[str, str], list[tuple[str, float]]] = {}
    for (node, partner, port), gbits in measured.items():
        by_port.setdefault((node, port), []).append((partner, gbits))
        by_port.setdefault((partner, port), []).append((node, gbits))
    verdicts = {}
    for key, runs in sorted(by_port.items()):
        slow = [p for p, g in runs if g < min_gbits]
        verdicts[key] = {
            "passed": len(slow) * 2 <= len(runs) and not (len(runs) == 1 and slow),
            "partners": {p: round(g, 1) for p, g in runs},
        }
    return verdicts
