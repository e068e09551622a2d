"""A scenario's faults, read and checked against the kind catalogue (twin/fault_kinds.py): each fault's
kind, target, magnitude, onset and duration; and the faults ``random_faults`` draws from the seed.

Its own module: this is what changes when a fault kind is added, while the rest of the loader
(twin/scenario.py) does not. A switch fault's target is checked against the leaf switches that
twin/hardware.py names, which reads only the model (twin/scenario_model.py): no import circle.
"""

from __future__ import annotations

import random
from typing import Any

from .fault_kinds import (
    ALL_KINDS,
    APPLICATION_XIDS,
    CHECK_TOOLS,
    DEFAULT_DURATION,
    DEFAULT_MAGNITUDE,
    FAULT_KINDS,
    MAGNITUDE_RANGE,
    REQUIRED_TARGET,
    SWITCH_KINDS,
    TARGET_KEYS,
    TELEMETRY_SOURCES,
    TRAINING_KINDS,
)
from .hardware import Topology
from .scenario_fields import (
    ScenarioError,
    as_mapping,
    canonical_name,
    check_known_keys,
    index_in_range,
    parse_duration,
)
from .scenario_model import (
    GPUS_PER_NODE,
    IB_PORTS_PER_NODE,
    NVSWITCHES_PER_NODE,
    ClusterSpec,
    FaultSpec,
    node_names,
)
from .scenario_training import read_training_target


def _check_target(
    kind: str, target: dict[str, Any], cluster: ClusterSpec, jobs: set[str], where: str
) -> None:
    check_known_keys(target, TARGET_KEYS[kind], where)
    if "gpu" in target:
        index_in_range(target["gpu"], f"{where}.gpu", GPUS_PER_NODE)
    if "port" in target:
        index_in_range(target["port"], f"{where}.port", IB_PORTS_PER_NODE, "mlx5_")
    if "psu" in target:
        index_in_range(target["psu"], f"{where}.psu", cluster.psus_per_node)
    if "ost" in target:
        index_in_range(target["ost"], f"{where}.ost", cluster.lustre_osts)
    if "nvswitch" in target:
        index_in_range(target["nvswitch"], f"{where}.nvswitch", NVSWITCHES_PER_NODE)
    if "rank" in target:
        index_in_range(target["rank"], f"{where}.rank", GPUS_PER_NODE * cluster.nodes)
    if "gen" in target and target["gen"] not in (1, 2, 3, 4):
        raise ScenarioError(
            f"{where}.gen: expected a PCIe generation 1..4 below the link's 5, got {target['gen']!r}"
        )
    if "width" in target and target["width"] not in ((1, 2, 4) if kind == "ib_link_flap" else (1, 2, 4, 8)):
        raise ScenarioError(f"{where}.width: {target['width']!r} is not a narrower link width")
    if "code" in target:
        index_in_range(target["code"], f"{where}.code", 201)
    if "job" in target and str(target["job"]) not in jobs:
        known = ", ".join(sorted(jobs)) or "none"
        raise ScenarioError(f"{where}.job: no job {target['job']!r} in jobs (known: {known})")
    if kind in ("xid_storm", "job_crash_xids") and int(str(target.get("code", 13))) not in APPLICATION_XIDS:
        raise ScenarioError(
            f"{where}.code: a {kind} is an application's Xid, one of "
            f"{', '.join(map(str, APPLICATION_XIDS))}; got {target['code']!r} (a hardware Xid is kind xid)"
        )


def _check_switch(name: Any, cluster: ClusterSpec, where: str) -> None:
    """A switch fault names one of the cluster's leaf switches."""
    leaves = Topology.build(cluster, 0).leaves()
    if name not in leaves:
        raise ScenarioError(f"{where}: expected a leaf switch ({leaves[0]}..{leaves[-1]}), got {name!r}")


FAULT_KEYS = {"id", "kind", "target", "onset", "duration", "magnitude"}


def read_fault(
    raw: Any, index: int, cluster: ClusterSpec, jobs: set[str], fault_id: str, duration: float
) -> FaultSpec:
    where = f"faults[{index}]"
    raw = as_mapping(raw, where)
    check_known_keys(raw, FAULT_KEYS, where)
    kind = raw.get("kind")
    if kind not in ALL_KINDS:
        raise ScenarioError(f"{where}.kind: expected one of {', '.join(ALL_KINDS)}; got {kind!r}")
    target = dict(as_mapping(raw.get("target"), f"{where}.target"))
    node = target.get("node")
    known = set(node_names(cluster.nodes))
    if kind in TRAINING_KINDS:
        target = read_training_target(kind, target, cluster.nodes, f"{where}.target")
        if node is not None:
            raise ScenarioError(f"{where}.target.node: a {kind} acts on a whole job: name the job instead")
    no_node = ("lustre_ost_slow", "loss_spike", "job_crash_xids", *SWITCH_KINDS, *TRAINING_KINDS)
    if kind not in no_node and node is None:
        raise ScenarioError(f"{where}.target.node: a {kind} fault needs a node")
    if node is not None and node not in known:
        raise ScenarioError(
            f"{where}.target.node: unknown node {node!r} (cluster: n0001..n{cluster.nodes:04d})"
        )
    if kind == "lustre_ost_slow" and "ost" not in target:
        raise ScenarioError(f"{where}.target.ost: a lustre_ost_slow fault needs an OST index")
    if kind == "loss_spike" and "job" not in target and node is None:
        raise ScenarioError(f"{where}.target: a loss_spike fault needs a job or a node")
    if kind in SWITCH_KINDS:
        _check_switch(target.get("switch"), cluster, f"{where}.target.switch")
    _check_target(kind, target, cluster, jobs, f"{where}.target")
    if kind in REQUIRED_TARGET:
        key, meaning = REQUIRED_TARGET[kind]
        if key not in target:
            raise ScenarioError(f"{where}.target.{key}: a {kind} fault needs {meaning}")
    if kind == "telemetry_dropout":
        target["source"] = canonical_name(
            target["source"], TELEMETRY_SOURCES, f"{where}.target.source", "a source"
        )
    if kind == "check_tool_missing":
        target["tool"] = canonical_name(target["tool"], CHECK_TOOLS, f"{where}.target.tool", "a check tool")
    magnitude = raw.get("magnitude", DEFAULT_MAGNITUDE[kind])
    if not isinstance(magnitude, int | float) or isinstance(magnitude, bool):
        raise ScenarioError(f"{where}.magnitude: expected a number, got {magnitude!r}")
    low, high, meaning = MAGNITUDE_RANGE[kind]
    if not low <= magnitude <= high:
        raise ScenarioError(f"{where}.magnitude: {magnitude!r} is outside physics for {kind}: {meaning}")
    default_duration = DEFAULT_DURATION.get(kind, "10m")
    fault_duration = parse_duration(raw.get("duration", default_duration), f"{where}.duration")
    if fault_duration <= 0:
        raise ScenarioError(f"{where}.duration: must be positive")
    onset = parse_duration(raw.get("onset", 0), f"{where}.onset")
    if onset >= duration:
        raise ScenarioError(f"{where}.onset: {onset:g} s is at or after the scenario's end ({duration:g} s)")
    return FaultSpec(
        id=str(raw.get("id", fault_id)),
        kind=kind,
        target=target,
        onset=onset,
        duration=fault_duration,
        magnitude=float(magnitude),
    )


RANDOM_KEYS = {"every", "kinds", "duration", "start_after"}


def random_faults(
    raw: dict[str, Any], seed: int, cluster: ClusterSpec, duration: float, first: int
) -> list[FaultSpec]:
    """A fault every `every` seconds on average, kinds and targets drawn from the seed."""
    check_known_keys(raw, RANDOM_KEYS, "random_faults")
    names = node_names(cluster.nodes)
    every = parse_duration(raw.get("every", "5m"), "random_faults.every")
    kinds = raw.get("kinds", list(FAULT_KINDS))
    bad = [k for k in kinds if k not in FAULT_KINDS]
    if bad:
        raise ScenarioError(f"random_faults.kinds: unknown {', '.join(map(str, bad))}")
    low, high = (parse_duration(v, "random_faults.duration") for v in raw.get("duration", ["2m", "8m"]))
    start_after = parse_duration(raw.get("start_after", "2m"), "random_faults.start_after")
    rng = random.Random(seed * 7919 + 17)
    faults: list[FaultSpec] = []
    t = start_after
    while True:
        t += rng.expovariate(1.0 / every)
        if t >= duration:
            break
        kind = rng.choice(kinds)
        node = rng.choice(names)
        target: dict[str, Any] = {"node": node}
        if kind in ("thermal_throttle", "pcie_downgrade", "hbm_row_remap", "xid"):
            target["gpu"] = rng.randrange(GPUS_PER_NODE)
        elif kind in ("ib_link_flap", "ib_port_down"):
            target["port"] = f"mlx5_{rng.randrange(IB_PORTS_PER_NODE)}"
        elif kind == "psu_failure":
            target["psu"] = rng.randrange(cluster.psus_per_node)
        elif kind == "lustre_ost_slow":
            target = {"ost": rng.randrange(cluster.lustre_osts)}
        magnitude = DEFAULT_MAGNITUDE[kind]
        if kind == "gray_slow_node":
            magnitude = round(rng.uniform(1.15, 1.6), 2)
        fault_duration = rng.uniform(low, high)
        faults.append(
            FaultSpec(
                id=f"f{first + len(faults):04d}",
                kind=kind,
                target=target,
                onset=round(t, 1),
                duration=round(fault_duration, 1),
                magnitude=magnitude,
            )
        )
    return faults
