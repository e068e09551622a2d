"""The twin's dcgm-exporter: each node's /metrics page, generated from a counters file.

One source of truth: the counters file FleetSight ships (``exporters/dcgm/counters.csv``), or the stock
file of the pinned image (``stock``), or any file (a path). Every record the file has is published under
its name as written, with its ``# HELP``/``# TYPE``; a ``label`` record becomes a label on every series of
the GPU (as ``DCGM_FI_DRIVER_VERSION``). A field the twin simulates reads its Simulation attribute
(:data:`SIMULATED`, keyed by DCGM field id so that legacy and current names both resolve); any other field
publishes what an idle, healthy GPU shows (:data:`IDLE`, else 0).

The page follows dcgm-exporter 4.4.2-4.7.0 (the pinned image), ``internal/pkg/rendermetrics/
render_metrics.go`` and ``internal/pkg/collector/gpu_collector.go``: labels ``gpu, UUID, pci_bus_id,
device, modelName, Hostname``, then the label fields and pod labels (sorted), then the attributes (sorted:
``container, err_code, err_msg, hpc_job, namespace, pod, pod_uid``); integers as ``%d``, doubles as ``%f``.
Label modes (``DcgmSettings.labels``): ``bare``; ``slurm`` (``hpc_job`` on the GPUs a job holds, from
``--hpc-job-mapping-dir``); ``kubernetes`` (``--kubernetes``: pod, namespace, container and, in
4.4.2-4.7.0, ``pod_uid`` (empty unless ``pod_uid`` is on) on the GPUs a pod holds; with ``pod_labels`` the
pod's labels, sanitised). Xid (``DcgmSettings.xid``): ``4x`` adds ``err_code``/``err_msg`` to the Xid
field (a GPU that never had one shows ``err_code="0",err_msg="No Error"`` and 0); ``3x`` is one series whose
value is the last Xid.
"""

from __future__ import annotations

import csv
import functools
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fleetsight.dcgm import SHIPPED_COUNTERS, STOCK_COUNTERS, UPSTREAM, Counter, field_id, read_counters

from . import hardware as hw
from .scenario_model import DcgmSettings
from .sim import G, Simulation
from .workload import JobRun

XID_FIELD_ID = 230  # DCGM_FI_DEV_XID_ERRORS / DCGM_FI_DEV_XID_ERROR
UNKNOWN_XID_TEXT = "Unknown Error"  # gpu_collector.go's unknownErr, for codes past its table
POD_NAMESPACE = "training"
POD_CONTAINER = "trainer"

# DCGM field id -> the Simulation attribute the twin keeps it in (names in the comments).
SIMULATED: dict[int, str] = {
    100: "sm_clock",  # DCGM_FI_DEV_SM_CLOCK
    112: "throttle",  # DCGM_FI_DEV_CLOCKS_EVENT_REASONS (legacy CLOCK_THROTTLE_REASONS)
    140: "mem_temp",  # DCGM_FI_DEV_MEMORY_TEMP
    150: "gpu_temp",  # DCGM_FI_DEV_GPU_TEMP
    155: "power",  # DCGM_FI_DEV_POWER_USAGE
    156: "energy_mj",  # DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION
    164: "power_limit",  # DCGM_FI_DEV_ENFORCED_POWER_LIMIT
    170: "fabric_status",  # DCGM_FI_DEV_FABRIC_MANAGER_STATUS (3 success, 1 not started: Fabric Manager down)
    202: "pcie_replay",  # DCGM_FI_DEV_PCIE_REPLAY_COUNTER
    203: "gpu_util",  # DCGM_FI_DEV_GPU_UTIL
    204: "mem_copy_util",  # DCGM_FI_DEV_MEM_COPY_UTIL
    230: "xid_last",  # DCGM_FI_DEV_XID_ERRORS
    252: "fb_used",  # DCGM_FI_DEV_FB_USED
    310: "ecc_sbe",  # DCGM_FI_DEV_ECC_SBE_VOL_TOTAL
    311: "ecc_dbe",  # DCGM_FI_DEV_ECC_DBE_VOL_TOTAL
    393: "remap_uncorrectable",  # DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS
    394: "remap_correctable",  # DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS
    395: "remap_failed",  # DCGM_FI_DEV_ROW_REMAP_FAILURE
    396: "remap_pending",  # DCGM_FI_DEV_ROW_REMAP_PENDING
    409: "nvlink_crc_flit",  # DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL
    419: "nvlink_crc_data",  # DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL
    429: "nvlink_replay",  # DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL
    439: "nvlink_recovery",  # DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL
    449: "nvlink_total",  # DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL
    1001: "gr_active",  # DCGM_FI_PROF_GR_ENGINE_ACTIVE
    1002: "sm_active",  # DCGM_FI_PROF_SM_ACTIVE
    1003: "sm_occupancy",  # DCGM_FI_PROF_SM_OCCUPANCY
    1004: "tensor",  # DCGM_FI_PROF_PIPE_TENSOR_ACTIVE
    1005: "dram_active",  # DCGM_FI_PROF_DRAM_ACTIVE
    1009: "pcie_tx",  # DCGM_FI_PROF_PCIE_TX_BYTES
    1010: "pcie_rx",  # DCGM_FI_PROF_PCIE_RX_BYTES
}
# Fields the twin derives or holds constant, as a healthy H100 reads them: memory clock fixed at its
# maximum, FB free = total - used - reserved, no vGPU (license status 0), no encoder/decoder use.
FB_RESERVED_MIB = 512.0
IDLE: dict[int, float] = {
    101: hw.GPU_MEM_CLOCK,  # DCGM_FI_DEV_MEM_CLOCK
    206: 0.0,  # DCGM_FI_DEV_ENC_UTIL
    207: 0.0,  # DCGM_FI_DEV_DEC_UTIL
    253: FB_RESERVED_MIB,  # DCGM_FI_DEV_FB_RESERVED
    526: 0.0,  # DCGM_FI_DEV_VGPU_LICENSE_STATUS
}
FB_FREE_ID = 251
# DCGM fields of type double (dcgm_fields.h DCGM_FT_DOUBLE): dcgm-exporter prints them with %f.
DOUBLE_IDS = {155, 164, 1001, 1002, 1003, 1004, 1005}
# Label fields the twin can fill; any other `label` record gets an empty value, as DCGM's blank.
LABEL_VALUES: dict[int, str] = {1: hw.DRIVER_VERSION}  # DCGM_FI_DRIVER_VERSION


@dataclass(frozen=True)
class Field:
    """One record of the counters file, resolved to its DCGM field id."""

    name: str
    prom_type: str
    help: str
    id: int


@dataclass(frozen=True)
class PodInfo:
    """What the kubelet's pod-resources API and the API server tell dcgm-exporter about a GPU's pod."""

    name: str
    namespace: str
    container: str
    uid: str
    labels: dict[str, str]


def counters_path(counters: str) -> Path:
    """``shipped``, ``stock`` or a path to a counters file."""
    return {"shipped": SHIPPED_COUNTERS, "stock": STOCK_COUNTERS}.get(counters, Path(counters))


@functools.cache
def load_fields(counters: str = "shipped") -> tuple[Field, ...]:
    """The counters file's records with their field ids; a name no go-dcgm table knows is an error, as
    dcgm-exporter refuses to start on it."""
    path = counters_path(counters)
    fields = []
    for counter in read_counters(path):
        fid = field_id(counter.field)
        if fid is None:
            raise ValueError(f"{path}: {counter.field} is no DCGM field: dcgm-exporter would not start")
        fields.append(Field(counter.field, counter.prom_type, counter.help, fid))
    return tuple(fields)


def metric_fields(counters: str = "shipped") -> tuple[Field, ...]:
    """The records that become metrics (every type but ``label``)."""
    return tuple(f for f in load_fields(counters) if f.prom_type != "label")


def attribute_of(name: str) -> str | None:
    """The Simulation attribute a field (any of its names) is kept in, None if the twin derives it."""
    fid = field_id(name)
    return SIMULATED.get(fid) if fid is not None else None


def values(sim: Simulation, fid: int) -> np.ndarray:
    """A field's value on every GPU of the cluster: [node, gpu]."""
    if fid in SIMULATED:
        return getattr(sim, SIMULATED[fid])
    if fid == FB_FREE_ID:
        return hw.GPU_FB_MIB - FB_RESERVED_MIB - sim.fb_used
    return np.full(sim.power.shape, IDLE.get(fid, 0.0))


def values_by_name(sim: Simulation, name: str) -> np.ndarray:
    fid = field_id(name)
    if fid is None:
        raise KeyError(f"{name} is no DCGM field")
    return values(sim, fid)


@functools.cache
def xid_messages() -> tuple[str, ...]:
    """dcgm-exporter 4.4.2-4.7.0's err_msg texts by code (vendored: upstream/xid-messages.csv)."""
    with (UPSTREAM / "xid-messages.csv").open(newline="") as handle:
        rows = {int(r["code"]): r["err_msg"] for r in csv.DictReader(handle)}
    return tuple(rows.get(code, "") for code in range(max(rows) + 1))


def xid_attributes(code: int) -> dict[str, str]:
    """The labels dcgm-exporter 4.x puts on the Xid field for a value."""
    messages = xid_messages()
    return {
        "err_code": str(code),
        "err_msg": messages[code] if 0 <= code < len(messages) else UNKNOWN_XID_TEXT,
    }


INVALID_LABEL_CHARS = re.compile(r"[^a-zA-Z0-9_]")


def sanitize_label_name(name: str) -> str:
    """A pod label's key as dcgm-exporter's utils.SanitizeLabelName writes it (non [a-zA-Z0-9_] -> _)."""
    return INVALID_LABEL_CHARS.sub("_", name)


def running_job(sim: Simulation, node: int) -> JobRun | None:
    job = sim._job_on(node)
    return job if job is not None and job.state == "RUNNING" else None


def job_pod(sim: Simulation, node: int, job: JobRun) -> PodInfo:
    """The pod holding a node's GPUs under Kubernetes: one pod per node of a running job, named and
    labelled as the job's controller (scenario key ``controller``) makes them."""
    rank = int(np.nonzero(job.nodes == node)[0][0]) if node in job.nodes else 0
    spec = job.spec
    uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"twin:{sim.scenario.seed}:{spec.id}:{job.attempt}:{rank}"))
    if spec.controller == "pytorchjob":
        name, labels = pytorchjob_pod(spec.name, rank)
        container = "pytorch"  # the training operator requires this container name
    else:
        name, labels = jobset_pod(spec.name, rank, spec.size)
        container = POD_CONTAINER
    labels["fleetsight.io/job-id"] = spec.id
    if spec.declares_routing:
        labels["fleetsight.io/expert-routing"] = "true"  # the submitter's word (anomaly/declared.py)
    return PodInfo(name, spec.namespace, container, uid, labels)


def jobset_pod(jobset: str, rank: int, size: int) -> tuple[str, dict[str, str]]:
    """A JobSet worker (replicated job ``workers``, one Job of ``size`` indexed pods), labelled as the
    JobSet controller and the Job controller label it."""
    return f"{jobset}-workers-0-{rank}", {
        "jobset.sigs.k8s.io/jobset-name": jobset,
        "jobset.sigs.k8s.io/replicatedjob-name": "workers",
        "jobset.sigs.k8s.io/replicatedjob-replicas": "1",
        "jobset.sigs.k8s.io/job-index": "0",
        "batch.kubernetes.io/job-name": f"{jobset}-workers-0",
        "batch.kubernetes.io/job-completion-index": str(rank),
        "job-name": f"{jobset}-workers-0",
    }


def pytorchjob_pod(job: str, rank: int) -> tuple[str, dict[str, str]]:
    """A Kubeflow PyTorchJob replica: rank 0 the master, the others workers (training-operator v1)."""
    kind, index = ("master", 0) if rank == 0 else ("worker", rank - 1)
    labels = {
        "training.kubeflow.org/job-name": job,
        "training.kubeflow.org/operator-name": "pytorchjob-controller",
        "training.kubeflow.org/replica-type": kind,
        "training.kubeflow.org/replica-index": str(index),
    }
    if kind == "master":
        labels["training.kubeflow.org/job-role"] = "master"
    return f"{job}-{kind}-{index}", labels


def job_scheduler(settings: DcgmSettings, job: JobRun) -> str:
    """How the job shows on its GPUs: its own ``scheduler`` key, else the exporter's label mode."""
    if settings.labels == "bare":
        return "bare"
    return job.spec.scheduler or settings.labels


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _join(labels: dict[str, str], ordered: bool) -> str:
    keys = sorted(labels) if ordered else list(labels)
    return "".join(f',{k}="{_quote(labels[k])}"' for k in keys)


def identity_labels(sim: Simulation, node: int, gpu: int) -> str:
    """The labels every series of a GPU starts with, in dcgm-exporter's order (render_metrics.go)."""
    return (
        f'gpu="{gpu}",UUID="{sim.gpu_uuids[node][gpu]}",pci_bus_id="{hw.nvml_bus_id(hw.GPU_BDFS[gpu])}",'
        f'device="nvidia{gpu}",modelName="{hw.GPU_MODEL}",Hostname="{sim.nodes[node]}"'
    )


def label_fields_text(settings: DcgmSettings) -> dict[str, str]:
    return {
        f.name: LABEL_VALUES.get(f.id, "") for f in load_fields(settings.counters) if f.prom_type == "label"
    }


def workload_labels(
    sim: Simulation, node: int, settings: DcgmSettings, job: JobRun | None
) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, attributes) that the job running on the node adds to its GPUs' series: hpc_job under
    Slurm job mapping; pod, namespace, container, pod_uid and (with pod labels) the pod's labels under
    Kubernetes. The twin's jobs hold all GPUs of their nodes."""
    if job is None or job_scheduler(settings, job) == "bare":
        return {}, {}
    if job_scheduler(settings, job) == "slurm":
        return {}, {"hpc_job": job.spec.id}
    pod = job_pod(sim, node, job)
    attributes = {"pod": pod.name, "namespace": pod.namespace, "container": pod.container}
    # 4.4.2-4.7.0 always sets pod_uid (empty unless --kubernetes-enable-pod-uid); later releases only
    # set it with that flag.
    attributes["pod_uid"] = pod.uid if settings.pod_uid else ""
    labels = {sanitize_label_name(k): v for k, v in pod.labels.items()} if settings.pod_labels else {}
    return labels, attributes


def gpu_labels(
    sim: Simulation,
    node: int,
    gpu: int,
    job: JobRun | None,
    extra: dict[str, str] | None = None,
) -> str:
    """A GPU's full label set for one series while ``job`` runs on its node; ``extra``: the series' own
    attributes (err_code/err_msg)."""
    settings = sim.scenario.dcgm
    labels, attributes = workload_labels(sim, node, settings, job)
    labels = {**label_fields_text(settings), **labels}
    return (
        identity_labels(sim, node, gpu) + _join(labels, True) + _join({**attributes, **(extra or {})}, True)
    )


def format_value(fid: int, value: float) -> str:
    return f"{float(value):f}" if fid in DOUBLE_IDS else str(int(value))


def splits_by_value(sim: Simulation, field: Field) -> bool:
    """Whether the field's value is also a label (4.x Xid: err_code/err_msg), so each value is a series."""
    return field.id == XID_FIELD_ID and sim.scenario.dcgm.xid == "4x"


def series_labels(
    sim: Simulation, node: int, gpu: int, field: Field, value: float, job: JobRun | None
) -> str:
    extra = xid_attributes(int(value)) if splits_by_value(sim, field) else None
    return gpu_labels(sim, node, gpu, job, extra)


def _series(
    sim: Simulation, node: int, field: Field, present: list[int], prefix: dict[int, str]
) -> list[str]:
    column = values(sim, field.id)[node]
    job = running_job(sim, node)
    lines = []
    for gpu in present:
        value = column[gpu]
        labels = (
            series_labels(sim, node, gpu, field, value, job) if splits_by_value(sim, field) else prefix[gpu]
        )
        lines.append(f"{field.name}{{{labels}}} {format_value(field.id, value)}\n")
    return lines


def metrics(sim: Simulation, node: int) -> str:
    """One node's dcgm-exporter /metrics page."""
    settings = sim.scenario.dcgm
    present = [g for g in range(G) if sim.gpu_present[node, g]]
    job = running_job(sim, node)
    prefix = {g: gpu_labels(sim, node, g, job) for g in present}
    out: list[str] = []
    for field in metric_fields(settings.counters):
        out.append(f"# HELP {field.name} {field.help}\n# TYPE {field.name} {field.prom_type}\n")
        out.extend(_series(sim, node, field, present, prefix))
    return "".join(out)


def counters(settings: DcgmSettings) -> list[Counter]:
    """The counters file a twin with these settings publishes (for tests and docs)."""
    return read_counters(counters_path(settings.counters))
