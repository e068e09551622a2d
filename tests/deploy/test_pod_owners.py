"""A GPU pod's job from its owners (anomaly/owners.py), on the real API server with the chart installed:
the anomaly service's own ServiceAccount (the chart's RBAC, nothing more) reads a JobSet's Job, a
PyTorchJob's pod, a LeaderWorkerSet's StatefulSet and a plain Job, as dcgm-exporter's series without
pod labels name them (pod and namespace only: the GPU operator's default). A pod that is gone or
forbidden names no job and says why, and is retried later.

The controllers (JobSet, training operator, LWS) are not installed: their objects are what their
controllers make, written here (owner references to kinds this API server does not serve are kept:
the garbage collector cannot resolve them, so it never deletes their dependents)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kube import NAMESPACE, RELEASE, Cluster

from anomaly.declared import ROUTING_POD_LABEL
from anomaly.jobs import JobIdentity, from_series
from anomaly.owners import RETRY_AFTER_S, Owner, PodOwners
from fleetsight.kubeapi import from_kubeconfig

TEAM = "team-owners"
ANOMALY = f"{RELEASE}-fleetsight-anomaly"


def owner_ref(api_version: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": True}


def pod(name: str, owner: dict[str, Any] | None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, **({"labels": labels} if labels else {})}
    if owner:
        meta["ownerReferences"] = [owner]
    return {"metadata": meta, "spec": {"containers": [{"name": "trainer", "image": "example.org/train:1"}]}}


def job(name: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if owner:
        meta["ownerReferences"] = [owner]
    template = pod("x", None)["spec"]
    return {
        "metadata": meta,
        "spec": {
            "suspend": True,  # no job controller runs here; suspended, it never would start pods
            "template": {"spec": {**template, "restartPolicy": "Never"}},
        },
    }


def statefulset(name: str, owner: dict[str, Any]) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "metadata": {"name": name, "ownerReferences": [owner]},
        "spec": {
            "replicas": 0,
            "serviceName": name,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod("x", None)["spec"]},
        },
    }


@pytest.fixture(scope="module")
def training_objects(release: Cluster) -> dict[str, str]:
    """Pod name -> the job id the owners must give it."""
    release.create("/api/v1/namespaces", {"metadata": {"name": TEAM}})
    batch, apps, core = (
        f"/apis/batch/v1/namespaces/{TEAM}",
        f"/apis/apps/v1/namespaces/{TEAM}",
        f"/api/v1/namespaces/{TEAM}",
    )
    jobset = owner_ref("jobset.x-k8s.io/v1alpha2", "JobSet", "pretrain-o", str(uuid.uuid4()))
    child = release.create(f"{batch}/jobs", job("pretrain-o-workers-0", jobset))
    release.create(
        f"{core}/pods",
        pod(
            "pretrain-o-workers-0-0",
            owner_ref("batch/v1", "Job", "pretrain-o-workers-0", child["metadata"]["uid"]),
        ),
    )
    pytorchjob = owner_ref("kubeflow.org/v1", "PyTorchJob", "finetune-o", str(uuid.uuid4()))
    # A MoE fine-tune whose submitter says it routes experts (anomaly/declared.py).
    release.create(f"{core}/pods", pod("finetune-o-master-0", pytorchjob, {ROUTING_POD_LABEL: "true"}))
    lws = owner_ref("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "serve-o", str(uuid.uuid4()))
    sts = release.create(f"{apps}/statefulsets", statefulset("serve-o", lws))
    release.create(
        f"{core}/pods",
        pod("serve-o-0", owner_ref("apps/v1", "StatefulSet", "serve-o", sts["metadata"]["uid"])),
    )
    plain = release.create(f"{batch}/jobs", job("sweep-o", None))
    release.create(
        f"{core}/pods", pod("sweep-o-0", owner_ref("batch/v1", "Job", "sweep-o", plain["metadata"]["uid"]))
    )
    release.create(f"{core}/pods", pod("bare-o", None))
    return {
        "pretrain-o-workers-0-0": f"{TEAM}/pretrain-o",
        "finetune-o-master-0": f"{TEAM}/finetune-o",
        "serve-o-0": f"{TEAM}/serve-o",
        "sweep-o-0": f"{TEAM}/sweep-o",
    }


@pytest.fixture
def owners(release: Cluster, tmp_path: Path) -> Iterator[PodOwners]:
    api = from_kubeconfig(
        release.service_account_kubeconfig(NAMESPACE, ANOMALY, tmp_path / "anomaly.kubeconfig")
    )
    try:
        yield PodOwners(api)
    finally:
        api.close()


def test_the_anomaly_service_account_names_each_controllers_job_from_unlabelled_series(
    training_objects: dict[str, str], owners: PodOwners
) -> None:
    identity = JobIdentity(owners=owners)
    series = [
        (f"gpu-{i}", {"pod": name, "namespace": TEAM, "container": "trainer", "gpu": "0"})
        for i, name in enumerate([*training_objects, "bare-o"])
    ]
    jobs = from_series(identity, series)
    found = {next(iter(nodes)): job for job, nodes in jobs.nodes.items()}
    wanted = {f"gpu-{i}": job for i, job in enumerate(training_objects.values())}
    assert found == wanted  # the bare pod (gpu-4) is in no job
    assert owners.errors == 0, owners.last_error
    assert owners.owner(TEAM, "serve-o-0") == Owner("LeaderWorkerSet", "serve-o")


def test_a_pods_label_declares_its_jobs_expert_routing(
    training_objects: dict[str, str], owners: PodOwners
) -> None:
    """The GPU operator's series carry no pod labels: the declaration is read from the pod itself."""
    assert owners.owner(TEAM, "finetune-o-master-0") == Owner("PyTorchJob", "finetune-o", routing=True)
    ref = JobIdentity(owners=owners).of_labels({"pod": "finetune-o-master-0", "namespace": TEAM})
    assert ref is not None and ref.id == f"{TEAM}/finetune-o" and ref.declared_routing
    ref = JobIdentity(owners=owners).of_labels({"pod": "pretrain-o-workers-0-0", "namespace": TEAM})
    assert ref is not None and not ref.declared_routing


def test_controller_labels_still_win_over_owners(training_objects: dict[str, str], owners: PodOwners) -> None:
    labels = {"pod": "finetune-o-master-0", "namespace": TEAM, "jobset_sigs_k8s_io_jobset_name": "other"}
    ref = JobIdentity(owners=owners).of_labels(labels)
    assert ref is not None and ref.id == f"{TEAM}/other"


def test_a_pod_that_is_gone_or_forbidden_names_no_job_and_is_retried_later(
    training_objects: dict[str, str], owners: PodOwners
) -> None:
    now = [1000.0]
    owners.clock = lambda: now[0]
    assert owners.owner(TEAM, "no-such-pod") is None
    assert owners.errors == 1 and "404" in owners.last_error
    assert owners.owner(TEAM, "no-such-pod") is None and owners.errors == 1  # not asked again at once
    now[0] += RETRY_AFTER_S + 1
    assert owners.owner(TEAM, "no-such-pod") is None and owners.errors == 2
    # The ServiceAccount may read pods, jobs and statefulsets, nothing else: a secret is refused (403).
    with pytest.raises(owners.api.error) as refused:
        owners.api.request("GET", f"/api/v1/namespaces/{TEAM}/secrets")
    assert refused.value.status == 403
