"""A GPU pod's training job from its owners in the API server, for pods whose labels say nothing.

NVIDIA's GPU operator runs dcgm-exporter with ``--kubernetes`` but without pod labels: each GPU's series
carries ``pod`` and ``namespace`` and no controller label, so anomaly/jobs.py finds no job. The pod's
``ownerReferences`` do name it: the controllers' usual chains are

- JobSet -> Job -> Pod (JobSet, and Kubeflow Trainer v2's TrainJob, which runs as a JobSet);
- PyTorchJob (and the training operator's other kinds) -> Pod;
- LeaderWorkerSet -> StatefulSet -> Pod;
- Job -> Pod (a plain indexed Job);

so the job is the outermost owner reached through controller references, following at most the Job and
StatefulSet in between (the only intermediate objects those controllers create), by kind name: the
JobSet, PyTorchJob, TrainJob, LeaderWorkerSet themselves are never read, so their CRDs need no RBAC.

Answers are cached per pod (a pod's owners never change; a new pod has a new name), failures for a short
while, and a pod that cannot be resolved (gone, forbidden, API server down) names no job: the node then
counts as not in a job, which never flags it (blind is not broken); ``errors`` says what failed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetsight.kubeapi import KubeAPI, KubeAPIError

from .declared import declares_routing

log = logging.getLogger("anomaly.owners")

# The objects between a pod and its job that are read to go one owner further: kind -> API path.
INTERMEDIATE = {
    ("batch", "Job"): "/apis/batch/v1/namespaces/{namespace}/jobs/{name}",
    ("apps", "StatefulSet"): "/apis/apps/v1/namespaces/{namespace}/statefulsets/{name}",
}
# How long a failed lookup is remembered before it is tried again (a pod not yet visible, an API hiccup).
RETRY_AFTER_S = 60.0
# Pods remembered at most: ~8 GPUs per pod, so 100,000 GPUs are ~12,500 pods.
MAX_CACHED = 50_000


@dataclass(frozen=True)
class Owner:
    """The job a pod belongs to: the outermost controller's kind and name (in the pod's namespace)."""

    kind: str
    name: str
    routing: bool = False  # the pod's labels declare expert routing (anomaly/jobs.py)


def _controller(meta: dict[str, Any]) -> dict[str, Any] | None:
    """The owner reference marked ``controller: true`` (at most one, by the API's rules)."""
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            return ref
    return None


def _group(api_version: str) -> str:
    return api_version.split("/")[0] if "/" in api_version else ""


@dataclass
class PodOwners:
    """Pod -> its job's owner, read from the API server and cached."""

    api: KubeAPI
    clock: Callable[[], float] = time.monotonic
    _known: dict[tuple[str, str], Owner | None] = field(default_factory=dict)
    _failed: dict[tuple[str, str], float] = field(default_factory=dict)
    errors: int = 0
    last_error: str = ""

    def owner(self, namespace: str, pod: str) -> Owner | None:
        key = (namespace, pod)
        if key in self._known:
            return self._known[key]
        failed_at = self._failed.get(key)
        if failed_at is not None and self.clock() - failed_at < RETRY_AFTER_S:
            return None
        try:
            found = self._resolve(namespace, pod)
        except KubeAPIError as exc:
            self.errors += 1
            self.last_error = str(exc)
            self._failed[key] = self.clock()
            log.warning("pod %s/%s: owner unread: %s", namespace, pod, exc)
            return None
        if len(self._known) >= MAX_CACHED:
            self._known.clear()  # pods come and go: start again rather than grow without bound
        self._known[key] = found
        self._failed.pop(key, None)
        return found

    def _resolve(self, namespace: str, pod: str) -> Owner | None:
        meta = self.api.request("GET", f"/api/v1/namespaces/{namespace}/pods/{pod}").get("metadata", {})
        ref = _controller(meta)
        if ref is None:
            return None  # a bare pod: no training controller made it
        routing = declares_routing(meta.get("labels") or {}, sanitised=False)
        owner = Owner(str(ref.get("kind", "")), str(ref.get("name", "")), routing)
        path = INTERMEDIATE.get((_group(str(ref.get("apiVersion", ""))), owner.kind))
        if path is None:
            return owner
        try:
            parent = self.api.request("GET", path.format(namespace=namespace, name=owner.name))
        except KubeAPIError as exc:
            if exc.status == 404:
                return owner  # the Job is gone while its pod lingers: the Job's name is the best left
            raise
        above = _controller(parent.get("metadata", {}))
        return Owner(str(above["kind"]), str(above["name"]), routing) if above else owner
