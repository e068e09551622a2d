"""A Kubernetes API server over plain httpx: a base URL, a bearer token, the CA to check it with.

Core, because two components read the API: the health service writes node conditions, cordons and
taints (health/kubernetes.py), and the anomaly service reads a GPU pod's owners to name its training
job when the pod's labels do not (anomaly/owners.py). Plain httpx, not the official ``kubernetes``
client: each needs a handful of calls, httpx is already the project's HTTP client, and the official
client brings a generated package of several MB and its own dependencies for them.

Each component raises its own error type (``KubeAPI.error``), so that its callers catch one name.
"""

from __future__ import annotations

import base64
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import httpx
import yaml

IN_CLUSTER = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeAPIError(RuntimeError):
    """The API server could not be read or written; the message says which call and why. ``status`` is
    the HTTP status when the server answered (404: no such object)."""

    status: int | None = None


@dataclass
class KubeAPI:
    """The API server: a base URL, a bearer token and the CA to check it with."""

    error: ClassVar[type[KubeAPIError]] = KubeAPIError
    url: str
    token: str
    verify: str | bool | ssl.SSLContext = True  # a CA file, a context, or False (insecure-skip-tls-verify)
    timeout: float = 10.0
    client: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.client = httpx.Client(
            base_url=self.url.rstrip("/"),
            headers={"Authorization": f"Bearer {self.token}"},
            verify=ssl.create_default_context(cafile=self.verify)
            if isinstance(self.verify, str)
            else self.verify,
            timeout=self.timeout,
        )

    def close(self) -> None:
        self.client.close()

    def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response = self.client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise self.error(f"{method} {path}: {exc}") from exc
        if response.status_code >= 400:
            detail = response.json().get("message", "") if response.content else ""
            error = self.error(f"{method} {path}: HTTP {response.status_code} {detail}".strip())
            error.status = response.status_code
            raise error
        return response.json()


API = TypeVar("API", bound=KubeAPI)


def from_kubeconfig(path: Path, api: type[API] = KubeAPI) -> API:  # type: ignore[assignment]
    """The current context of a kubeconfig: server, token (or token file) and CA. Client certificates
    are not supported: FleetSight authenticates as a ServiceAccount or a token user."""
    config = yaml.safe_load(path.read_text()) or {}
    by_name = {
        k: {i["name"]: i[k[:-1]] for i in config.get(k) or []} for k in ("clusters", "users", "contexts")
    }
    context = by_name["contexts"].get(config.get("current-context", ""))
    if context is None:
        raise api.error(f"{path}: no current-context")
    cluster, user = by_name["clusters"][context["cluster"]], by_name["users"].get(context.get("user", ""), {})
    token = user.get("token") or (Path(user["tokenFile"]).read_text().strip() if "tokenFile" in user else "")
    if not token:
        raise api.error(f"{path}: the current user has no token (client certificates are not supported)")
    verify: str | bool | ssl.SSLContext = True
    if cluster.get("insecure-skip-tls-verify"):
        verify = False
    elif "certificate-authority" in cluster:
        verify = cluster["certificate-authority"]
    elif "certificate-authority-data" in cluster:
        pem = base64.b64decode(cluster["certificate-authority-data"]).decode()
        verify = ssl.create_default_context(cadata=pem)
    return api(cluster["server"], token, verify)


def connect(kubeconfig: Path | None, api: type[API] = KubeAPI) -> API:  # type: ignore[assignment]
    """A kubeconfig when given (or $KUBECONFIG), else the pod's ServiceAccount (in-cluster)."""
    path = kubeconfig or (Path(os.environ["KUBECONFIG"]) if os.environ.get("KUBECONFIG") else None)
    if path is not None:
        return from_kubeconfig(path, api)
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host or not (IN_CLUSTER / "token").exists():
        raise api.error("no kubeconfig (--kubeconfig, $KUBECONFIG) and not running in a pod")
    return api(
        f"https://{host}:{port}", (IN_CLUSTER / "token").read_text().strip(), str(IN_CLUSTER / "ca.crt")
    )
