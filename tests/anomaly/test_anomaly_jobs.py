"""One job identity (anomaly/jobs.py): slurmrestd, dcgm-exporter's hpc_job, and the training-job
controllers' pod labels as dcgm-exporter writes them (sanitised), with the namespace; and the job-node
series the service publishes from it. The label sets are the twin's (twin/dcgm.py), which follow
dcgm-exporter 4.4.2-4.7.0's kubernetes.go; the real-server path is tests/deploy/test_jobs_kubernetes.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from anomaly.jobs import (
    DEFAULT_POD_LABEL_KEYS,
    HPC_JOB_LABEL,
    KUBERNETES,
    SLURM,
    JobIdentity,
    JobRef,
    from_series,
    merge,
    pod_label_keys,
)
from anomaly.service import JobNode, job_families, job_nodes
from anomaly.vectors import build_window
from twin.dcgm import jobset_pod, pytorchjob_pod, sanitize_label_name


def pod_series(namespace: str, labels: dict[str, str]) -> dict[str, str]:
    """The labels dcgm-exporter puts on a GPU a pod holds (--kubernetes --kubernetes-enable-pod-labels)."""
    return {sanitize_label_name(k): v for k, v in labels.items()} | {"namespace": namespace, "pod": "p"}


def test_each_controllers_pod_labels_name_the_job_with_its_namespace() -> None:
    identity = JobIdentity()
    _, jobset = jobset_pod("pretrain", 3, 4)
    _, pytorch = pytorchjob_pod("finetune", 1)
    cases = {
        "jobset": (jobset, "research/pretrain"),
        "pytorchjob": (pytorch, "research/finetune"),
        "trainjob": ({"trainer.kubeflow.org/trainjob-name": "tj"}, "research/tj"),
        "volcano": ({"volcano.sh/job-name": "vc"}, "research/vc"),
        "lws": ({"leaderworkerset.sigs.k8s.io/name": "lws"}, "research/lws"),
        "job": ({"batch.kubernetes.io/job-name": "plain"}, "research/plain"),
    }
    for case, (labels, expected) in cases.items():
        ref = identity.of_labels(pod_series("research", labels))
        assert ref is not None and (ref.id, ref.scheduler, ref.namespace) == (
            expected,
            KUBERNETES,
            "research",
        ), case
    # A JobSet's pod also carries its child Job's name: the umbrella controller's key wins.
    assert identity.of_labels(pod_series("r", jobset)).id == "r/pretrain"  # type: ignore[union-attr]
    assert identity.of_labels({"namespace": "r", "pod": "p", "app": "web"}) is None
    assert identity.of_labels({"hpc_job": "4242", "namespace": "r"}) == identity.of_labels(
        {"hpc_job": "4242"}
    )
    assert identity.of_labels({"hpc_job": "4242"}).scheduler == HPC_JOB_LABEL  # type: ignore[union-attr]


def test_the_key_list_is_ordered_and_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    labels = pod_series("ns", {"batch.kubernetes.io/job-name": "child", "volcano.sh/job-name": "parent"})
    assert JobIdentity().of_labels(labels).id == "ns/parent"  # type: ignore[union-attr]
    assert JobIdentity(("batch.kubernetes.io/job-name",)).of_labels(labels).id == "ns/child"  # type: ignore[union-attr]
    assert pod_label_keys("a.io/x, b.io/y") == ("a.io/x", "b.io/y")
    monkeypatch.setenv("FLEETSIGHT_JOB_POD_LABELS", "volcano.sh/job-name")
    assert pod_label_keys() == ("volcano.sh/job-name",)
    monkeypatch.delenv("FLEETSIGHT_JOB_POD_LABELS")
    assert pod_label_keys() == DEFAULT_POD_LABEL_KEYS


def test_slurm_holds_its_nodes_and_labels_fill_the_rest() -> None:
    series = [
        ("n1", {"hpc_job": "77"}),
        ("n2", pod_series("ml", {"jobset.sigs.k8s.io/jobset-name": "js"})),
        ("n3", pod_series("ml", {"jobset.sigs.k8s.io/jobset-name": "js"})),
    ]
    labelled = from_series(JobIdentity(), series)
    assert labelled.nodes == {"77": {"n1"}, "ml/js": {"n2", "n3"}}
    merged = merge({"77": ["n1"], "78": ["n3"]}, labelled)  # slurmrestd says n3 runs Slurm job 78
    assert merged.nodes == {"77": {"n1"}, "78": {"n3"}, "ml/js": {"n2"}}
    assert merged.refs["77"].scheduler == SLURM and merged.refs["ml/js"].scheduler == KUBERNETES
    assert merge(None, labelled) is labelled  # slurmrestd down: the labels alone


def sample(node: str, gpu: int, value: float, **labels: str) -> dict:
    return {"metric": {"Hostname": node, "gpu": str(gpu), **labels}, "value": [0, str(value)]}


def test_the_window_and_the_job_node_series_from_pod_labelled_gpus() -> None:
    js = pod_series("training", jobset_pod("pretrain-k", 0, 2)[1])
    pt = pod_series("team-b", pytorchjob_pod("finetune-p", 0)[1])
    tensor = [
        sample("n1", 0, 0.5, **js),
        sample("n2", 0, 0.5, **js),
        sample("n3", 0, 0.4, cluster="c9", **pt),
    ]
    window = build_window(100.0, {"tensor": tensor}, {}, None)
    assert {j: [window.nodes[i] for i in m] for j, m in window.jobs.items()} == {
        "team-b/finetune-p": ["n3"],
        "training/pretrain-k": ["n1", "n2"],
    }
    pairs = job_nodes(window, cluster="fallback")
    assert [(p.cluster, p.node, p.job.id) for p in pairs] == [
        ("c9", "n3", "team-b/finetune-p"),
        ("fallback", "n1", "training/pretrain-k"),
        ("fallback", "n2", "training/pretrain-k"),
    ]
    families = scrape(pairs)
    assert families["fleetsight_job_node_info"] == {
        ("c9", "n3", "team-b/finetune-p", "team-b", "kubernetes"),
        ("fallback", "n1", "training/pretrain-k", "training", "kubernetes"),
        ("fallback", "n2", "training/pretrain-k", "training", "kubernetes"),
    }
    assert ("fallback", "n1", "training/pretrain-k") in families["fleetsight_node_jobs_info"]


def test_a_node_of_two_jobs_lists_both_sorted_in_one_series() -> None:
    pairs = [
        JobNode("", "n1", JobRef("b/x", KUBERNETES, "b")),
        JobNode("", "n1", JobRef("a/y", KUBERNETES, "a")),
    ]
    assert scrape(pairs)["fleetsight_node_jobs_info"] == {("", "n1", "a/y,b/x")}


def scrape(pairs: list[JobNode]) -> dict[str, set[tuple[str, ...]]]:
    """The families as Prometheus would read them from /metrics."""

    class Pairs(Collector):
        def collect(self) -> Iterator[GaugeMetricFamily]:
            return job_families(pairs)

    registry = CollectorRegistry()
    registry.register(Pairs())
    out: dict[str, set[tuple[str, ...]]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            assert s.value == 1.0
            out.setdefault(s.name, set()).add(tuple(s.labels.get(k, "") for k in label_order(s.name)))
    return out


def label_order(name: str) -> tuple[str, ...]:
    if name == "fleetsight_job_node_info":
        return ("cluster", "node", "hpc_job", "namespace", "scheduler")
    return ("cluster", "node", "jobs")
