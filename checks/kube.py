"""Intrusive checks as Kubernetes' own unit of work (`fleetsight checks kube-cycle`): a Job pinned to
the node (``spec.nodeName``) that tolerates FleetSight's taint (``fleetsight.io/unhealthy``, set by the
health service's kubernetes-sync on a drained node) and asks for every GPU of the node, so no training pod
shares it. Idle means: no pod but DaemonSets' and FleetSight's own checks on the node. Results go to the
checks service, which the pass turns into node labels ``fleetsight.io/check-<name>=PASS|ERR``.

A Job counts as running until it completed, failed, or the checks service holds a result of its check on
its node newer than the Job: that last rule keeps the pass right where no kubelet reports completion."""

from __future__ import annotations

import base64
import calendar
import hashlib
import os
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from . import runner
from .catalog import Check
from .plan import Decision, Unit, plan, with_partners
from .runner import TOKEN_ENV

TAINT_KEY = "fleetsight.io/unhealthy"  # health/kubernetes.py's taint (a contract, not an import)
CHECK_LABEL = "fleetsight.io/check"
NODE_LABEL = "fleetsight.io/check-{name}"
STARTED_ANNOTATION = "fleetsight.io/started"


SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOOL_OUTPUT = "/run/fleetsight/tool"  # the tool's stdout and exit status, from its own image's container
JOBS_MOUNT = "/etc/fleetsight/checks"  # the chart's checks ConfigMap (jobs.yml) in a check's Job


def load_jobs_file(path: Path) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    """jobs.yml (the chart's ConfigMap): ``images: {tool: {image, fleetsight}}`` and ``tools: {tool:
    [command...]}``. ValueError naming the key when it has another shape."""
    raw = yaml.safe_load(path.read_text()) or {}
    images, tools = raw.get("images") or {}, raw.get("tools") or {}
    if not isinstance(images, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("image"), str) for v in images.values()
    ):
        raise ValueError(f"{path}: images: expected tool -> {{image, fleetsight}}")
    if not isinstance(tools, dict) or not all(isinstance(v, list) for v in tools.values()):
        raise ValueError(f"{path}: tools: expected tool -> command list")
    return images, {k: [str(p) for p in v] for k, v in tools.items()}


class KubeClient:
    """The few calls the pass needs, with a kubeconfig's server, CA and bearer token; without a
    kubeconfig, the pod's own service account (the chart's CronJob)."""

    def __init__(self, kubeconfig: Path | None) -> None:
        context = ssl.create_default_context()
        if kubeconfig is None:
            server = "https://{}:{}".format(
                os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
            )
            token = (SERVICE_ACCOUNT / "token").read_text().strip()
            context.load_verify_locations(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
        else:
            config = yaml.safe_load(kubeconfig.read_text())
            cluster = config["clusters"][0]["cluster"]
            server, token = cluster["server"], config["users"][0]["user"]["token"]
            if "certificate-authority-data" in cluster:
                context.load_verify_locations(
                    cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
                )
        headers = {"Authorization": f"Bearer {token}"}
        self.client = httpx.Client(base_url=server, verify=context, headers=headers)

    def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self.client.request(method, path, timeout=10, **kwargs)
        if response.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text[:300]}")
        return response.json()


def job_name(check: str, node: str, started: float) -> str:
    """``fleetsight-check-<check>-<node>-<start in unix milliseconds>``, at most 63 characters (the
    ``job-name`` label of its pods). Milliseconds: a check that ends at once (a failed tool) can be started
    again on the node within the same second. A long node name is cut and a digest of it added, never the
    time: a cut time would give the next run on the node the same name (409 Conflict), and two nodes
    sharing a long prefix (a pair's two Jobs, started together) must still differ."""
    base, stamp = f"fleetsight-check-{check.replace('_', '-')}-{node}", str(round(started * 1000))
    if len(base) + 1 + len(stamp) > 63:
        digest = hashlib.sha256(node.encode()).hexdigest()[:6]
        base = f"{base[: 63 - len(stamp) - len(digest) - 2].rstrip('-.')}-{digest}"
    return f"{base}-{stamp}"


def started_at(item: dict[str, Any]) -> float:
    """When the pass started the Job: its ``fleetsight.io/started`` annotation (unix time, to the
    millisecond), else its creationTimestamp (whole seconds: a result of the run before, finished in the
    same second, would count as this Job's)."""
    started = (item["metadata"].get("annotations") or {}).get(STARTED_ANNOTATION)
    try:
        return float(started)
    except (TypeError, ValueError):
        stamp = item["metadata"].get("creationTimestamp", "1970-01-01T00:00:00Z")
        return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))


@dataclass
class KubeChecks:
    api: KubeClient
    catalog: dict[str, Check]
    checks_url: str
    command: list[str]  # the container's FleetSight command line (image's entry point)
    image: str = "ghcr.io/fleetsight/fleetsight:latest"
    namespace: str = "fleetsight"
    gpus: int = 8
    leaf_map: Mapping[str, frozenset[str]] = field(default_factory=dict)
    budget: int = 2
    tools: str | None = None  # the tools file inside the container (a ConfigMap), when not the default
    # The Secret (in ``namespace``) whose key ``token_key`` holds the Jobs' bearer token for POST
    # /v1/results (scope `results`): the container gets it as FLEETSIGHT_CHECKS_TOKEN. None: no token.
    token_secret: str | None = None
    token_key: str = "token"
    # Per tool, the image its Jobs run in (the chart's checks.images, jobs.yml): ``{image, fleetsight}``;
    # ``fleetsight: false`` (NVIDIA's DCGM image) runs the tool in an init container whose output the
    # FleetSight container judges. A tool not listed runs in ``image`` (a missing tool is then an unknown).
    images: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    tool_commands: Mapping[str, list[str]] = field(default_factory=dict)  # jobs.yml's `tools`
    jobs_config_map: str | None = None  # the ConfigMap holding jobs.yml, mounted where a tool needs it
    caps: Mapping[str, int] = field(default_factory=dict)  # a scan's own budget (checks/scan.py)

    def busy_nodes(self) -> set[str]:
        pods = self.api.request(
            "GET", "/api/v1/pods", params={"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"}
        )
        busy = set()
        for pod in pods["items"]:
            owners = {o.get("kind") for o in pod["metadata"].get("ownerReferences") or []}
            ours = CHECK_LABEL in (pod["metadata"].get("labels") or {})
            if pod["spec"].get("nodeName") and "DaemonSet" not in owners and not ours:
                busy.add(pod["spec"]["nodeName"])
        return busy

    def running(self, results: dict[tuple[str, str], dict[str, Any]]) -> list[Unit]:
        jobs = self.api.request(
            "GET", f"/apis/batch/v1/namespaces/{self.namespace}/jobs", params={"labelSelector": CHECK_LABEL}
        )
        units = []
        for job in jobs["items"]:
            check, node = job["metadata"]["labels"][CHECK_LABEL], job["spec"]["template"]["spec"]["nodeName"]
            status = job.get("status") or {}
            result = results.get((node, check))
            done = (
                status.get("succeeded")
                or status.get("failed")
                or (result and result["finished"] >= started_at(job))
            )
            if not done:
                units.append(Unit(check, (node,)))
        return units

    def cycle(
        self, wanted: list[Unit], nodes: list[str], results: dict[tuple[str, str], dict[str, Any]]
    ) -> Decision:
        idle = set(nodes) - self.busy_nodes()
        pairs = {c.name for c in self.catalog.values() if c.nodes == 2}
        asked = {n for u in wanted if u.validation for n in u.nodes}  # not a partner: under validation
        wanted = with_partners(wanted, pairs, idle - asked, self.leaf_map)
        sizes = {c.name: c.nodes for c in self.catalog.values()}
        decision = plan(wanted, idle, self.running(results), self.leaf_map, self.budget, sizes, self.caps)
        for unit in decision.start:
            for job in self.jobs(unit):
                self.api.request("POST", f"/apis/batch/v1/namespaces/{self.namespace}/jobs", json=job)
        return decision

    def jobs(self, unit: Unit) -> list[dict[str, Any]]:
        """A single-node check is one Job; a pair check two, one pinned to each node, started together:
        the server side on the second node, the client (which posts both nodes' results) on the first,
        on the host network (perftest's handshake goes to the server node's address)."""
        if self.catalog[unit.check].nodes == 1:
            return [self.job(unit)]
        client, server = unit.nodes
        address = self.node_address(server)
        jobs = []
        for here in (server, client):
            args = ["checks", "pair", "--check", unit.check, "--client", client, "--server", server]
            args += ["--server-address", address, "--here", here]
            job = self.job(Unit(unit.check, (here,)), args)
            job["spec"]["template"]["spec"]["hostNetwork"] = True
            jobs.append(job)
        return jobs

    def _tool_init_container(self, check: Check, image: str) -> dict[str, Any]:
        """The tool in its own image (NVIDIA's DCGM image has no FleetSight): an init container with the
        node's GPUs runs it and leaves its output and exit status in a shared emptyDir, always exiting 0
        (dcgmi exits non-zero on a failed test, which must still be judged); the FleetSight container then
        judges the output (`checks run --tool-output`)."""
        command = [*self.tool_commands.get(check.tool, [check.tool]), *check.args]
        script = (
            f'timeout {int(2 * check.seconds)} "$@" >{TOOL_OUTPUT}/stdout 2>&1; '
            f"echo $? >{TOOL_OUTPUT}/rc; exit 0"
        )
        init: dict[str, Any] = {
            "name": "tool",
            "image": image,
            "command": ["sh", "-c", script, "tool", *command],
            "volumeMounts": [{"name": "tool-output", "mountPath": TOOL_OUTPUT}],
            # how NVIDIA runs its DCGM container: the diagnostics need the profiling and reset privileges
            "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}},
        }
        if self.gpus:
            init["resources"] = {"limits": {"nvidia.com/gpu": str(self.gpus)}}
        return {"initContainers": [init], "volumes": [{"name": "tool-output", "emptyDir": {}}]}

    def node_address(self, node: str) -> str:
        addresses = self.api.request("GET", f"/api/v1/nodes/{node}")["status"].get("addresses", [])
        internal = [a["address"] for a in addresses if a.get("type") == "InternalIP"]
        return internal[0] if internal else node

    def job(self, unit: Unit, side: list[str] | None = None) -> dict[str, Any]:
        check, node, started = self.catalog[unit.check], unit.nodes[0], round(time.time(), 3)
        name = job_name(check.name, node, started)
        what = side or ["checks", "run", "--node", node, "--check", check.name]
        args = [*self.command, *what, "--report", self.checks_url]
        spec = self.images.get(check.tool)
        pod: dict[str, Any] = {}
        if spec is not None and not spec.get("fleetsight", True) and side is None:
            args += ["--tool-output", TOOL_OUTPUT]
            pod = self._tool_init_container(check, str(spec["image"]))
        elif spec is not None and self.jobs_config_map:  # FleetSight beside the tool: jobs.yml's commands
            args += ["--tools", f"{JOBS_MOUNT}/jobs.yml"]
            pod = {"volumes": [{"name": "jobs", "configMap": {"name": self.jobs_config_map}}]}
        elif self.tools:
            args += ["--tools", self.tools]
        image = str(spec["image"]) if spec is not None and spec.get("fleetsight", True) else self.image
        container: dict[str, Any] = {"name": "check", "image": image, "command": args}
        if self.token_secret:
            ref = {"name": self.token_secret, "key": self.token_key}
            container["env"] = [{"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": ref}}]
        if self.gpus and "initContainers" not in pod:
            container["resources"] = {"limits": {"nvidia.com/gpu": str(self.gpus)}}
        if "volumes" in pod:
            mount = TOOL_OUTPUT if "initContainers" in pod else JOBS_MOUNT
            name = pod["volumes"][0]["name"]
            container["volumeMounts"] = [{"name": name, "mountPath": mount, "readOnly": name == "jobs"}]
        labels = {CHECK_LABEL: check.name, "app.kubernetes.io/part-of": "fleetsight"}
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": labels,
                "annotations": {STARTED_ANNOTATION: f"{started:.3f}"},
            },
            "spec": {
                "backoffLimit": 0,
                "activeDeadlineSeconds": int(2 * check.seconds),
                "ttlSecondsAfterFinished": 3600,
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeName": node,  # pinned: the scheduler (and its cordon) is bypassed on purpose
                        "restartPolicy": "Never",
                        "tolerations": [
                            {"key": TAINT_KEY, "operator": "Exists"},
                            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                        ],
                        "containers": [container],
                        **pod,
                    },
                },
            },
        }

    def label_results(self, results: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
        labels: dict[str, dict[str, str]] = {}
        for item in results:
            key = NODE_LABEL.format(name=item["check"].replace("_", "-"))
            labels.setdefault(item["node"], {})[key] = runner.status_of(item)
        headers = {"Content-Type": "application/merge-patch+json"}
        for node, values in labels.items():
            self.api.request(
                "PATCH", f"/api/v1/nodes/{node}", json={"metadata": {"labels": values}}, headers=headers
            )
        return labels
