"""What a scenario is once read: the cluster's shape, its jobs, its faults, how real the physics is
and how dcgm-exporter publishes, as frozen dataclasses; and the model profiles a job may run.

Its own module so that the twin's physics and hardware (twin/hardware.py, twin/workload.py, twin/dcgm.py)
read the model without the file loader and its checks (twin/scenario.py), which in turn ask the
hardware for the leaf switches' names: the model sits below both.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .fault_kinds import BENIGN_KINDS

GPUS_PER_NODE = 8
IB_PORTS_PER_NODE = 10
NVSWITCHES_PER_NODE = 4

_P = dict[str, float]
MODEL_PROFILES: dict[str, _P] = {
    # step_time: seconds per optimizer step on healthy hardware; tensor: tensor-pipe activity while
    # computing; compute_share: part of a step that is compute (the rest is exposed communication);
    # power: a GPU's draw while computing, as a share of the 700 W TDP (dense LLM training runs H100s
    # at or near their cap); pipeline: default pipeline stages (tensor parallel fills a node);
    # expert_imbalance: MoE only, spread of the experts' load across nodes (drifts over ~10 min);
    # all_to_all_share: MoE only, the part of a node's InfiniBand bytes that is the experts' token
    # all-to-all (dispatch and combine), which each node receives in proportion to its experts' load.
    "llm-8b": {
        "step_time": 2.5,
        "tensor": 0.42,
        "compute_share": 0.85,
        "fb_used_gib": 62.0,
        "loss0": 10.8,
        "power": 0.93,
        "pipeline": 1,
        "expert_imbalance": 0.0,
        "all_to_all_share": 0.0,
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
        "all_to_all_share": 0.0,
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
        "all_to_all_share": 0.0,
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
        "all_to_all_share": 0.5,
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
        "all_to_all_share": 0.0,
    },
}


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
    # The job also logs one key=value line per data-parallel replica and step (twin/sdc_faults.py):
    # what a job that wants its silent corruption found prints (docs/anomaly.md).
    replica_log: bool = False
    # The submitter says the job routes experts: in its Slurm comment (the word expert-routing) and as
    # its pods' label fleetsight.io/expert-routing (anomaly/declared.py). Scenario key declares_routing;
    # by default a MoE profile's jobs do, the others not.
    declares_routing: bool = False

    @property
    def size(self) -> int:
        return self.nodes if isinstance(self.nodes, int) else len(self.nodes)

    @property
    def slurm_comment(self) -> str:
        """What the submitter writes in ``sbatch --comment``: the model, and expert-routing where the
        job declares it (anomaly/declared.py reads the word)."""
        return f"model profile {self.profile}" + (" expert-routing" if self.declares_routing else "")


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
