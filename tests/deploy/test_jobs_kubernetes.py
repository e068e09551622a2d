"""Stragglers on Kubernetes, end to end on real servers (issue 35): the real kube-apiserver with kwok
holds the pods of a JobSet and of a PyTorchJob on simulated GPU nodes; the twin publishes those pods'
GPUs as dcgm-exporter does under `--kubernetes --kubernetes-enable-pod-labels` (pod labels only: no
hpc_job, no slurmrestd job); a real Prometheus scrapes it and the anomaly service and evaluates the
rules. The service flags the JobSet's power-braked node under the job's name, publishes the job-node
series, and the node's GPU alert carries the job.

The pods come from the twin's own pod factory (twin/dcgm.py ``jobset_pod``, ``pytorchjob_pod``), so
the API server's validation holds the twin's picture of the controllers' labels to Kubernetes's rules,
and the job ids the service reports are compared with the ids read back from the API server's pods.

Run twice: with pod labels on the GPU series, and as NVIDIA's GPU operator runs dcgm-exporter by default
(pod and namespace only), where the service (``--pod-owners``) names the jobs from the pods' owners in
the API server (the JobSet's pods belong to its Job, which belongs to the JobSet; the PyTorchJob owns its
pods): the same ids either way.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kube import Cluster

from anomaly.jobs import JobIdentity, sanitize_label_name
from fleetsight.settings import REPO_ROOT
from support import FLEETSIGHT, free_port, prometheus_process, wait_until
from twin.dcgm import jobset_pod, pytorchjob_pod

JOBSET = {"name": "pretrain-k", "namespace": "training", "nodes": ["n0001", "n0002", "n0003", "n0004"]}
PYTORCHJOB = {"name": "finetune-p", "namespace": "team-b", "nodes": ["n0005", "n0006"]}
SCENARIO = {
    "name": "k8s_psu_live",
    "description": "a JobSet and a PyTorchJob on Kubernetes; a PSU of n0002 (the JobSet's) fails at 3m",
    "seed": 78,
    "start": "2026-11-22T06:00:00Z",
    "duration": "15m",
    "tick": "5s",
    "cluster": {"name": "k8s-live", "nodes": 6},
    "dcgm": {"labels": "kubernetes", "pod_labels": True},
    "jobs": [
        {
            "id": "3001",
            "name": JOBSET["name"],
            "nodes": "n0001-n0004",
            "profile": "llm-20b",
            "checkpoint_interval": "2h",
            "scheduler": "kubernetes",
            "controller": "jobset",
            "namespace": JOBSET["namespace"],
        },
        {
            "id": "3002",
            "name": PYTORCHJOB["name"],
            "nodes": "n0005-n0006",
            "profile": "llm-20b",
            "checkpoint_interval": "2h",
            "scheduler": "kubernetes",
            "controller": "pytorchjob",
            "namespace": PYTORCHJOB["namespace"],
        },
    ],
    "faults": [
        {
            "kind": "psu_failure",
            "target": {"node": "n0002", "psu": 1},
            "onset": "3m",
            "duration": "6m",
            "magnitude": 150,
        }
    ],
}
FAST_CYCLES = ("--interval", "2", "--window", "8s", "--step", "1s")


def owner(api_version: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": True}


def pod_body(
    name: str, node: str, labels: dict[str, str], container: str, owned_by: dict[str, Any]
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels, "ownerReferences": [owned_by]},
        "spec": {
            "nodeName": node,
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "containers": [{"name": container, "image": "example.org/train:1"}],
        },
    }


def create_training_pods(cluster: Cluster) -> None:
    """The JobSet's worker pods and the PyTorchJob's master and worker, one per simulated GPU node, owned
    as their controllers own them (no controller runs here: the Job is suspended, the JobSet and
    PyTorchJob are only named, which the garbage collector leaves alone as it cannot resolve them)."""
    for job in (JOBSET, PYTORCHJOB):
        cluster.create("/api/v1/namespaces", {"metadata": {"name": job["namespace"]}})
    jobset = owner("jobset.x-k8s.io/v1alpha2", "JobSet", JOBSET["name"], str(uuid.uuid4()))
    child_name = f"{JOBSET['name']}-workers-0"
    child = cluster.create(
        f"/apis/batch/v1/namespaces/{JOBSET['namespace']}/jobs",
        {
            "metadata": {"name": child_name, "ownerReferences": [jobset]},
            "spec": {
                "suspend": True,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "trainer", "image": "example.org/train:1"}],
                    }
                },
            },
        },
    )
    by_job = owner("batch/v1", "Job", child_name, child["metadata"]["uid"])
    for rank, node in enumerate(JOBSET["nodes"]):
        name, labels = jobset_pod(JOBSET["name"], rank, len(JOBSET["nodes"]))
        path = f"/api/v1/namespaces/{JOBSET['namespace']}/pods"
        cluster.create(path, pod_body(name, node, labels, "trainer", by_job))
    pytorchjob = owner("kubeflow.org/v1", "PyTorchJob", PYTORCHJOB["name"], str(uuid.uuid4()))
    for rank, node in enumerate(PYTORCHJOB["nodes"]):
        name, labels = pytorchjob_pod(PYTORCHJOB["name"], rank)
        path = f"/api/v1/namespaces/{PYTORCHJOB['namespace']}/pods"
        cluster.create(path, pod_body(name, node, labels, "pytorch", pytorchjob))


def jobs_from_api(cluster: Cluster) -> dict[str, set[str]]:
    """Job id -> nodes, from the Running pods the API server holds, read the way the service reads
    dcgm-exporter's series: the pod's labels sanitised, the first controller key, the namespace."""
    identity = JobIdentity()
    out: dict[str, set[str]] = {}
    for namespace in (JOBSET["namespace"], PYTORCHJOB["namespace"]):
        for pod in cluster.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
            # kwok's default pod-complete stage ends a Job's pods at once (the JobSet's here); the twin
            # keeps their GPUs training, which is what the series show: started is what counts
            if pod["status"].get("phase") not in ("Running", "Succeeded"):
                continue
            labels = {sanitize_label_name(k): v for k, v in pod["metadata"]["labels"].items()}
            ref = identity.of_labels({**labels, "namespace": namespace})
            assert ref is not None, pod["metadata"]
            out.setdefault(ref.id, set()).add(pod["spec"]["nodeName"])
    return out


def start_prometheus(folder: Path, port: int, twin_url: str, anomaly_port: int) -> subprocess.Popen[bytes]:
    """A real Prometheus with FleetSight's GPU and job rules, scraping the twin's dcgm-exporter pages
    (Hostname -> node, as metrics/prometheus.yml relabels) and the anomaly service."""
    relabel = [{"source_labels": ["Hostname"], "regex": "(.+)", "target_label": "node", "replacement": "$1"}]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(REPO_ROOT / "rules" / "gpu.yml"), str(REPO_ROOT / "rules" / "jobs.yml")],
        "scrape_configs": [
            {
                "job_name": "dcgm",
                "http_sd_configs": [{"url": f"{twin_url}/targets/dcgm.json", "refresh_interval": "2s"}],
                "metric_relabel_configs": relabel,
            },
            {"job_name": "anomaly", "static_configs": [{"targets": [f"127.0.0.1:{anomaly_port}"]}]},
        ],
    }
    return prometheus_process(folder, port, config, folder / "prometheus.log")


def get_json(url: str, params: dict[str, str] | None = None) -> Any:
    try:
        response = httpx.get(url, params=params, timeout=5)
        return response.json() if response.is_success else None
    except (httpx.HTTPError, ValueError):
        return None


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in reversed(started):
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


def start_twin(tmp_path: Path, processes: list[subprocess.Popen[bytes]], pod_labels: bool) -> str:
    scenario = tmp_path / "k8s_psu_live.yaml"
    scenario.write_text(
        yaml.safe_dump({**SCENARIO, "dcgm": {"labels": "kubernetes", "pod_labels": pod_labels}})
    )
    log = tmp_path / "twin.log"
    command = [*FLEETSIGHT, "twin", "run", "--scenario", str(scenario), "--out", str(tmp_path / "twin")]
    command += ["--speed", "8", "--serve", "--listen", "127.0.0.1:0"]
    processes.append(subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=REPO_ROOT))
    return wait_until(
        lambda: (m := re.search(r"event=serving url=(\S+)", log.read_text())) and m.group(1),
        timeout=60,
        what="the twin to serve",
    )


def start_anomaly(
    tmp_path: Path, prometheus_url: str, port: int, kubeconfig: Path | None
) -> subprocess.Popen[bytes]:
    """The service with no --slurm-url: jobs can only come from the GPUs' pod labels, or with a
    kubeconfig from the pods' owners."""
    args = [*FLEETSIGHT, "anomaly", "serve", "--prometheus-url", prometheus_url]
    args += ["--listen", f"127.0.0.1:{port}", "--cluster", "k8s-live", *FAST_CYCLES]
    if kubeconfig is not None:
        args += ["--pod-owners", "--kubeconfig", str(kubeconfig)]
    log = (tmp_path / "anomaly.log").open("w")
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)


@pytest.fixture(scope="module")
def training_pods(cluster: Cluster) -> dict[str, set[str]]:
    """The pods on their simulated GPU nodes; job id -> nodes, as the API server's pods say."""
    for node in JOBSET["nodes"] + PYTORCHJOB["nodes"]:
        cluster.add_node(node, {"nvidia.com/gpu.present": "true"})
    nodes = JOBSET["nodes"] + PYTORCHJOB["nodes"]
    wait_until(lambda: all(cluster.node_ready(n) for n in nodes), timeout=30, what="the GPU nodes Ready")
    create_training_pods(cluster)
    api_jobs = wait_until(
        lambda: (jobs := jobs_from_api(cluster)) and sum(map(len, jobs.values())) == 6 and jobs,
        timeout=60,
        what="the six training pods started on the simulated GPU nodes",
    )
    assert api_jobs == {
        "training/pretrain-k": set(JOBSET["nodes"]),
        "team-b/finetune-p": set(PYTORCHJOB["nodes"]),
    }
    return api_jobs


@pytest.mark.parametrize("pod_labels", [True, False], ids=["pod-labels", "gpu-operator-default-owners"])
def test_a_kubernetes_jobs_straggler_is_flagged_by_name_and_its_alert_carries_the_job(
    cluster: Cluster,
    training_pods: dict[str, set[str]],
    tmp_path: Path,
    processes: list[subprocess.Popen[bytes]],
    pod_labels: bool,
) -> None:
    api_jobs = training_pods
    twin_url = start_twin(tmp_path, processes, pod_labels)
    assert get_json(f"{twin_url}/slurm/v0.0.40/jobs")["jobs"] == []  # no Slurm anywhere
    prom_port, anomaly_port = free_port(), free_port()
    processes.append(start_prometheus(tmp_path / "prometheus", prom_port, twin_url, anomaly_port))
    prometheus_url = f"http://127.0.0.1:{prom_port}"
    owners_from = None if pod_labels else cluster.admin_kubeconfig
    processes.append(start_anomaly(tmp_path, prometheus_url, anomaly_port, owners_from))
    api = f"http://127.0.0.1:{anomaly_port}"

    def flagged() -> list[dict[str, Any]]:
        body = get_json(f"{api}/v1/stragglers")
        return body["stragglers"] if body and body["stragglers"] else []

    # The PSU fails 3 simulated minutes in: ~22 s after the twin starts at 8x.
    stragglers = wait_until(flagged, timeout=240, interval=1.0, what="the JobSet's braked node to be flagged")
    assert [(s["hpc_job"], s["node"], s["cause"]) for s in stragglers] == [
        ("training/pretrain-k", "n0002", "power_brake")
    ]
    job = get_json(f"{api}/v1/jobs/training/pretrain-k/stragglers")
    assert [s["node"] for s in job["stragglers"]] == ["n0002"]
    assert_job_node_series_match_the_api(prometheus_url, api_jobs)
    assert_the_alert_carries_the_job(prometheus_url)


def query(prometheus_url: str, promql: str) -> list[dict[str, Any]]:
    body = get_json(f"{prometheus_url}/api/v1/query", {"query": promql})
    return body["data"]["result"] if body else []


def assert_job_node_series_match_the_api(prometheus_url: str, api_jobs: dict[str, set[str]]) -> None:
    """fleetsight_job_node_info in Prometheus says what the API server's pods say, job by job."""

    def published() -> dict[str, set[str]] | None:
        rows = query(prometheus_url, "fleetsight_job_node_info")
        jobs: dict[str, set[str]] = {}
        for row in rows:
            jobs.setdefault(row["metric"]["hpc_job"], set()).add(row["metric"]["node"])
        return jobs if jobs == api_jobs else None

    wait_until(published, timeout=60, what="fleetsight_job_node_info to match the API server's pods")
    rows = query(prometheus_url, "fleetsight_job_node_info")
    assert {(r["metric"]["namespace"], r["metric"]["scheduler"], r["metric"]["cluster"]) for r in rows} == {
        ("training", "kubernetes", "k8s-live"),
        ("team-b", "kubernetes", "k8s-live"),
    }
    node_jobs = {
        r["metric"]["node"]: r["metric"]["jobs"] for r in query(prometheus_url, "fleetsight_node_jobs_info")
    }
    assert node_jobs == {n: "training/pretrain-k" for n in JOBSET["nodes"]} | {
        n: "team-b/finetune-p" for n in PYTORCHJOB["nodes"]
    }


def assert_the_alert_carries_the_job(prometheus_url: str) -> None:
    """The power brake's GPU alert on n0002 (pending or firing: annotations are expanded at once)
    names the JobSet in its `jobs` annotation and its `hpc_job` label; no alert names the other job."""

    def brake_alerts() -> list[dict[str, Any]] | None:
        body = get_json(f"{prometheus_url}/api/v1/alerts")
        alerts = [
            a
            for a in (body or {}).get("data", {}).get("alerts", [])
            if a["labels"]["alertname"] == "GPUPowerBrakeActive"
        ]
        return alerts if alerts and all(a["annotations"].get("jobs") != "none" for a in alerts) else None

    alerts = wait_until(brake_alerts, timeout=90, what="GPUPowerBrakeActive on n0002 with its job")
    assert {a["labels"]["node"] for a in alerts} == {"n0002"}
    assert {a["annotations"]["jobs"] for a in alerts} == {"training/pretrain-k"}
    assert {a["labels"]["hpc_job"] for a in alerts} == {"training/pretrain-k"}
