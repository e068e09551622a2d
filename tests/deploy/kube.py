"""A real Kubernetes control plane on loopback for the chart's and the Kubernetes sync's tests: etcd
(Debian's), kube-apiserver with token auth and RBAC, kube-controller-manager (DaemonSet, ReplicaSet,
node lifecycle and taint-eviction controllers), kube-scheduler, and kwok, which plays the kubelet of
nodes annotated ``kwok.x-k8s.io/node=fake``. Binaries come from ``fleetsight setup`` (.cache/bin).

A module of its own (not conftest.py), as tests/health/health_helpers.py is."""

from __future__ import annotations

import base64
import os
import shutil
import ssl
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fleetsight.settings import Settings
from health.lease_server import Layout, apiserver_command, etcd_command, prepare
from support import REPO_ROOT, Process, free_port, wait_until

CHART = REPO_ROOT / "deploy" / "helm" / "fleetsight"
NAMESPACE = "fleetsight"
RELEASE = "fs"
GPU_NODES = ["gpu-a", "gpu-b"]
CPU_NODES = ["cpu-a"]

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
TOOLS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "helm")
CONTROLLERS = (
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "daemonset-controller",
    "deployment-controller",
    "replicaset-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "garbage-collector-controller",
)


def tool(name: str) -> Path:
    """A binary built by `fleetsight setup`, or a loud failure naming the step."""
    path = Settings().bin_dir / name
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `fleetsight setup` (step {name})")
    return path


def kubeconfig(path: Path, server: str, ca: Path, token: str, user: str) -> Path:
    data = base64.b64encode(ca.read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        # the CA inline, as kubeconfigs handed out usually carry it (helm and the sync both read it)
        "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority-data": data}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": user}}],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)  # it holds a token (and helm warns otherwise)
    return path


@dataclass
class Cluster:
    folder: Path
    server: str = ""
    admin_token: str = ""
    ca: Path = Path()
    admin_kubeconfig: Path = Path()
    processes: list[Process] = field(default_factory=list)
    client: httpx.Client | None = None

    # -------------------------------------------------------------- start and stop
    def start(self) -> None:
        """etcd and kube-apiserver as the health pair's Lease server starts them (health/lease_server.py:
        the same flags, token file and service-account keys), then the controllers and kwok."""
        if shutil.which("etcd") is None:
            pytest.fail("etcd is not installed: run `fleetsight setup` (step etcd)")
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        layout = Layout(self.folder)
        etcd = self.spawn("etcd", etcd_command(layout, etcd_port, peer_port))
        etcd.wait_ready(f"http://127.0.0.1:{etcd_port}/health")
        self.admin_token, _ = prepare(layout)
        certs = layout.certs
        self.server = f"https://127.0.0.1:{api_port}"
        self.spawn("kube-apiserver", apiserver_command(tool("kube-apiserver"), layout, api_port, etcd_port))
        self.ca = certs / "apiserver.crt"
        wait_until(
            lambda: self.ca.exists() and b"END CERTIFICATE" in self.ca.read_bytes(),
            timeout=60,
            what="kube-apiserver's self-signed certificate",
        )
        self.client = httpx.Client(
            base_url=self.server,
            headers={"Authorization": f"Bearer {self.admin_token}"},
            verify=ssl.create_default_context(cafile=str(self.ca)),
            timeout=10,
        )
        wait_until(self.ready, timeout=90, what="kube-apiserver /readyz")
        self.admin_kubeconfig = kubeconfig(
            self.folder / "admin.kubeconfig", self.server, self.ca, self.admin_token, "admin"
        )
        self.start_controllers(layout.folder / "sa.key")  # the key prepare() made

    def start_controllers(self, key: Path) -> None:
        admin = str(self.admin_kubeconfig)
        (self.folder / "kwok.yaml").write_text("")  # not ~/.kwok/kwok.yaml; kwok's default stages
        self.spawn(
            "kube-controller-manager",
            [
                tool("kube-controller-manager"),
                f"--kubeconfig={admin}",
                f"--controllers={','.join(CONTROLLERS)}",
                "--leader-elect=false",
                "--secure-port=0",
                f"--service-account-private-key-file={key}",
                f"--root-ca-file={self.ca}",
                "--use-service-account-credentials=false",
                "--concurrent-gc-syncs=2",
                # kwok renews the nodes' leases; on a busy 2-core machine it can starve for tens of
                # seconds, the default 40 s grace marks the nodes Unknown and their pods NotReady, and
                # kwok's pod-ready stage (pods without a podIP only) never readies them again: a DaemonSet
                # stayed at 0 ready for good in CI. No test here watches a node go silent.
                "--node-monitor-grace-period=300s",
            ],
        )
        self.spawn(
            "kube-scheduler",
            [tool("kube-scheduler"), f"--kubeconfig={admin}", "--leader-elect=false", "--secure-port=0"],
        )
        self.spawn(
            "kwok",
            [
                tool("kwok"),
                f"--kubeconfig={admin}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.0.0.1",
                f"--server-address=127.0.0.1:{free_port()}",
                f"--config={self.folder / 'kwok.yaml'}",
            ],
        )

    def spawn(self, name: str, command: list[Any]) -> Process:
        process = Process(name, [str(c) for c in command], self.folder / f"{name}.log")
        self.processes.append(process)
        return process

    def ready(self) -> bool:
        for process in self.processes:
            if process.popen.poll() is not None:
                pytest.fail(
                    f"{process.name} exited {process.popen.returncode}:\n{process.log.read_text()[-3000:]}"
                )
        try:
            return self.api("GET", "/readyz").status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        for process in reversed(self.processes):
            process.stop()

    # -------------------------------------------------------------- the API, as the admin
    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        assert self.client is not None
        return self.client.request(method, path, **kwargs)

    def get(self, path: str) -> dict[str, Any]:
        response = self.api("GET", path)
        assert response.status_code == 200, f"GET {path}: {response.status_code} {response.text[:500]}"
        return response.json()

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self.api("POST", path, json=body)
        assert response.status_code in (200, 201), (
            f"POST {path}: {response.status_code} {response.text[:500]}"
        )
        return response.json()

    def patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/merge-patch+json"}
        response = self.api("PATCH", path, json=body, headers=headers)
        assert response.status_code == 200, f"PATCH {path}: {response.status_code} {response.text[:500]}"
        return response.json()

    def add_node(self, name: str, labels: dict[str, str], gpu: bool = True) -> None:
        """A node that kwok plays the kubelet of (Ready within a second or two)."""
        taints = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}] if gpu else []
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": {KWOK_ANNOTATION: "fake"}},
            "spec": {"taints": taints},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}},
        }
        self.create("/api/v1/nodes", body)

    def node(self, name: str) -> dict[str, Any]:
        return self.get(f"/api/v1/nodes/{name}")

    def node_ready(self, name: str) -> bool:
        conditions = self.node(name).get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def install_crds(self, files: list[Path]) -> list[str]:
        """Create CustomResourceDefinitions and wait until the API server serves them."""
        names = []
        for path in files:
            crd = yaml.safe_load(path.read_text())
            self.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
            names.append(crd["metadata"]["name"])
        for name in names:
            wait_until(
                lambda n=name: any(
                    c["type"] == "Established" and c["status"] == "True"
                    # a CRD just created may carry "conditions": null
                    for c in (
                        self.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{n}").get("status")
                        or {}
                    ).get("conditions")
                    or []
                ),
                timeout=30,
                what=f"CRD {name} established",
            )
        # Established is not yet served: helm maps kinds through the discovery documents, which lag the
        # condition by a moment (a helm install right after failed "no matches for kind" under load).
        for path in files:
            crd = yaml.safe_load(path.read_text())
            group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
            for version in (v["name"] for v in crd["spec"]["versions"] if v.get("served")):
                wait_until(
                    lambda g=group, v=version, p=plural: self.discovered(g, v, p),
                    timeout=30,
                    what=f"{plural}.{group}/{version} in the API server's discovery",
                )
        return names

    def discovered(self, group: str, version: str, plural: str) -> bool:
        response = self.api("GET", f"/apis/{group}/{version}")
        return response.status_code == 200 and plural in {
            r["name"] for r in response.json().get("resources", [])
        }

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path) -> Path:
        """A kubeconfig holding a token of a ServiceAccount (TokenRequest API): the rights its RBAC gives."""
        answer = self.create(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": 3600},
            },
        )
        return kubeconfig(path, self.server, self.ca, answer["status"]["token"], name)


def helm(*args: str, cluster: Cluster | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HELM_CACHE_HOME": "/tmp/fleetsight-helm-cache",
        "HELM_CONFIG_HOME": "/tmp/fleetsight-helm-config",
    }
    if cluster is not None:
        env["KUBECONFIG"] = str(cluster.admin_kubeconfig)
    result = subprocess.run([str(tool("helm")), *args], capture_output=True, text=True, env=env, timeout=300)
    if check:
        assert result.returncode == 0, f"helm {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
    return result
