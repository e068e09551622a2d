"""`fleetsight health-lease`: the Lease that two local health replicas elect their writer on, served by a
real Kubernetes API server on loopback (etcd and kube-apiserver, children of this one process).

Why a real API server: the replicas' election (health/leader.py) speaks coordination.k8s.io/v1 with
optimistic concurrency, and on the local stack it should meet the very server it meets in a cluster,
not a stand-in. The wrapper keeps the pair one supervised component (``health-lease``,
health/component.py): stopping or killing its process group stops both servers together.

Its folder holds what outlives a restart, so a restarted server keeps the Lease and the replicas'
credentials stay valid: etcd's data, the serving certificate kube-apiserver makes itself (``certs/``),
the service-account key pair, two bearer tokens (the admin's, used here and by the readiness check;
the replicas', allowed only the Lease by RBAC) and ``health.kubeconfig``, which the replicas read.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import signal
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import httpx
import yaml

from fleetsight.components import http_ok
from fleetsight.logs import setup_logging
from fleetsight.procs import stop_process
from fleetsight.settings import Settings

from .cli_common import CONTEXT

log = logging.getLogger("health.lease_server")
NAMESPACE = "fleetsight"
LEASE = "fleetsight-health"
REPLICA_USER = "fleetsight-health"  # the replicas' token user: its Role allows the Lease only
START_TIMEOUT_S = 120.0  # a loaded 2-core machine: kube-apiserver's post-start hooks take tens of seconds


@dataclass(frozen=True)
class Layout:
    """The files of one lease server, all under its folder."""

    folder: Path

    @property
    def certs(self) -> Path:
        return self.folder / "certs"

    @property
    def ca(self) -> Path:
        return self.certs / "apiserver.crt"  # self-signed by kube-apiserver: its own CA

    @property
    def admin_token(self) -> Path:
        return self.folder / "admin.token"

    @property
    def replica_token(self) -> Path:
        return self.folder / "replica.token"

    @property
    def kubeconfig(self) -> Path:
        return self.folder / "health.kubeconfig"


def missing(settings: Settings) -> str | None:
    """Why the lease server cannot run here, or None."""
    absent = [name for name in ("etcd", "openssl") if shutil.which(name) is None]
    if not (settings.bin_dir / "kube-apiserver").is_file():
        absent.append(f"kube-apiserver (in {settings.bin_dir})")
    return f"not installed: {', '.join(absent)} (run `fleetsight setup`)" if absent else None


def secret(path: Path, make: Callable[[], str]) -> str:
    """A secret made once and kept (a restart must not invalidate what the replicas hold)."""
    if not path.exists():
        path.write_text(make())
        path.chmod(0o600)
    return path.read_text().strip()


def prepare(layout: Layout) -> tuple[str, str]:
    """The tokens file and the service-account key pair kube-apiserver needs; (admin, replica) tokens."""
    layout.folder.mkdir(parents=True, exist_ok=True)
    admin = secret(layout.admin_token, lambda: secrets.token_hex(16))
    replica = secret(layout.replica_token, lambda: secrets.token_hex(16))
    tokens = f'{admin},admin,admin-uid,"system:masters"\n{replica},{REPLICA_USER},{REPLICA_USER}-uid\n'
    (layout.folder / "tokens.csv").write_text(tokens)
    (layout.folder / "tokens.csv").chmod(0o600)
    key = layout.folder / "sa.key"
    if not key.exists():
        subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True)
    pub = layout.folder / "sa.pub"
    subprocess.run(
        ["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(pub)], check=True, capture_output=True
    )
    return admin, replica


def etcd_command(layout: Layout, port: int, peer_port: int) -> list[str]:
    url, peer = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer_port}"
    return [
        shutil.which("etcd") or "etcd",
        f"--data-dir={layout.folder / 'etcd'}",
        f"--listen-client-urls={url}",
        f"--advertise-client-urls={url}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=default={peer}",
        "--log-level=warn",
    ]


def apiserver_command(binary: Path, layout: Layout, port: int, etcd_port: int) -> list[str]:
    return [
        str(binary),
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={layout.certs}",
        f"--token-auth-file={layout.folder / 'tokens.csv'}",
        "--authorization-mode=RBAC",
        "--anonymous-auth=false",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-key-file={layout.folder / 'sa.pub'}",
        f"--service-account-signing-key-file={layout.folder / 'sa.key'}",
        "--service-cluster-ip-range=10.96.0.0/16",
        "--profiling=false",
    ]


def admin_client(layout: Layout, server: str) -> httpx.Client:
    return httpx.Client(
        base_url=server,
        headers={"Authorization": f"Bearer {layout.admin_token.read_text().strip()}"},
        verify=ssl.create_default_context(cafile=str(layout.ca)),
        timeout=5,
    )


def answers(layout: Layout, server: str, path: str) -> bool:
    """GET path as the admin answers 200 (False while the server or its certificate is not there)."""
    if not (layout.ca.exists() and layout.admin_token.exists()):
        return False
    try:
        with admin_client(layout, server) as client:
            return client.get(path).status_code == 200
    except (httpx.HTTPError, ssl.SSLError, OSError):
        return False


def ready(layout: Layout, server: str) -> bool:
    """The component's readiness: the API server is ready and the Lease's namespace exists."""
    return answers(layout, server, "/readyz") and answers(layout, server, f"/api/v1/namespaces/{NAMESPACE}")


def bootstrap(layout: Layout, server: str) -> None:
    """The namespace, and a Role on Leases there bound to the replicas' user (what the chart's Role
    grants the ServiceAccount); what exists already is left as it is."""
    rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces/" + NAMESPACE
    objects = [
        ("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
        (f"{rbac}/roles", role_body()),
        (f"{rbac}/rolebindings", binding_body()),
    ]
    with admin_client(layout, server) as client:
        for path, body in objects:
            response = client.post(path, json=body)
            if response.status_code not in (200, 201, 409):
                raise RuntimeError(f"POST {path}: HTTP {response.status_code} {response.text[:300]}")


def role_body() -> dict[str, Any]:
    rule = {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["get", "create", "update"],
    }
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": REPLICA_USER, "namespace": NAMESPACE},
        "rules": [rule],
    }


def binding_body() -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": REPLICA_USER, "namespace": NAMESPACE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": REPLICA_USER},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": REPLICA_USER}],
    }


def write_kubeconfig(layout: Layout, server: str, token: str) -> None:
    """The replicas' kubeconfig (their token, the server's own certificate as CA), written atomically."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "health-lease", "cluster": {"server": server, "certificate-authority": str(layout.ca)}}
        ],
        "users": [{"name": REPLICA_USER, "user": {"token": token}}],
        "contexts": [{"name": "health-lease", "context": {"cluster": "health-lease", "user": REPLICA_USER}}],
        "current-context": "health-lease",
    }
    tmp = layout.kubeconfig.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(config))
    tmp.chmod(0o600)
    tmp.replace(layout.kubeconfig)


class LeaseServer:
    """etcd and kube-apiserver as children; both stopped when this process is asked to stop, and
    both stopped (this process exiting 1, for the supervisor to restart it) when either dies."""

    def __init__(self, layout: Layout, port: int, etcd_port: int, peer_port: int, binary: Path) -> None:
        self.layout, self.port, self.etcd_port, self.peer_port = layout, port, etcd_port, peer_port
        self.binary = binary
        self.server = f"https://127.0.0.1:{port}"
        self.children: list[tuple[str, subprocess.Popen]] = []
        self.stopping = threading.Event()

    def spawn(self, name: str, command: list[str]) -> None:
        log.info("event=spawn child=%s", name)
        self.children.append((name, subprocess.Popen(command, stdin=subprocess.DEVNULL)))

    def dead_child(self) -> str | None:
        return next((f"{n} exited {p.returncode}" for n, p in self.children if p.poll() is not None), None)

    def wait_for(self, check: Callable[[], bool], what: str) -> bool:
        """Poll check until it holds; False when asked to stop; an error when a child died or time ran out."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while not check():
            if self.stopping.is_set():
                return False
            if (why := self.dead_child()) or time.monotonic() > deadline:
                raise RuntimeError(f"waiting for {what}: {why or f'not after {START_TIMEOUT_S:.0f}s'}")
            self.stopping.wait(0.5)
        return True

    def start(self) -> bool:
        _, replica = prepare(self.layout)
        self.spawn("etcd", etcd_command(self.layout, self.etcd_port, self.peer_port))
        etcd_health = f"http://127.0.0.1:{self.etcd_port}/health"
        if not self.wait_for(lambda: http_ok(etcd_health), "etcd"):
            return False
        self.spawn("kube-apiserver", apiserver_command(self.binary, self.layout, self.port, self.etcd_port))
        if not self.wait_for(lambda: answers(self.layout, self.server, "/readyz"), "kube-apiserver /readyz"):
            return False
        write_kubeconfig(self.layout, self.server, replica)
        bootstrap(self.layout, self.server)
        log.info("event=ready server=%s namespace=%s lease=%s", self.server, NAMESPACE, LEASE)
        return True

    def run(self) -> int:
        """Serve until asked to stop (0) or until a child dies (1)."""
        try:
            if not self.start():
                return 0
            while not self.stopping.wait(0.5):
                if why := self.dead_child():
                    log.error("event=child_exited detail=%s", why)
                    return 1
            return 0
        finally:
            for name, process in reversed(self.children):  # the API server first, then its store
                stop_process(process, timeout_s=10)
                log.info("event=stopped child=%s code=%s", name, process.returncode)


@click.command(name="health-lease", context_settings=CONTEXT)
@click.option(
    "--folder",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Where etcd's data, the certificates, the tokens and health.kubeconfig are kept.",
)
@click.option("--port", type=int, required=True, help="kube-apiserver's HTTPS port (loopback).")
@click.option("--etcd-port", type=int, required=True, help="etcd's client port (loopback).")
@click.option("--etcd-peer-port", type=int, required=True, help="etcd's peer port (loopback).")
def cli(folder: Path, port: int, etcd_port: int, etcd_peer_port: int) -> None:
    """Serve the Lease two local health replicas elect their writer on: etcd and kube-apiserver on
    loopback, stopped together on SIGTERM. The replicas read FOLDER/health.kubeconfig; the Lease is
    fleetsight/fleetsight-health. `fleetsight up health-b` starts it (component health-lease).

    \b
    Examples:
      fleetsight health-lease --folder /tmp/lease --port 19146 --etcd-port 19147 --etcd-peer-port 19148
    """
    setup_logging()
    settings = Settings()
    why = missing(settings)
    if why:
        raise click.ClickException(why)
    server = LeaseServer(
        Layout(folder.resolve()), port, etcd_port, etcd_peer_port, settings.bin_dir / "kube-apiserver"
    )
    signal.signal(signal.SIGTERM, lambda *_: server.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: server.stopping.set())
    try:
        code = server.run()
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        raise click.ClickException(str(exc)) from exc
    raise SystemExit(code)
