"""The clusters the global layer reads, from one YAML file, and the fan-out that asks all of them at once.

A clusters file::

    clusters:
      - name: vela                                  # the cluster's one name (its FLEETSIGHT_CLUSTER)
        health: https://health.vela.example:9441    # its health service
        token_file: /etc/fleetsight/fleet/vela.token  # a token with scope `read` there (optional)
        ca_file: /etc/fleetsight/fleet/vela-ca.pem    # the CA of its TLS certificate (optional)

Every answer is one :class:`Reply` per cluster. A cluster whose health service does not answer, answers
an error of its own (5xx), or answers under another cluster's name is *missing*: the global answers list
it as such, never as a cluster without nodes.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from fleetsight.secrets import SecretFileError, read_secret_file
from fleetsight.settings import CLUSTER_NAME

# Statuses a health service answers that say something about the question: found, not here, bad input.
USABLE = (200, 404, 422)


class ClustersFileError(ValueError):
    """A clusters file that cannot be used; the message names the file and the entry."""


@dataclass(frozen=True)
class Cluster:
    name: str
    health: str  # the health service's base URL
    token: str | None = None
    ca_file: Path | None = None


@dataclass(frozen=True)
class Reply:
    """One cluster's answer to one request: ``status`` None when it did not answer at all."""

    cluster: str
    status: int | None
    body: Any
    error: str
    seconds: float

    @property
    def missing(self) -> bool:
        """No usable answer: none at all, one that is neither an answer (200), "not here" (404) nor the
        caller's mistake (422) (a 5xx, a refused token: an absence it reports cannot be trusted), or one
        under a name that is not the one configured (it would be filed under the wrong cluster)."""
        return self.status not in USABLE or self.misnamed

    @property
    def misnamed(self) -> bool:
        said = self.body.get("cluster") if isinstance(self.body, dict) else None
        return bool(said) and said != self.cluster

    def why_missing(self) -> str:
        if self.misnamed:
            return f"its health service answers as cluster {self.body['cluster']!r}"
        return self.error or f"HTTP {self.status}"

    def gap(self) -> dict[str, str]:
        """How a missing cluster shows in a global answer."""
        return {"cluster": self.cluster, "error": self.why_missing()}


def load_clusters(path: Path) -> list[Cluster]:
    """The clusters of a clusters file, each checked; ClustersFileError names the file and the entry."""
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ClustersFileError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ClustersFileError(f"{path}: not YAML: {exc}") from None
    entries = raw.get("clusters") if isinstance(raw, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ClustersFileError(f"{path}: wants a non-empty list under `clusters:`")
    clusters = [_cluster(path, index, entry) for index, entry in enumerate(entries)]
    names = [c.name for c in clusters]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ClustersFileError(f"{path}: cluster names must differ: {', '.join(twice)} more than once")
    return clusters


def _cluster(path: Path, index: int, entry: Any) -> Cluster:
    where = f"{path}: clusters[{index}]"
    if not isinstance(entry, Mapping):
        raise ClustersFileError(f"{where}: wants a mapping with name and health")
    unknown = set(entry) - {"name", "health", "token_file", "ca_file"}
    if unknown:
        raise ClustersFileError(f"{where}: unknown keys {', '.join(sorted(unknown))}")
    name, health = str(entry.get("name") or ""), str(entry.get("health") or "")
    if not CLUSTER_NAME.match(name):
        raise ClustersFileError(f"{where}.name: {name!r}: 1-63 letters, digits, '.', '_' or '-'")
    url = urlsplit(health)
    if url.scheme not in ("http", "https") or not url.netloc:
        raise ClustersFileError(f"{where}.health: {health!r}: want the health service's http(s) URL")
    token = None
    if entry.get("token_file"):
        try:
            token = read_secret_file(entry["token_file"], f"{where}.token_file")
        except SecretFileError as exc:
            raise ClustersFileError(str(exc)) from None
    ca_file = Path(entry["ca_file"]) if entry.get("ca_file") else None
    if ca_file is not None and not ca_file.is_file():
        raise ClustersFileError(f"{where}.ca_file: {ca_file}: no such file")
    return Cluster(name, health.rstrip("/"), token, ca_file)


class FanOut:
    """Asks every cluster's health service the same question at once, each within ``timeout_s``."""

    def __init__(self, clusters: list[Cluster], timeout_s: float) -> None:
        self.clusters, self.timeout_s = clusters, timeout_s
        self.clients = {c.name: self._client(c, timeout_s) for c in clusters}

    @staticmethod
    def _client(cluster: Cluster, timeout_s: float) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {cluster.token}"} if cluster.token else {}
        verify: ssl.SSLContext | bool = True
        if cluster.ca_file is not None:
            verify = ssl.create_default_context(cafile=str(cluster.ca_file))
        return httpx.AsyncClient(base_url=cluster.health, headers=headers, verify=verify, timeout=timeout_s)

    async def get(self, path: str, params: Mapping[str, Any] | None = None) -> list[Reply]:
        """Every cluster's reply, in the clusters file's order."""
        return list(await asyncio.gather(*(self._ask(c.name, path, params) for c in self.clusters)))

    async def _ask(self, name: str, path: str, params: Mapping[str, Any] | None) -> Reply:
        started = time.monotonic()
        try:
            response = await self.clients[name].get(path, params=params)
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}".rstrip(": ")
            return Reply(name, None, None, error, time.monotonic() - started)
        try:
            body = response.json()
        except ValueError:
            body = None
        error = "" if response.status_code < 400 else _detail(body) or response.text[:200]
        return Reply(name, response.status_code, body, error, time.monotonic() - started)

    async def close(self) -> None:
        await asyncio.gather(*(client.aclose() for client in self.clients.values()))


def _detail(body: Any) -> str:
    detail = body.get("detail") if isinstance(body, dict) else None
    return detail if isinstance(detail, str) else ""
