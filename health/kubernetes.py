"""Node health on Kubernetes, beside the Slurm and LSF syncs: the health service's state applied to the
Nodes API, and the Nodes API as the service's inventory.

Per node the service knows, ``fleetsight health kubernetes-sync`` sets:

- the node condition ``FleetSightGPUHealthy`` (``True`` for healthy/degraded, ``False`` otherwise; its
  reason is the state, its message the state's reasons) through ``nodes/status``;
- the label ``fleetsight.io/health=<state>``;
- for a node on the drain list (the engine's decision, so the circuit breaker holds here as on Slurm):
  by policy a cordon (``spec.unschedulable``) and the taint ``fleetsight.io/unhealthy`` with effect
  ``NoSchedule``, and ``NoExecute`` only where the policy's ``no_execute_for`` names the effect of one of
  the node's reasons (``repair``: the hardware is broken; NoExecute evicts the pods running there).

What FleetSight set is recorded on the node itself (annotations ``fleetsight.io/cordoned`` and
``fleetsight.io/taints``), so a restarted sync never forgets it and only ever undoes that: a node an
operator cordoned is never uncordoned, and their taints are never touched. An operator takes a cordon
over from FleetSight by removing the annotation (``kubectl annotate node N fleetsight.io/cordoned-``).

The API client is the core's (fleetsight/kubeapi.py, plain httpx) with the four node calls the sync
makes (list nodes, patch a node, patch its status, read one). Node writes carry the
resourceVersion read (a taint list is replaced whole, so a concurrent writer makes the patch fail with
409 and the node is read again) and are sent only when something changes.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import httpx
import yaml

from fleetsight import kubeapi

from .model import FIT_STATES
from .policy import Policy
from .sources import SourceResult, Sources
from .sync import SyncError

log = logging.getLogger("health.kubernetes")

CONDITION = "FleetSightGPUHealthy"
LABEL = "fleetsight.io/health"
TAINT_KEY = "fleetsight.io/unhealthy"
CORDONED = "fleetsight.io/cordoned"  # "true": FleetSight set spec.unschedulable
TAINTS = "fleetsight.io/taints"  # the effects of FleetSight's taints, comma-separated
EFFECTS = ("NoSchedule", "NoExecute")
MESSAGE_MAX = 1024
CONFLICT_RETRIES = 3


class KubernetesError(SyncError, kubeapi.KubeAPIError):
    """The API server could not be read or written; the message says which call and why."""


# ---------------------------------------------------------------------------------- policy
@dataclass(frozen=True)
class KubePolicy:
    """The policy's ``kubernetes:`` block: what a node on the drain list gets."""

    cordon: bool = True
    taint: bool = True  # fleetsight.io/unhealthy:NoSchedule
    no_execute_for: tuple[str, ...] = ()  # signal effects, e.g. ("repair",): these also get NoExecute

    def effects(self, item: dict[str, Any]) -> list[str]:
        """The taint effects a drained node gets, from the effects of its reasons."""
        wanted = ["NoSchedule"] if self.taint else []
        reasons = {r.get("effect") for r in item.get("reasons", [])}
        return wanted + (["NoExecute"] if reasons & set(self.no_execute_for) else [])


def kube_policy(raw: Any) -> KubePolicy:
    """The ``kubernetes:`` block of a policy mapping; a bad value is a clear error."""
    block = raw.get("kubernetes") or {} if isinstance(raw, dict) else {}
    if not isinstance(block, dict):
        raise ValueError("kubernetes: must be a mapping (cordon, taint, no_execute_for)")
    unknown = set(block) - {"cordon", "taint", "no_execute_for"}
    if unknown:
        raise ValueError(f"kubernetes: unknown key(s) {', '.join(sorted(unknown))}")
    states = block.get("no_execute_for", [])
    allowed = ("unhealthy", "repair")
    if not isinstance(states, list) or not all(s in allowed for s in states):
        raise ValueError(f"kubernetes.no_execute_for: a list of signal effects among {', '.join(allowed)}")
    for key in ("cordon", "taint"):
        if not isinstance(block.get(key, True), bool):
            raise ValueError(f"kubernetes.{key}: true or false")
    return KubePolicy(bool(block.get("cordon", True)), bool(block.get("taint", True)), tuple(states))


def load_kube_policy(path: Path) -> KubePolicy:
    return kube_policy(yaml.safe_load(path.read_text()) or {})


# ---------------------------------------------------------------------------------- the API
@dataclass
class KubeAPI(kubeapi.KubeAPI):
    """The API server, with the node calls the sync makes; its failures are KubernetesError."""

    error: ClassVar[type[kubeapi.KubeAPIError]] = KubernetesError

    def nodes(self) -> list[dict[str, Any]]:
        return self.request("GET", "/api/v1/nodes")["items"]

    def node(self, name: str) -> dict[str, Any]:
        return self.request("GET", f"/api/v1/nodes/{name}")

    def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/merge-patch+json"}
        return self.request("PATCH", f"/api/v1/nodes/{name}", json=patch, headers=headers)

    def patch_status(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        # strategic merge: conditions merge by type, the kubelet's own are left as they are
        headers = {"Content-Type": "application/strategic-merge-patch+json"}
        return self.request("PATCH", f"/api/v1/nodes/{name}/status", json=patch, headers=headers)


def from_kubeconfig(path: Path) -> KubeAPI:
    """The current context of a kubeconfig (fleetsight/kubeapi.py)."""
    return kubeapi.from_kubeconfig(path, KubeAPI)


def connect(kubeconfig: Path | None) -> KubeAPI:
    """A kubeconfig when given (or $KUBECONFIG), else the pod's ServiceAccount (in-cluster)."""
    return kubeapi.connect(kubeconfig, KubeAPI)


# ---------------------------------------------------------------------------------- inventory
class KubernetesSources(Sources):
    """The usual sources plus the Nodes API as inventory: every node is known to the service, in the
    scalable unit its label names (the breaker's unit_label, else unit_fallback_label)."""

    def __init__(self, policy: Policy, *args: Any, api: KubeAPI, **kwargs: Any) -> None:
        super().__init__(policy, *args, **kwargs)
        self.api = api

    def collect(self, now: float, only: set[str] | None = None) -> list[SourceResult]:
        results = super().collect(now, only)
        if only is not None and "kubernetes" not in only:  # the inventory is the sweep's to read
            return results
        breaker = self.policy.breaker
        try:
            nodes = {
                n["metadata"]["name"]: (labels := n["metadata"].get("labels") or {}).get(breaker.unit_label)
                or labels.get(breaker.unit_fallback_label, "")
                for n in self.api.nodes()
            }
        except KubernetesError as exc:
            log.warning("event=source_failed source=kubernetes error=%s", exc)
            return [*results, SourceResult("kubernetes", False, error=str(exc))]
        return [*results, SourceResult("kubernetes", True, nodes=nodes)]


# ---------------------------------------------------------------------------------- the sync
@dataclass
class NodeChange:
    node: str
    actions: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "actions": self.actions}


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition_for(item: dict[str, Any]) -> dict[str, str]:
    state = item["state"]
    reasons = [r.get("summary") or r.get("signal", "") for r in item.get("reasons", [])]
    message = "; ".join(dict.fromkeys(r for r in reasons if r)) or "no health signal"
    return {
        "type": CONDITION,
        "status": "True" if state in FIT_STATES else "False",
        "reason": "FleetSight" + state.capitalize(),
        "message": message[:MESSAGE_MAX],
    }


def node_patch(
    node: dict[str, Any], item: dict[str, Any], drain: bool, policy: KubePolicy
) -> tuple[dict[str, Any], list[str]]:
    """The merge patch (labels, annotations, cordon, taints) that brings node to what FleetSight wants,
    and what it does in words; ({}, []) when nothing is to change."""
    state = item["state"]
    meta, spec = node["metadata"], node.get("spec") or {}
    annotations = meta.get("annotations") or {}
    ours_cordoned = annotations.get(CORDONED) == "true"
    ours_effects = [e for e in annotations.get(TAINTS, "").split(",") if e]
    taints = list(spec.get("taints") or [])
    unschedulable = bool(spec.get("unschedulable"))
    patch_meta: dict[str, Any] = {}
    patch_spec: dict[str, Any] = {}
    actions: list[str] = []
    if (meta.get("labels") or {}).get(LABEL) != state:
        patch_meta["labels"] = {LABEL: state}
        actions.append(f"label {LABEL}={state}")
    new_annotations: dict[str, str | None] = {}
    if drain and policy.cordon and not unschedulable:
        patch_spec["unschedulable"] = True
        new_annotations[CORDONED] = "true"
        actions.append("cordon")
    elif not drain and ours_cordoned:
        if unschedulable:
            patch_spec["unschedulable"] = False
            actions.append("uncordon (FleetSight's cordon)")
        new_annotations[CORDONED] = None
    wanted = policy.effects(item) if drain else []
    keep = [t for t in taints if not (t.get("key") == TAINT_KEY and t.get("effect") in ours_effects)]
    present = {t.get("effect") for t in taints if t.get("key") == TAINT_KEY}
    add = [e for e in wanted if e not in present or e in ours_effects]
    ours = [e for e in wanted if e in add]
    fresh = []
    for effect in add:  # an unchanged taint of ours is kept as it is (its timeAdded too)
        old = [
            t for t in taints if (t.get("key"), t.get("value"), t.get("effect")) == (TAINT_KEY, state, effect)
        ]
        fresh.append(
            old[0] if old else {"key": TAINT_KEY, "value": state, "effect": effect, "timeAdded": now_iso()}
        )
    new_taints = keep + fresh
    if _taint_set(new_taints) != _taint_set(taints):
        patch_spec["taints"] = new_taints
        gone = sorted(_taint_set(taints) - _taint_set(new_taints))
        came = sorted(_taint_set(new_taints) - _taint_set(taints))
        actions += [f"taint {k}={v}:{e}" for k, v, e in came] + [f"untaint {k}:{e}" for k, _, e in gone]
    if ",".join(ours) != ",".join(ours_effects):
        new_annotations[TAINTS] = ",".join(ours) or None
    if new_annotations:
        patch_meta["annotations"] = new_annotations
    if not patch_meta and not patch_spec:
        return {}, []
    patch_meta["resourceVersion"] = meta["resourceVersion"]  # fails with 409 if the node changed since
    return {"metadata": patch_meta, **({"spec": patch_spec} if patch_spec else {})}, actions


def _taint_set(taints: Iterable[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(t.get("key", ""), t.get("value", ""), t.get("effect", "")) for t in taints}


def status_patch(node: dict[str, Any], wanted: dict[str, str]) -> dict[str, Any] | None:
    """The strategic-merge patch of the condition; None when it already says the same (a heartbeat is
    not written every round: every node write wakes every node watcher)."""
    old = next(
        (c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == CONDITION), None
    )
    if old and all(old.get(k) == v for k, v in wanted.items()):
        return None
    stamp = now_iso()
    changed = old is None or old.get("status") != wanted["status"]
    condition = {
        **wanted,
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": stamp if changed else old.get("lastTransitionTime", stamp),
    }
    return {"status": {"conditions": [condition]}}


def fetch_health(
    url: str, timeout: float, token: str | None
) -> tuple[dict[str, dict[str, Any]] | None, set[str]]:
    """The service's node states and its drain list; (None, {}) from a follower replica."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with httpx.Client(base_url=url.rstrip("/"), timeout=timeout, headers=headers) as client:
            nodes = client.get("/v1/nodes")
            nodes.raise_for_status()
            drain = client.get("/v1/drain-list")
            drain.raise_for_status()
    except httpx.HTTPError as exc:
        raise SyncError(f"cannot read the health service at {url}: {exc}") from exc
    if nodes.headers.get("X-FleetSight-Role") == "follower":  # health/replica.py
        return None, set()
    states = {item["node"]: item for item in nodes.json()["nodes"]}
    return states, {item["node"] for item in drain.json()["nodes"]}


def sync_node(
    api: KubeAPI, node: dict[str, Any], item: dict[str, Any], drain: bool, policy: KubePolicy, dry_run: bool
) -> list[str]:
    name = node["metadata"]["name"]
    for _ in range(CONFLICT_RETRIES):
        patch, actions = node_patch(node, item, drain, policy)
        condition = status_patch(node, condition_for(item))
        if condition is not None:
            actions = [*actions, f"condition {CONDITION}={condition['status']['conditions'][0]['status']}"]
        if dry_run or not actions:
            return actions
        try:
            if patch:
                api.patch_node(name, patch)
        except KubernetesError as exc:
            if getattr(exc, "status", 0) != 409:
                raise
            node = api.node(name)  # someone else wrote the node meanwhile: read it again
            continue
        if condition is not None:
            api.patch_status(name, condition)
        return actions
    raise KubernetesError(f"node {name} kept changing under the sync ({CONFLICT_RETRIES} conflicts)")


def sync_kubernetes(
    url: str, api: KubeAPI, policy: KubePolicy, dry_run: bool, timeout: float = 10.0, token: str | None = None
) -> list[NodeChange]:
    """One round: every Kubernetes node the health service knows gets its condition, label, and by
    policy cordon and taints; nodes the service does not know are left alone."""
    states, drain = fetch_health(url, timeout, token)
    if states is None:
        # the sidecar of the follower replica: only the leader's is applied, so one writer patches nodes
        log.info("event=kubernetes_sync_skipped reason=follower url=%s", url)
        return []
    changes = []
    for node in sorted(api.nodes(), key=lambda n: n["metadata"]["name"]):
        name = node["metadata"]["name"]
        if name not in states:
            continue
        actions = sync_node(api, node, states[name], name in drain, policy, dry_run)
        if actions:
            changes.append(NodeChange(name, actions))
            log.info("event=kubernetes_sync node=%s actions=%s dry_run=%s", name, ";".join(actions), dry_run)
    return changes
