"""Scenario files: the cluster's shape, its jobs and its faults, read from YAML and checked.

Every mistake in a scenario file is reported as a ``ScenarioError`` that names the field, so that
`fleetsight twin run` can print one clear line instead of a traceback.
"""

from __future__ import annotations

import datetime as dt
import difflib
import math
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from fleetsight import durations

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
# Disturbances a healthy cluster has: listed in the truth with "benign": true (false flags if flagged).
BENIGN_KINDS = ("dataloader_hiccup", "os_jitter", "slow_rank_logging")
# Faults no passive signal shows, found only by an intrusive check (twin/checks.py answers them); apart
# from FAULT_KINDS so that drawn scenarios (which draw from FAULT_KINDS) stay what they were.
SILENT_KINDS = ("hbm_silent_corruption",)
# Faults of a fabric switch, not of a node: their target is a leaf switch (twin/hardware.py Topology),
# and every host cabled to it sees them. Apart from FAULT_KINDS for the same reason as SILENT_KINDS.
SWITCH_KINDS = ("leaf_flap",)
# What goes wrong that is not the node's hardware: FleetSight's own sources going silent or blind, the
# operator's mistakes, an application's errors. Listed in the truth with "hardware": false, so that an
# evaluation counts a drain for one of them as a wrong drain. Apart from FAULT_KINDS for the same reason.
NOT_HARDWARE_KINDS = (
    "telemetry_dropout",  # a source stops answering on a node: dcgm-exporter, the node agent or the BMC
    "profiling_dropout",  # DCGM's profiling fields read 0 (the profiling module taken by another client)
    "xid_storm",  # one application Xid logged many times on one GPU
    "job_crash_xids",  # an application Xid on every GPU of every node of one job at once
    "check_tool_missing",  # an active check's tool is not installed on a node
    "fabric_manager_down",  # NVIDIA Fabric Manager stops on a node
)
ALL_KINDS = FAULT_KINDS + BENIGN_KINDS + SILENT_KINDS + SWITCH_KINDS + NOT_HARDWARE_KINDS
# telemetry_dropout's sources: the canonical name, and the other spellings a scenario may use.
TELEMETRY_SOURCES = {
    "dcgm-exporter": ("dcgm-exporter", "dcgm_exporter", "dcgm"),
    "node_agent": ("node_agent", "node agent", "node-agent", "fleetsight-node"),
    "bmc": ("bmc", "redfish"),
}
# check_tool_missing's tools: the checks catalogue's tool names (checks/tools.yml), and other spellings.
CHECK_TOOLS = {
    "dcgmi": ("dcgmi",),
    "gpu_probe": ("gpu_probe", "gpu-probe", "fleetsight-gpu-probe"),
    "ib_write_bw": ("ib_write_bw",),
}
# The Xids an application causes (Fire-Flyer's "software-triggered" codes: the GPU is fine, the process
# faulted or was killed): the only codes of xid_storm and job_crash_xids, whose truth says "not the
# hardware" (a hardware Xid is kind xid).
APPLICATION_XIDS = (13, 31, 43, 45)

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
    "hbm_silent_corruption": 1.0,  # HBM cells that flip under a memory test (DCGM level 4 memtest)
    "leaf_flap": 4.0,  # times every port of the leaf goes down and up during the fault
    "dataloader_hiccup": 10.0,  # seconds the node's data loader stalls
    "os_jitter": 1.04,  # compute-time multiplier of the node
    "slow_rank_logging": 1.02,  # compute-time multiplier of the node whose rank logs slowly
    "telemetry_dropout": 1.0,
    "profiling_dropout": 1.0,
    "xid_storm": 300.0,  # times the one Xid line is logged
    "job_crash_xids": 1.0,
    "check_tool_missing": 1.0,
    "fabric_manager_down": 1.0,
}

# The range of magnitudes physics allows, per kind (inclusive); outside it `validate` refuses.
MAGNITUDE_RANGE: dict[str, tuple[float, float, str]] = {
    "psu_failure": (50.0, 700.0, "a GPU power cap in W between 50 and the H100's 700 W TDP"),
    "thermal_throttle": (0.2, 0.99, "an SM clock ratio between 0.2 and 0.99"),
    "pcie_downgrade": (1.0, 4.0, "the PCIe generation the Gen5 link falls back to, 1..4"),
    "ib_link_flap": (1.0, 1000.0, "a number of flaps, 1..1000"),
    "ib_port_down": (1.0, 1.0, "1 (the port is down)"),
    "xid": (0.0, 200.0, "an Xid code 1..200, or 0 to draw one"),
    "hbm_row_remap": (1.0, 64.0, "rows marked for remapping, 1..64"),
    "host_crash": (1.0, 1.0, "1 (the host is down)"),
    "nvswitch_fatal": (1.0, 1.0, "1 (the NVSwitch is dead)"),
    "lustre_ost_slow": (1.0, 1000.0, "an OST latency multiplier, 1..1000"),
    "gray_slow_node": (1.001, 5.0, "a compute-time multiplier above 1 (slower), at most 5"),
    "loss_spike": (1.0, 1000.0, "a loss multiplier, 1..1000"),
    "hbm_silent_corruption": (1.0, 1.0, "1 (the GPU's HBM corrupts data silently)"),
    "leaf_flap": (1.0, 1000.0, "a number of flaps, 1..1000"),
    "dataloader_hiccup": (1.0, 120.0, "seconds of data-loader stall, 1..120"),
    "os_jitter": (1.0, 1.5, "a compute-time multiplier 1..1.5"),
    "slow_rank_logging": (1.0, 1.2, "a compute-time multiplier 1..1.2"),
    "telemetry_dropout": (1.0, 1.0, "1 (the source does not answer)"),
    "profiling_dropout": (1.0, 1.0, "1 (the profiling fields read 0)"),
    "xid_storm": (2.0, 10000.0, "the number of times the Xid line is logged, 2..10000"),
    "job_crash_xids": (1.0, 1.0, "1 (every GPU of the job logs the Xid once)"),
    "check_tool_missing": (1.0, 1.0, "1 (the tool is not installed)"),
    "fabric_manager_down": (1.0, 1.0, "1 (Fabric Manager is not running)"),
}
# Target keys each kind understands (node is required unless noted in _fault).
TARGET_KEYS: dict[str, set[str]] = {
    "psu_failure": {"node", "psu"},
    "thermal_throttle": {"node", "gpu"},
    "pcie_downgrade": {"node", "gpu", "gen", "width"},
    "ib_link_flap": {"node", "port", "width"},
    "ib_port_down": {"node", "port"},
    "xid": {"node", "gpu", "code"},
    "hbm_row_remap": {"node", "gpu"},
    "host_crash": {"node"},
    "nvswitch_fatal": {"node", "nvswitch"},
    "lustre_ost_slow": {"ost"},
    "gray_slow_node": {"node"},
    "loss_spike": {"job", "node"},
    "hbm_silent_corruption": {"node", "gpu"},
    "leaf_flap": {"switch"},
    "dataloader_hiccup": {"node"},
    "os_jitter": {"node"},
    "slow_rank_logging": {"node", "rank"},
    "telemetry_dropout": {"node", "source"},
    "profiling_dropout": {"node", "gpu"},  # no gpu: every GPU of the node (the usual case)
    "xid_storm": {"node", "gpu", "code"},
    "job_crash_xids": {"job", "code"},
    "check_tool_missing": {"node", "tool"},
    "fabric_manager_down": {"node"},
}
# Target keys a kind cannot do without (node aside: _fault checks it), and what they mean.
REQUIRED_TARGET: dict[str, tuple[str, str]] = {
    "telemetry_dropout": ("source", "the source that stops answering: dcgm-exporter, node_agent or bmc"),
    "job_crash_xids": ("job", "the id of the job that crashes (one of jobs)"),
    "check_tool_missing": ("tool", "the missing tool: dcgmi, gpu_probe or ib_write_bw"),
}
GPUS_PER_NODE = 8
IB_PORTS_PER_NODE = 10
NVSWITCHES_PER_NODE = 4

_P = dict[str, float]
MODEL_PROFILES: dict[str, _P] = {
    # step_time: seconds per optimizer step on healthy hardware; tensor: tensor-pipe activity while
    # computing; compute_share: part of a step that is compute (the rest is exposed communication);
    # power: a GPU's draw while computing, as a share of the 700 W TDP (dense LLM training runs H100s
    # at or near their cap); pipeline: default pipeline stages (tensor parallel fills a node);
    # expert_imbalance: MoE only, spread of the experts' load across nodes (drifts over ~10 min).
    "llm-8b": {
        "step_time": 2.5,
        "tensor": 0.42,
        "compute_share": 0.85,
        "fb_used_gib": 62.0,
        "loss0": 10.8,
        "power": 0.93,
        "pipeline": 1,
        "expert_imbalance": 0.0,
    },
    "llm-20b": {
        "step_time": 4.0,
        "tensor": 0.50,
        "compute_share": 0.88,
        "fb_used_gib": 71.0,
        "loss0": 10.9,
        "power": 0.97,
        "pipeline": 2,
        "expert_imbalance": 0.0,
    },
    "llm-70b": {
        "step_time": 7.5,
        "tensor": 0.55,
        "compute_share": 0.90,
        "fb_used_gib": 76.0,
        "loss0": 11.0,
        "power": 0.99,
        "pipeline": 4,
        "expert_imbalance": 0.0,
    },
    "moe-8x22b": {
        "step_time": 6.0,
        "tensor": 0.45,
        "compute_share": 0.80,
        "fb_used_gib": 74.0,
        "loss0": 11.2,
        "power": 0.94,
        "pipeline": 2,
        "expert_imbalance": 0.05,
    },
    "vision": {
        "step_time": 0.8,
        "tensor": 0.30,
        "compute_share": 0.80,
        "fb_used_gib": 40.0,
        "loss0": 6.9,
        "power": 0.80,
        "pipeline": 1,
        "expert_imbalance": 0.0,
    },
}


class ScenarioError(ValueError):
    """A scenario file that cannot be used, with the reason."""


def parse_duration(value: Any, where: str) -> float:
    """Seconds from 90, "90s", "5m", "1.5h", "2d"."""
    try:
        return durations.seconds(value)
    except ValueError:
        raise ScenarioError(f"{where}: expected a duration like 90s, 5m, 2h; got {value!r}") from None


def parse_time(value: Any, where: str) -> dt.datetime:
    try:
        return durations.instant(value)
    except ValueError as exc:
        raise ScenarioError(f"{where}: expected an ISO 8601 time, got {value!r}") from exc


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
class Realism:
    """What makes the twin as hard as a real cluster (docs/twin.md, "Physics"). All on by default; a
    scenario turns it down with ``realism: off`` or per item (e.g. for format tests)."""

    phase_sampling: bool = True  # a sample averages a short window of the step (compute vs comms)
    sample_window: float = 1.0  # seconds a DCGM profiling sample averages
    layout: bool = True  # pipeline stages carry different work; MoE imbalance drifts
    silicon: bool = True  # per-GPU speed, power and cooling differ; inlet temperature drifts
    power_cap: bool = True  # busy GPUs reach their power limit (SW power cap bit, clocks down)
    background_errors: bool = True  # PCIe replays, ECC SBEs, IB symbol errors at healthy rates
    benign_per_node_hour: float = 0.5  # benign disturbances drawn per busy node-hour (0: none)


REALISM_OFF = Realism(
    phase_sampling=False,
    layout=False,
    silicon=False,
    power_cap=False,
    background_errors=False,
    benign_per_node_hour=0.0,
)


DCGM_XID_FORMS = ("4x", "3x")
DCGM_LABEL_MODES = ("bare", "slurm", "kubernetes")


@dataclass(frozen=True)
class DcgmSettings:
    """How the twin's dcgm-exporter publishes (twin/dcgm.py; scenario key ``dcgm``, `twin run --dcgm-*`)."""

    counters: str = "shipped"  # shipped (exporters/dcgm/counters.csv), stock (the pinned image's), or a path
    xid: str = "4x"  # 4x: err_code/err_msg labels (the pinned image); 3x: one series, value = last Xid
    labels: str = "slurm"  # bare, slurm (hpc_job on a job's GPUs) or kubernetes (pod, namespace, container)
    pod_labels: bool = False  # kubernetes: --kubernetes-enable-pod-labels (sanitised pod labels)
    pod_uid: bool = False  # kubernetes: --kubernetes-enable-pod-uid


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
    pipeline_stages: int = 1
    # Who runs the job: "" follows the dcgm label mode (slurm: a Slurm job with hpc_job; kubernetes: a
    # pod per node); "slurm" or "kubernetes" pins it, so both kinds run side by side in one twin. A
    # Kubernetes job's controller (jobset or pytorchjob) decides its pods' names and labels.
    scheduler: str = ""
    controller: str = "jobset"
    namespace: str = "training"

    @property
    def size(self) -> int:
        return self.nodes if isinstance(self.nodes, int) else len(self.nodes)


@dataclass(frozen=True)
class FaultSpec:
    id: str
    kind: str
    target: dict[str, Any]
    onset: float
    duration: float
    magnitude: float

    @property
    def benign(self) -> bool:
        return self.kind in BENIGN_KINDS


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
    realism: Realism = field(default_factory=Realism)
    dcgm: DcgmSettings = field(default_factory=DcgmSettings)

    def node_names(self) -> list[str]:
        return node_names(self.cluster.nodes)


def node_names(count: int) -> list[str]:
    return [f"n{i:04d}" for i in range(1, count + 1)]


def expand_node_list(value: Any, known: set[str], where: str) -> tuple[str, ...] | int:
    """A count, a list of names, or ranges like "n0001-n0008"."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ScenarioError(f"{where}: a job needs at least one node")
        if value > len(known):
            raise ScenarioError(f"{where}: {value} nodes, but the cluster has {len(known)}")
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
    if len(set(names)) != len(names):
        raise ScenarioError(f"{where}: a node is listed twice")
    return tuple(names)


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ScenarioError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _known_keys(raw: dict[str, Any], allowed: set[str] | tuple[str, ...], where: str) -> None:
    """Refuse a key the twin does not know: a typo (``magnitud``) must not fall back to a default."""
    for key in raw:
        if key not in allowed:
            hint = difflib.get_close_matches(str(key), list(allowed), n=1)
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ScenarioError(
                f"{where}.{key}: unknown key{suggestion}; known: {', '.join(sorted(allowed))}".lstrip(".")
            )


def _int(raw: dict[str, Any], key: str, default: int, where: str, low: int, high: int) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ScenarioError(f"{where}.{key}: expected an integer {low}..{high}, got {value!r}")
    return value


def _cluster(raw: dict[str, Any]) -> ClusterSpec:
    _known_keys(
        raw,
        {"name", "nodes", "sku", "nodes_per_rack", "nodes_per_su", "psus_per_node", "lustre"},
        "cluster",
    )
    lustre = _mapping(raw.get("lustre"), "cluster.lustre")
    _known_keys(lustre, {"fsname", "osts", "mdts"}, "cluster.lustre")
    return ClusterSpec(
        name=str(raw.get("name", "twin")),
        nodes=_int(raw, "nodes", 16, "cluster", 1, 9999),
        sku=str(raw.get("sku", "h100-sxm-80gb")),
        nodes_per_rack=_int(raw, "nodes_per_rack", 4, "cluster", 1, 64),
        nodes_per_su=_int(raw, "nodes_per_su", 32, "cluster", 1, 4096),
        psus_per_node=_int(raw, "psus_per_node", 6, "cluster", 1, 16),
        lustre_fsname=str(lustre.get("fsname", "lustre")),
        lustre_osts=_int(lustre, "osts", 8, "cluster.lustre", 1, 1024),
        lustre_mdts=_int(lustre, "mdts", 1, "cluster.lustre", 1, 64),
    )


JOB_KEYS = {
    "id",
    "name",
    "nodes",
    "profile",
    "start",
    "end",
    "checkpoint_interval",
    "checkpoint_duration",
    "restart",
    "restart_delay",
    "user",
    "pipeline_stages",
    "scheduler",
    "controller",
    "namespace",
}
JOB_SCHEDULERS = ("", "slurm", "kubernetes")
JOB_CONTROLLERS = ("jobset", "pytorchjob")


def _job(raw: Any, index: int, known: set[str], duration: float) -> JobSpec:
    where = f"jobs[{index}]"
    raw = _mapping(raw, where)
    _known_keys(raw, JOB_KEYS, where)
    profile = str(raw.get("profile", "llm-20b"))
    if profile not in MODEL_PROFILES:
        raise ScenarioError(f"{where}.profile: unknown {profile!r} (known: {', '.join(MODEL_PROFILES)})")
    restart = str(raw.get("restart", "requeue"))
    if restart not in ("requeue", "none"):
        raise ScenarioError(f"{where}.restart: expected requeue or none, got {restart!r}")
    nodes = expand_node_list(raw.get("nodes", 1), known, f"{where}.nodes")
    size = nodes if isinstance(nodes, int) else len(nodes)
    default_stages = int(MODEL_PROFILES[profile]["pipeline"])
    stages = raw.get("pipeline_stages", math.gcd(default_stages, size))
    if not isinstance(stages, int) or isinstance(stages, bool) or stages < 1 or size % stages:
        raise ScenarioError(
            f"{where}.pipeline_stages: expected a divisor of the job's {size} nodes, got {stages!r}"
        )
    scheduler, controller = _job_scheduler(raw, where)
    start = parse_duration(raw.get("start", 0), f"{where}.start")
    end = parse_duration(raw.get("end", duration), f"{where}.end")
    if start >= duration:
        raise ScenarioError(f"{where}.start: {start:g} s is at or after the scenario's end ({duration:g} s)")
    if end <= start:
        raise ScenarioError(f"{where}.end: {end:g} s is not after its start ({start:g} s)")
    return JobSpec(
        id=str(raw.get("id", 1000 + index)),
        name=str(raw.get("name", f"train-{index}")),
        nodes=nodes,
        profile=profile,
        start=start,
        end=end,
        checkpoint_interval=parse_duration(
            raw.get("checkpoint_interval", "30m"), f"{where}.checkpoint_interval"
        ),
        checkpoint_duration=parse_duration(
            raw.get("checkpoint_duration", "60s"), f"{where}.checkpoint_duration"
        ),
        restart=restart,
        restart_delay=parse_duration(raw.get("restart_delay", "60s"), f"{where}.restart_delay"),
        user=str(raw.get("user", "researcher")),
        pipeline_stages=stages,
        scheduler=scheduler,
        controller=controller,
        namespace=str(raw.get("namespace", "training")),
    )


def _job_scheduler(raw: dict[str, Any], where: str) -> tuple[str, str]:
    scheduler = str(raw.get("scheduler", ""))
    if scheduler not in JOB_SCHEDULERS:
        raise ScenarioError(f"{where}.scheduler: expected slurm or kubernetes, got {scheduler!r}")
    controller = str(raw.get("controller", "jobset"))
    if controller not in JOB_CONTROLLERS:
        raise ScenarioError(
            f"{where}.controller: expected one of {', '.join(JOB_CONTROLLERS)}, got {controller!r}"
        )
    return scheduler, controller


def _check_jobs_fit(jobs: tuple[JobSpec, ...], nodes: int) -> None:
    """Jobs running at the same time may not share a named node nor need more nodes than exist."""

    def overlapping(index: int) -> list[tuple[int, JobSpec]]:
        job = jobs[index]
        return [
            (other_index, other)
            for other_index, other in enumerate(jobs)
            if other_index != index and other.start < job.end and job.start < other.end
        ]

    for index, job in enumerate(jobs):
        if isinstance(job.nodes, int):
            continue
        for other_index, other in overlapping(index):
            if isinstance(other.nodes, int) or other_index > index:
                continue
            shared = sorted(set(job.nodes) & set(other.nodes))
            if shared:
                both = ", ".join(shared[:3])
                raise ScenarioError(
                    f"jobs[{index}].nodes: {both} also in jobs[{other_index}] at the same time"
                )
    for index, job in enumerate(jobs):
        running = [
            other
            for other_index, other in overlapping(index)
            if other.start < job.start or (other.start == job.start and other_index < index)
        ]
        needed = job.size + sum(other.size for other in running)
        if needed > nodes:
            raise ScenarioError(
                f"jobs[{index}].nodes: {needed} nodes in use when it starts, the cluster has {nodes}"
            )


def _index(value: Any, where: str, count: int, prefix: str = "") -> int:
    text = str(value)
    if prefix and text.startswith(prefix):
        text = text[len(prefix) :]
    try:
        index = int(text)
    except ValueError as exc:
        raise ScenarioError(f"{where}: expected {prefix or ''}0..{count - 1}, got {value!r}") from exc
    if not 0 <= index < count:
        raise ScenarioError(f"{where}: {value!r} out of range {prefix}0..{prefix}{count - 1}")
    return index


def _check_target(
    kind: str, target: dict[str, Any], cluster: ClusterSpec, jobs: set[str], where: str
) -> None:
    _known_keys(target, TARGET_KEYS[kind], where)
    if "gpu" in target:
        _index(target["gpu"], f"{where}.gpu", GPUS_PER_NODE)
    if "port" in target:
        _index(target["port"], f"{where}.port", IB_PORTS_PER_NODE, "mlx5_")
    if "psu" in target:
        _index(target["psu"], f"{where}.psu", cluster.psus_per_node)
    if "ost" in target:
        _index(target["ost"], f"{where}.ost", cluster.lustre_osts)
    if "nvswitch" in target:
        _index(target["nvswitch"], f"{where}.nvswitch", NVSWITCHES_PER_NODE)
    if "rank" in target:
        _index(target["rank"], f"{where}.rank", GPUS_PER_NODE * cluster.nodes)
    if "gen" in target and target["gen"] not in (1, 2, 3, 4):
        raise ScenarioError(
            f"{where}.gen: expected a PCIe generation 1..4 below the link's 5, got {target['gen']!r}"
        )
    if "width" in target and target["width"] not in ((1, 2, 4) if kind == "ib_link_flap" else (1, 2, 4, 8)):
        raise ScenarioError(f"{where}.width: {target['width']!r} is not a narrower link width")
    if "code" in target:
        _index(target["code"], f"{where}.code", 201)
    if "job" in target and str(target["job"]) not in jobs:
        known = ", ".join(sorted(jobs)) or "none"
        raise ScenarioError(f"{where}.job: no job {target['job']!r} in jobs (known: {known})")
    if kind in ("xid_storm", "job_crash_xids") and int(str(target.get("code", 13))) not in APPLICATION_XIDS:
        raise ScenarioError(
            f"{where}.code: a {kind} is an application's Xid, one of "
            f"{', '.join(map(str, APPLICATION_XIDS))}; got {target['code']!r} (a hardware Xid is kind xid)"
        )


def _canonical(value: Any, names: dict[str, tuple[str, ...]], where: str, what: str) -> str:
    """The canonical name of one of ``names`` (any of its spellings), or a ScenarioError listing them."""
    text = str(value).strip().lower()
    for canonical, spellings in names.items():
        if text in spellings:
            return canonical
    raise ScenarioError(f"{where}: expected {what} ({', '.join(names)}), got {value!r}")


def _check_switch(name: Any, cluster: ClusterSpec, where: str) -> None:
    """A switch fault names one of the cluster's leaf switches."""
    # Imported here: twin.hardware imports this module, and the leaf names are its to define.
    from .hardware import Topology

    leaves = Topology.build(cluster, 0).leaves()
    if name not in leaves:
        raise ScenarioError(f"{where}: expected a leaf switch ({leaves[0]}..{leaves[-1]}), got {name!r}")


FAULT_KEYS = {"id", "kind", "target", "onset", "duration", "magnitude"}


def _fault(
    raw: Any, index: int, cluster: ClusterSpec, jobs: set[str], fault_id: str, duration: float
) -> FaultSpec:
    where = f"faults[{index}]"
    raw = _mapping(raw, where)
    _known_keys(raw, FAULT_KEYS, where)
    kind = raw.get("kind")
    if kind not in ALL_KINDS:
        raise ScenarioError(f"{where}.kind: expected one of {', '.join(ALL_KINDS)}; got {kind!r}")
    target = dict(_mapping(raw.get("target"), f"{where}.target"))
    node = target.get("node")
    known = set(node_names(cluster.nodes))
    if kind not in ("lustre_ost_slow", "loss_spike", "job_crash_xids", *SWITCH_KINDS) and node is None:
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
        target["source"] = _canonical(
            target["source"], TELEMETRY_SOURCES, f"{where}.target.source", "a source"
        )
    if kind == "check_tool_missing":
        target["tool"] = _canonical(target["tool"], CHECK_TOOLS, f"{where}.target.tool", "a check tool")
    magnitude = raw.get("magnitude", DEFAULT_MAGNITUDE[kind])
    if not isinstance(magnitude, int | float) or isinstance(magnitude, bool):
        raise ScenarioError(f"{where}.magnitude: expected a number, got {magnitude!r}")
    low, high, meaning = MAGNITUDE_RANGE[kind]
    if not low <= magnitude <= high:
        raise ScenarioError(f"{where}.magnitude: {magnitude!r} is outside physics for {kind}: {meaning}")
    fault_duration = parse_duration(raw.get("duration", "10m"), f"{where}.duration")
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


def _random_faults(
    raw: dict[str, Any], seed: int, cluster: ClusterSpec, duration: float, first: int
) -> list[FaultSpec]:
    """A fault every `every` seconds on average, kinds and targets drawn from the seed."""
    _known_keys(raw, RANDOM_KEYS, "random_faults")
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


def _realism(value: Any) -> Realism:
    if value is None or value in ("full", "on", True):
        return Realism()
    if value in ("off", False):
        return REALISM_OFF
    raw = _mapping(value, "realism")
    allowed = set(Realism.__dataclass_fields__)
    _known_keys(raw, allowed, "realism")
    values: dict[str, Any] = {}
    for key, default in Realism().__dict__.items():
        if key not in raw:
            continue
        item = raw[key]
        if isinstance(default, bool):
            if not isinstance(item, bool):
                raise ScenarioError(f"realism.{key}: expected true or false, got {item!r}")
        elif key == "sample_window":
            item = parse_duration(item, "realism.sample_window")
            if not 0.05 <= item <= 60:
                raise ScenarioError(f"realism.sample_window: expected 0.05 s..60 s, got {item:g} s")
        elif not isinstance(item, int | float) or isinstance(item, bool) or not 0 <= item <= 100:
            raise ScenarioError(f"realism.{key}: expected a number 0..100, got {item!r}")
        values[key] = item
    return replace(Realism(), **values)


def dcgm_settings(value: Any, base: DcgmSettings | None = None) -> DcgmSettings:
    """The ``dcgm`` mapping of a scenario (or CLI overrides) over ``base``; a counters path must exist."""
    raw = _mapping(value, "dcgm") if value is not None else {}
    _known_keys(raw, set(DcgmSettings.__dataclass_fields__), "dcgm")
    settings = replace(base or DcgmSettings(), **raw)
    if settings.xid not in DCGM_XID_FORMS:
        raise ScenarioError(f"dcgm.xid: expected one of {', '.join(DCGM_XID_FORMS)}, got {settings.xid!r}")
    if settings.labels not in DCGM_LABEL_MODES:
        raise ScenarioError(
            f"dcgm.labels: expected one of {', '.join(DCGM_LABEL_MODES)}, got {settings.labels!r}"
        )
    if not isinstance(settings.pod_labels, bool) or not isinstance(settings.pod_uid, bool):
        raise ScenarioError("dcgm.pod_labels and dcgm.pod_uid: expected true or false")
    if settings.counters not in ("shipped", "stock") and not Path(str(settings.counters)).is_file():
        raise ScenarioError(
            f"dcgm.counters: expected shipped, stock or a counters file, got {settings.counters!r}"
        )
    return settings


TOP_KEYS = {
    "dcgm",
    "name",
    "description",
    "seed",
    "start",
    "duration",
    "tick",
    "scrape_failure_rate",
    "cluster",
    "jobs",
    "faults",
    "random_faults",
    "realism",
}


SHIPPED_DIR = Path(__file__).resolve().parent / "scenarios"


def resolve(value: str | Path, folders: tuple[Path, ...] = (SHIPPED_DIR,)) -> Path:
    """A scenario file: ``value`` itself when it is a file, else ``<folder>/<value>.yaml`` in the first
    of ``folders`` that has it (``demo`` -> twin/scenarios/demo.yaml). The one resolver of every
    command that takes ``--scenario``."""
    path = Path(value)
    if path.is_file():
        return path
    for folder in folders:
        candidate = folder / f"{value}.yaml"
        if candidate.is_file():
            return candidate
    where = ", ".join(str(f) for f in folders)
    raise ScenarioError(f"no scenario file {str(value)!r}, and no scenario of that name in {where}")


def load(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML: {exc}") from exc
    scenario = from_dict(_mapping(raw, str(path)))
    return replace(scenario, source=path)


def from_dict(raw: dict[str, Any]) -> Scenario:
    _known_keys(raw, TOP_KEYS, "")
    cluster = _cluster(_mapping(raw.get("cluster"), "cluster"))
    names = node_names(cluster.nodes)
    known = set(names)
    duration = parse_duration(raw.get("duration", "1h"), "duration")
    tick = parse_duration(raw.get("tick", "5s"), "tick")
    if tick <= 0 or duration <= 0:
        raise ScenarioError("duration and tick must be positive")
    seed = raw.get("seed", 1)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ScenarioError(f"seed: expected an integer, got {seed!r}")
    jobs_raw = raw.get("jobs") or []
    faults_raw = raw.get("faults") or []
    if not isinstance(jobs_raw, list) or not isinstance(faults_raw, list):
        raise ScenarioError("jobs and faults must be lists")
    jobs = tuple(_job(j, i, known, duration) for i, j in enumerate(jobs_raw))
    if len({j.id for j in jobs}) != len(jobs):
        raise ScenarioError("jobs: two jobs share an id")
    _check_jobs_fit(jobs, cluster.nodes)
    job_ids = {j.id for j in jobs}
    faults = [_fault(f, i, cluster, job_ids, f"f{i + 1:04d}", duration) for i, f in enumerate(faults_raw)]
    if raw.get("random_faults"):
        faults += _random_faults(
            _mapping(raw["random_faults"], "random_faults"), seed, cluster, duration, len(faults) + 1
        )
    faults.sort(key=lambda f: f.onset)
    rate = raw.get("scrape_failure_rate", 0.0)
    if not isinstance(rate, int | float) or isinstance(rate, bool) or not 0 <= rate < 1:
        raise ScenarioError(f"scrape_failure_rate: expected a probability 0..1, got {rate!r}")
    return Scenario(
        name=str(raw.get("name", "twin")),
        seed=seed,
        start=parse_time(raw.get("start", "2026-11-21T10:00:00Z"), "start"),
        duration=duration,
        tick=tick,
        cluster=cluster,
        jobs=jobs,
        faults=tuple(faults),
        scrape_failure_rate=float(rate),
        description=str(raw.get("description", "")),
        realism=_realism(raw.get("realism")),
        dcgm=dcgm_settings(raw.get("dcgm")),
    )
