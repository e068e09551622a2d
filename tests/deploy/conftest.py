"""Real servers for the Kubernetes tests, started once per session: the control plane of kube.py, the
chart installed on it (one release), and an Alertmanager for the health service's alerts."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The health tests' helpers (the health service, alerts through Alertmanager), as pytest puts
# tests/health on sys.path for its own tests.
sys.path.append(str(Path(__file__).resolve().parents[1] / "health"))

from kube import CHART, CPU_NODES, GPU_NODES, NAMESPACE, RELEASE, Cluster, helm

from support import alertmanager_server, wait_until


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    control_plane = Cluster(tmp_path_factory.mktemp("kube"))
    try:
        control_plane.start()
        yield control_plane
    finally:
        control_plane.stop()


@pytest.fixture(scope="session")
def release(cluster: Cluster) -> Cluster:
    """The chart installed with its defaults (operator objects off: this API server has no CRDs) on two
    simulated GPU nodes and one CPU node."""
    for name in GPU_NODES:
        cluster.add_node(name, {"nvidia.com/gpu.present": "true", "su": "unit00"})
    for name in CPU_NODES:
        cluster.add_node(name, {"su": "unit00"}, gpu=False)
    wait_until(
        lambda: all(cluster.node_ready(n) for n in GPU_NODES + CPU_NODES), timeout=30, what="nodes Ready"
    )
    helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace", cluster=cluster)
    return cluster


@pytest.fixture(scope="session")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with alertmanager_server(tmp_path_factory.mktemp("alertmanager")) as url:
        yield url
