"""One job identity whatever the scheduler: which job each node runs, and what the job is called.

Three sources, in order of trust:

1. **slurmrestd** (``--slurm-url``): the RUNNING jobs and their host lists (anomaly/scheduler.py's client).
   Scheduler ``slurm``, job id = Slurm's job id.
2. **dcgm-exporter's ``hpc_job`` label** (``--hpc-job-mapping-dir``, Slurm's prolog writes the files):
   scheduler ``hpc_job-label``, the same job id as slurmrestd gives, so a fleet that loses slurmrestd
   keeps its job names.
3. **Pod labels** (dcgm-exporter ``--kubernetes --kubernetes-enable-pod-labels``): the first key of an
   ordered list of training-job controller labels that the GPU's pod carries. dcgm-exporter writes a
   pod label's key sanitised (every character outside ``[a-zA-Z0-9_]`` becomes ``_``), so the keys
   are matched in that form. Scheduler ``kubernetes``, job id = ``<namespace>/<name>``: two teams may
   both call their JobSet ``pretrain``, and the namespace is what tells them apart.
4. **The pod's owners** (``--pod-owners``: the API server, anomaly/owners.py), for GPU series with
   ``pod`` and ``namespace`` but no controller label (the GPU operator's dcgm-exporter publishes no pod
   labels by default): the outermost controller above the pod, named ``<namespace>/<name>`` as above,
   so the same job has the same id whichever way it was found.

**Declared expert routing.** A MoE job's load moves between its nodes by design, which the detector
cannot tell from a straggler until it has watched the job for a while (docs/anomaly.md, "A job that
says it routes"). Whoever submits the job knows: a Slurm job says so in its comment (the word
``expert-routing``; ``FLEETSIGHT_ROUTING_COMMENT`` sets another pattern), a pod with the label
``fleetsight.io/expert-routing: "true"`` (read from dcgm-exporter's pod labels, or from the pod in the
API server). The job's ``JobRef.declared_routing`` carries it to the detector.

A node a slurmrestd job holds is that job's; label-derived jobs only fill the nodes no slurmrestd job
lists (a fleet of Slurm and Kubernetes nodes side by side, or slurmrestd down). Everything that names a
job (the detector's groups, ``fleetsight_job_node_info``, ``fleetsight_node_jobs_info``, the straggler
series) takes the id from here, so the rules, the health service and the dashboards join on one name.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fleetsight.settings import HPC_JOB_LABEL, KUBERNETES, SLURM

from .declared import declares_routing, sanitize_label_name

if TYPE_CHECKING:
    from .owners import PodOwners

# The label keys of the common training-job controllers, umbrella controllers first: a JobSet's pods
# also carry batch.kubernetes.io/job-name (of its child Job, `<jobset>-workers-0`), so the generic Job
# key comes last. (A Trainer v2 TrainJob runs as a JobSet of the same name: either key names it.)
DEFAULT_POD_LABEL_KEYS: tuple[str, ...] = (
    "jobset.sigs.k8s.io/jobset-name",
    "training.kubeflow.org/job-name",
    "trainer.kubeflow.org/trainjob-name",
    "volcano.sh/job-name",
    "leaderworkerset.sigs.k8s.io/name",
    "batch.kubernetes.io/job-name",
)
POD_LABEL_KEYS_ENV = "FLEETSIGHT_JOB_POD_LABELS"


def pod_label_keys(text: str | None = None) -> tuple[str, ...]:
    """The ordered key list from a comma-separated option or ``FLEETSIGHT_JOB_POD_LABELS``; the
    defaults when neither is set."""
    raw = text if text is not None else os.environ.get(POD_LABEL_KEYS_ENV, "")
    keys = tuple(k.strip() for k in raw.split(",") if k.strip())
    return keys or DEFAULT_POD_LABEL_KEYS


@dataclass(frozen=True)
class JobRef:
    """A job as every consumer names it: ``id`` (the ``hpc_job`` label), its scheduler and namespace."""

    id: str
    scheduler: str
    namespace: str = ""
    declared_routing: bool = False  # the submitter says the job routes experts (module docstring)


@dataclass(frozen=True)
class JobIdentity:
    """Reads a job from one GPU series' labels (``hpc_job``, else the first listed pod label)."""

    pod_label_keys: tuple[str, ...] = DEFAULT_POD_LABEL_KEYS
    owners: PodOwners | None = field(default=None, compare=False)
    _sanitised: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_sanitised", tuple(sanitize_label_name(k) for k in self.pod_label_keys))

    def of_labels(self, labels: Mapping[str, str]) -> JobRef | None:
        if labels.get("hpc_job"):
            return JobRef(str(labels["hpc_job"]), HPC_JOB_LABEL)
        namespace = str(labels.get("namespace") or "")
        routing = declares_routing(labels)
        for key in self._sanitised:
            name = labels.get(key)
            if name:
                job = f"{namespace}/{name}" if namespace else str(name)
                return JobRef(job, KUBERNETES, namespace, routing)
        pod = str(labels.get("pod") or "")
        if self.owners is not None and pod and namespace:
            owner = self.owners.owner(namespace, pod)
            if owner is not None:
                return JobRef(f"{namespace}/{owner.name}", KUBERNETES, namespace, routing or owner.routing)
        return None


@dataclass
class JobMap:
    """Job id -> its JobRef and nodes, built from one window's series and the scheduler's list."""

    refs: dict[str, JobRef] = field(default_factory=dict)
    nodes: dict[str, set[str]] = field(default_factory=dict)

    def add(self, ref: JobRef, node: str) -> None:
        known = self.refs.setdefault(ref.id, ref)
        if ref.declared_routing and not known.declared_routing:  # one pod that says so is enough
            self.refs[ref.id] = ref
        self.nodes.setdefault(ref.id, set()).add(node)

    def node_jobs(self) -> dict[str, list[str]]:
        """Node -> the sorted ids of the jobs on it."""
        out: dict[str, set[str]] = {}
        for job, members in self.nodes.items():
            for node in members:
                out.setdefault(node, set()).add(job)
        return {node: sorted(jobs) for node, jobs in sorted(out.items())}


def from_series(identity: JobIdentity, series: Iterable[tuple[str, Mapping[str, str]]]) -> JobMap:
    """Jobs from (node, labels) of GPU series."""
    found = JobMap()
    for node, labels in series:
        ref = identity.of_labels(labels)
        if ref is not None:
            found.add(ref, node)
    return found


def merge(
    slurm_jobs: Mapping[str, Iterable[str]] | None, labelled: JobMap, routing: Collection[str] = ()
) -> JobMap:
    """slurmrestd's jobs on the nodes they hold (``routing``: the ids of those whose comment declares
    expert routing); label-derived jobs on every other node."""
    if slurm_jobs is None:
        return labelled
    out = JobMap()
    held: set[str] = set()
    for job, members in slurm_jobs.items():
        ref = JobRef(str(job), SLURM, declared_routing=str(job) in routing)
        for node in members:
            out.add(ref, node)
            held.add(node)
    for job, members in labelled.nodes.items():
        for node in sorted(members - held):
            out.add(labelled.refs[job], node)
    return out
