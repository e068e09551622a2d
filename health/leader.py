"""Two health replicas, one writer (issue 37): leader election on a ``coordination.k8s.io/v1`` Lease.

The leader holds the Lease (``holderIdentity`` = its pod name, renewed every ``renew_s``, valid for
``duration_s``) and records the URL its peers reach it at in the annotation ``fleetsight.io/leader-url``.
Only the leader decides, saves the state file, posts the breaker alert and is applied to the Nodes API
(the kubernetes-sync sidecar asks its own replica's role). The follower copies the leader's state file
and rendered snapshot every ``retry_s`` (``GET /v1/replica``) and answers reads from that copy, so reads
go on while the leader is gone; it forwards writes and events to the leader. When the Lease has not
changed for ``duration_s`` of the follower's own clock (no comparison of two hosts' clocks), the
follower takes it with the API server's optimistic concurrency (``resourceVersion``: of two contenders
one gets 409), loads the copied state and sweeps at once.

Why a copy and not a shared volume: two pods on two nodes cannot share a ReadWriteOnce volume, and a
proxy-only follower could not answer while the leader is dead nor start from its state.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .kubernetes import KubeAPI, KubernetesError

log = logging.getLogger("health.leader")
URL_ANNOTATION = "fleetsight.io/leader-url"


def micro_time(ts: float) -> str:
    """The Lease's MicroTime format (RFC 3339 with microseconds)."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaseConfig:
    namespace: str
    name: str
    identity: str  # the pod name
    url: str  # where the other replica reaches this one (the pod IP and port)
    duration_s: float = 10.0
    renew_s: float = 2.0
    retry_s: float = 1.0  # the follower looks this often, so it sees the leader's death soon

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.name}"


@dataclass
class LeaderElector:
    """Acquires and renews the Lease from a thread of its own; ``is_leader`` is what the service asks
    before every write."""

    api: KubeAPI
    config: LeaseConfig
    on_change: Callable[[bool], None] | None = None
    holder: str | None = None
    leader_url: str | None = None
    transitions: int = 0
    renewed_at: float = float("-inf")  # monotonic time of our last successful acquire/renew
    observed: tuple[Any, ...] = ()  # the other holder's (holder, renewTime) as last seen
    observed_at: float = 0.0  # monotonic time it was first seen unchanged
    leading: bool = False
    stop_event: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    @property
    def is_leader(self) -> bool:
        return self.leading and self._fresh()

    def _fresh(self) -> bool:
        # Stop writing before the others may take over: our renew must be younger than the duration
        # less one renew period, or we might write while the follower already does.
        return time.monotonic() - self.renewed_at < self.config.duration_s - self.config.renew_s

    def step(self) -> bool:
        """One look at the Lease: create it, renew ours, or take an expired one. Returns is_leader."""
        try:
            lease = self._get()
            if lease is None:
                self._write("POST", self._body(None), transitions=0)
            elif self._holder(lease) == self.config.identity or self._expired(lease):
                self._write("PUT", self._body(lease), transitions=self._transitions(lease))
            else:
                self._follow(lease)
        except KubernetesError as exc:
            # 409: another replica wrote first; anything else: the API server is away. Either way we
            # are leader only while our last renew is fresh (is_leader).
            log.warning("event=lease_error lease=%s error=%s", self.config.name, exc)
        self._set_leading(self._fresh())
        return self.leading

    def _get(self) -> dict[str, Any] | None:
        try:
            return self.api.request("GET", self.config.path)
        except KubernetesError as exc:
            if getattr(exc, "status", 0) == 404:
                return None
            raise

    @staticmethod
    def _holder(lease: dict[str, Any]) -> str:
        return (lease.get("spec") or {}).get("holderIdentity") or ""

    def _transitions(self, lease: dict[str, Any]) -> int:
        count = int((lease.get("spec") or {}).get("leaseTransitions") or 0)
        return count if self._holder(lease) == self.config.identity else count + 1

    def _expired(self, lease: dict[str, Any]) -> bool:
        """Unchanged (holder and renewTime) for duration_s of our own clock, or released (no holder)."""
        spec = lease.get("spec") or {}
        if not spec.get("holderIdentity"):
            return True
        record = (spec.get("holderIdentity"), spec.get("renewTime"))
        if record != self.observed:
            self.observed, self.observed_at = record, time.monotonic()
        duration = float(spec.get("leaseDurationSeconds") or self.config.duration_s)
        return time.monotonic() - self.observed_at >= duration

    def _body(self, lease: dict[str, Any] | None) -> dict[str, Any]:
        now = micro_time(time.time())
        spec = dict((lease or {}).get("spec") or {})
        if spec.get("holderIdentity") != self.config.identity:
            spec["acquireTime"] = now
        spec.update(
            holderIdentity=self.config.identity,
            leaseDurationSeconds=int(self.config.duration_s),
            renewTime=now,
        )
        metadata: dict[str, Any] = {"name": self.config.name, "namespace": self.config.namespace}
        if lease is not None:  # optimistic concurrency: of two writers of one version, one gets 409
            metadata["resourceVersion"] = lease["metadata"]["resourceVersion"]
        metadata["annotations"] = {URL_ANNOTATION: self.config.url}
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}

    def _write(self, method: str, body: dict[str, Any], transitions: int) -> None:
        body["spec"]["leaseTransitions"] = transitions
        path = self.config.path if method == "PUT" else self.config.path.rsplit("/", 1)[0]
        self.api.request(method, path, json=body)
        self.renewed_at = time.monotonic()
        self.holder, self.leader_url, self.transitions = self.config.identity, self.config.url, transitions

    def _follow(self, lease: dict[str, Any]) -> None:
        self.holder = self._holder(lease)
        self.leader_url = ((lease.get("metadata") or {}).get("annotations") or {}).get(URL_ANNOTATION)
        self.renewed_at = float("-inf")  # someone else holds it: we are not leader, whatever we were

    def _set_leading(self, leading: bool) -> None:
        if leading == self.leading:
            return
        self.leading = leading
        log.info(
            "event=leader_%s lease=%s/%s identity=%s",
            "acquired" if leading else "lost",
            self.config.namespace,
            self.config.name,
            self.config.identity,
        )
        if self.on_change is not None:
            self.on_change(leading)

    def release(self) -> None:
        """On a clean stop: empty the holder, so the follower takes over at once instead of waiting
        for the Lease to run out."""
        if not self.leading:
            return
        try:
            lease = self._get()
            if lease is not None and self._holder(lease) == self.config.identity:
                lease["spec"]["holderIdentity"] = None
                self.api.request("PUT", self.config.path, json=lease)
        except KubernetesError as exc:
            log.warning("event=lease_release_failed error=%s", exc)
        self.leading = False

    def run(self) -> None:
        while not self.stop_event.is_set():
            leading = self.step()
            self.stop_event.wait(self.config.renew_s if leading else self.config.retry_s)

    def start(self) -> None:
        self.step()  # decide the role before the service serves its first request
        self.thread = threading.Thread(target=self.run, name="health-lease", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
        self.release()
