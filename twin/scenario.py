"""Scenario files: the cluster's shape, its jobs and its faults, read from YAML and checked.

Every mistake in a scenario file is reported as a ``ScenarioError`` that names the field, so that
`fleetsight twin run` can print one clear line instead of a traceback.
"""

from __future__ import annotations

import datetime as dt
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

FAULT_KINDS = (
    "psu_failure",
    "thermal_throttle",
    "pcie_downgrade",
    "ib_link_flap",
    "ib_port_down",
    "xid",
    "hbm_row_remap",
    "host_crash",
    "nvswitch_fatal",
    "lustre_ost_slow",
    "gray_slow_node",
    "loss_spike",
)

# What "magnitude" means per kind, and its default.
DEFAULT_MAGNITUDE: dict[str, float] = {
    "psu_failure": 150.0,  # GPU power cap under the power brake, watts (IBM Vela: ~400 W -> ~150 W)
    "thermal_throttle": 0.6,  # SM clock ratio of the hot GPU
    "pcie_downgrade": 1.0,  # PCIe generation the link falls back to (1 = 2.5 GT/s)
    "ib_link_flap": 4.0,  # number of flaps during the fault
    "ib_port_down": 1.0,
    "xid": 0.0,  # the Xid code; 0 = drawn from Fire-Flyer's shares
    "hbm_row_remap": 1.0,  # rows marked for remapping
    "host_crash": 1.0,
    "nvswitch_fatal": 1.0,
    "lustre_ost_slow": 20.0,  # latency multiplier of the OST
    "gray_slow_node": 1.3,  # compute-time multiplier of the node
    "loss_spike": 4.0,  # loss multiplier
}

MODEL_PROFILES: dict[str, dict[str, float]] = {
    # step_time: seconds per optimizer step on healthy hardware; tensor: tensor-pipe activity while
    # computing; compute_share: part of a step that is compute (the rest is exposed communication).
    "llm-8b": {"step_time": 2.5, "tensor": 0.42, "compute_share": 0.85, "fb_used_gib": 62.0, "loss0": 10.8},
    "llm-20b": {"step_time": 4.0, "tensor": 0.50, "compute_share": 0.88, "fb_used_gib": 71.0, "loss0": 10.9},
    "llm-70b": {"step_time": 7.5, "tensor": 0.55, "compute_share": 0.90, "fb_used_gib": 76.0, "loss0": 11.0},
    "vision": {"step_time": 0.8, "tensor": 0.30, "compute_share": 0.80, "fb_used_gib": 40.0, "loss0": 6.9},
}


class ScenarioError(ValueError):
    """A scenario file that cannot be used, with the reason."""


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: Any, where: str) -> float:
    """Seconds from 90, "90s", "5m", "1.5h", "2d"."""
    if isinstance(value, bool):
        raise ScenarioError(f"{where}: expected a duration like 90s, 5m, 2h; got {value!r}")
    if isinstance(value, int | float):
        return float(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ScenarioError(f"{where}: expected a duration like 90s, 5m, 2h; got {value!r}")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def parse_time(value: Any, where: str) -> dt.datetime:
    if isinstance(value, dt.datetime):
        moment = value
    else:
        try:
            moment = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError as exc:
            raise ScenarioError(f"{where}: expected an ISO 8601 time, got {value!r}") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.UTC)


@dataclass(frozen=True)
class ClusterSpec:
    name: str = "twin"
    nodes: int = 16
    sku: str = "h100-sxm-80gb"
    nodes_per_rack: int = 4
    nodes_per_su: int = 32
    psus_per_node: int = 6
    lustre_fsname: str = "lustre"
    lustre_osts: int = 8
    lustre_mdts: int = 1


@dataclass(frozen=True)
class JobSpec:
    id: str
    name: str
    nodes: tuple[str, ...] | int
    profile: str
    start: float
    end: float
    checkpoint_interval: float
    checkpoint_duration: float
    restart: str
    restart_delay: float
    user: str


@dataclass(frozen=True)
class FaultSpec:
    id: str
    kind: str
    target: dict[str, Any]
    onset: float
    duration: float
    magnitude: float


@dataclass(frozen=True)
class Scenario:
    name: str
    seed: int
    start: dt.datetime
    duration: float
    tick: float
    cluster: ClusterSpec
    jobs: tuple[JobSpec, ...]
    faults: tuple[FaultSpec, ...]
    scrape_failure_rate: float = 0.0
    source: Path | None = None
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def node_names(self) -> list[str]:
        return node_names(self.cluster.nodes)


def node_names(count: int) -> list[str]:
    return [f"n{i:04d}" for i in range(1, count + 1)]


def expand_node_list(value: Any, known: set[str], where: str) -> tuple[str, ...] | int:
    """A count, a list of names, or ranges like "n0001-n0008"."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ScenarioError(f"{where}: a job needs at least one node")
        return value
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise ScenarioError(f"{where}: expected a node count or a list of node names, got {value!r}")
    names: list[str] = []
    for item in items:
        text = str(item)
        if "-" in text:
            first, last = text.split("-", 1)
            try:
                lo, hi = int(first.lstrip("n")), int(last.lstrip("n"))
            except ValueError as exc:
                raise ScenarioError(f"{where}: bad node range {text!r}") from exc
            names.extend(f"n{i:04d}" for i in range(lo, hi + 1))
        else:
            names.append(text)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ScenarioError(f"{where}: unknown node(s) {', '.join(unknown[:5])}")
    return tuple(names)


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ScenarioError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _cluster(raw: dict[str, Any]) -> ClusterSpec:
    lustre = _mapping(raw.get("lustre"), "cluster.lustre")
    nodes = raw.get("nodes", 16)
    if not isinstance(nodes, int) or not 1 <= nodes <= 9999:
        raise ScenarioError(f"cluster.nodes: expected an integer 1..9999, got {nodes!r}")
    return ClusterSpec(
        name=str(raw.get("name", "twin")),
        nodes=nodes,
        sku=str(raw.get("sku", "h100-sxm-80gb")),
        nodes_per_rack=int(raw.get("nodes_per_rack", 4)),
        nodes_per_su=int(raw.get("nodes_per_su", 32)),
        psus_per_node=int(raw.get("psus_per_node", 6)),
        lustre_fsname=str(lustre.get("fsname", "lustre")),
        lustre_osts=int(lustre.get("osts", 8)),
        lustre_mdts=int(lustre.get("mdts", 1)),
    )


def _job(raw: Any, index: int, known: set[str], duration: float) -> JobSpec:
    where = f"jobs[{index}]"
    raw = _mapping(raw, where)
    profile = str(raw.get("profile", "llm-20b"))
    if profile not in MODEL_PROFILES:
        raise ScenarioError(f"{where}.profile: unknown {profile!r} (known: {', '.join(MODEL_PROFILES)})")
    restart = str(raw.get("restart", "requeue"))
    if restart not in ("requeue", "none"):
        raise ScenarioError(f"{where}.restart: expected requeue or none, got {restart!r}")
    return JobSpec(
        id=str(raw.get("id", 1000 + index)),
        name=str(raw.get("name", f"train-{index}")),
        nodes=expand_node_list(raw.get("nodes", 1), known, f"{where}.nodes"),
        profile=profile,
        start=parse_duration(raw.get("start", 0), f"{where}.start"),
        end=parse_duration(raw.get("end", duration), f"{where}.end"),
        checkpoint_interval=parse_duration(
            raw.get("checkpoint_interval", "30m"), f"{where}.checkpoint_interval"
        ),
        checkpoint_duration=parse_duration(
            raw.get("checkpoint_duration", "60s"), f"{where}.checkpoint_duration"
        ),
        restart=restart,
        restart_delay=parse_duration(raw.get("restart_delay", "60s"), f"{where}.restart_delay"),
        user=str(raw.get("user", "researcher")),
    )


def _fault(raw: Any, index: int, known: set[str], fault_id: str) -> FaultSpec:
    where = f"faults[{index}]"
    raw = _mapping(raw, where)
    kind = raw.get("kind")
    if kind not in FAULT_KINDS:
        raise ScenarioError(f"{where}.kind: expected one of {', '.join(FAULT_KINDS)}; got {kind!r}")
    target = dict(_mapping(raw.get("target"), f"{where}.target"))
    node = target.get("node")
    if kind not in ("lustre_ost_slow", "loss_spike"):
        if node is None:
            raise ScenarioError(f"{where}.target.node: a {kind} fault needs a node")
        if node not in known:
            raise ScenarioError(f"{where}.target.node: unknown node {node!r}")
    if kind == "lustre_ost_slow" and "ost" not in target:
        raise ScenarioError(f"{where}.target.ost: a lustre_ost_slow fault needs an OST index")
    if kind == "loss_spike" and "job" not in target and node is None:
        raise ScenarioError(f"{where}.target: a loss_spike fault needs a job or a node")
    magnitude = raw.get("magnitude", DEFAULT_MAGNITUDE[kind])
    if not isinstance(magnitude, int | float) or isinstance(magnitude, bool):
        raise ScenarioError(f"{where}.magnitude: expected a number, got {magnitude!r}")
    duration = parse_duration(raw.get("duration", "10m"), f"{where}.duration")
    if duration <= 0:
        raise ScenarioError(f"{where}.duration: must be positive")
    return FaultSpec(
        id=str(raw.get("id", fault_id)),
        kind=kind,
        target=target,
        onset=parse_duration(raw.get("onset", 0), f"{where}.onset"),
        duration=duration,
        magnitude=float(magnitude),
    )


def _random_faults(
    raw: dict[str, Any], seed: int, names: list[str], duration: float, first: int
) -> list[FaultSpec]:
    """A fault every `every` seconds on average, kinds and targets drawn from the seed."""
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
            target["gpu"] = rng.randrange(8)
        elif kind in ("ib_link_flap", "ib_port_down"):
            target["port"] = f"mlx5_{rng.randrange(10)}"
        elif kind == "psu_failure":
            target["psu"] = rng.randrange(6)
        elif kind == "lustre_ost_slow":
            target = {"ost": rng.randrange(8)}
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


def load(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML: {exc}") from exc
    scenario = from_dict(_mapping(raw, str(path)))
    return Scenario(**{**scenario.__dict__, "source": path})


def from_dict(raw: dict[str, Any]) -> Scenario:
    cluster = _cluster(_mapping(raw.get("cluster"), "cluster"))
    names = node_names(cluster.nodes)
    known = set(names)
    duration = parse_duration(raw.get("duration", "1h"), "duration")
    tick = parse_duration(raw.get("tick", "5s"), "tick")
    if tick <= 0 or duration <= 0:
        raise ScenarioError("duration and tick must be positive")
    seed = raw.get("seed", 1)
    if not isinstance(seed, int):
        raise ScenarioError(f"seed: expected an integer, got {seed!r}")
    jobs_raw = raw.get("jobs") or []
    faults_raw = raw.get("faults") or []
    if not isinstance(jobs_raw, list) or not isinstance(faults_raw, list):
        raise ScenarioError("jobs and faults must be lists")
    jobs = tuple(_job(j, i, known, duration) for i, j in enumerate(jobs_raw))
    if len({j.id for j in jobs}) != len(jobs):
        raise ScenarioError("jobs: two jobs share an id")
    faults = [_fault(f, i, known, f"f{i + 1:04d}") for i, f in enumerate(faults_raw)]
    if raw.get("random_faults"):
        faults += _random_faults(
            _mapping(raw["random_faults"], "random_faults"), seed, names, duration, len(faults) + 1
        )
    faults.sort(key=lambda f: f.onset)
    rate = float(raw.get("scrape_failure_rate", 0.0))
    return Scenario(
        name=str(raw.get("name", "twin")),
        seed=seed,
        start=parse_time(raw.get("start", "2026-11-21T10:00:00Z"), "start"),
        duration=duration,
        tick=tick,
        cluster=cluster,
        jobs=jobs,
        faults=tuple(faults),
        scrape_failure_rate=rate,
        description=str(raw.get("description", "")),
    )
