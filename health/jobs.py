"""``GET /v1/jobs/{job}/faults``: every fault that touched a job's nodes and links over a window.

The job's nodes come from the one job identity the anomaly service publishes,
``fleetsight_job_node_info{cluster, node, hpc_job, namespace, scheduler}`` (1 per job and node; a
Kubernetes job id is ``<namespace>/<name>``), over the whole window: a job that lost a node to a fault
still lists it. Nodes the anomaly service never saw in the job (it started late, or was down) come from
the GPUs' own labels, which Prometheus records every 30 s by itself (``node_job:dcgm_gpus:group30s``,
rules/anomaly.yml): dcgm-exporter's ``hpc_job`` (Slurm's job mapping), or a Kubernetes job's namespace
and controller pod label (the pod-owner fallback's jobs have none there). The faults, all read from
Prometheus so resolved ones count too:

- alerts (``ALERTS{alertstate="firing"}``) with a ``node`` label on one of those nodes, first and last
  seen from a range query, the start refined by ``ALERTS_FOR_STATE`` (its value is the alert's activeAt);
- alerts on a switch port or a whole switch that name no node, mapped to the job's hosts behind it by
  ``fleetsight_fabric_switch_port_peer_info`` (a leaf-level fault reaches every host of the leaf);
- the anomaly service's stragglers of this job (``fleetsight_straggler{hpc_job}``).

Each node also gets the health service's own current state and reasons. Summaries: an active alert's
rendered annotation (Prometheus ``/api/v1/alerts``); a resolved one's rule summary when it needs only
labels; else a plain line. Runbooks: the rule's ``runbook_url``, else the policy's.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI, HTTPException, Query

from fleetsight.prometheus import Prometheus, PrometheusError
from fleetsight.promql import any_of, quote
from fleetsight.settings import HPC_JOB_LABEL, KUBERNETES

from .policy import PolicyError, parse_duration

if TYPE_CHECKING:
    from .service_protocol import ServiceReads as HealthService

DEFAULT_WINDOW = "6h"
MAX_WINDOW_S = 14 * 86400  # a job's history, not the fleet's: longer windows are a Thanos question
POINTS = 720  # points per series of a range query: 30 s resolution over 6 h
# Labels that say where a fault is, shown on their own; the rest stay in the evidence.
PLACE_LABELS = ("gpu", "device", "port", "hca_port", "switch", "switch_port", "psu", "fs", "target")
NOISE_LABELS = ("alertstate", "__name__", "instance", "job")


@dataclass
class Window:
    text: str
    start: float
    end: float

    @property
    def step(self) -> float:
        return max(15.0, (self.end - self.start) / POINTS)

    @property
    def range(self) -> str:
        return f"{int(self.end - self.start)}s"


@dataclass
class Fault:
    kind: str
    name: str
    nodes: list[str]
    labels: dict[str, str]
    first_seen: float
    last_seen: float
    active: bool
    source: str
    severity: str = ""
    summary: str = ""
    runbook: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "alertname": self.name,
            "nodes": self.nodes,
            **{k: self.labels[k] for k in PLACE_LABELS if self.labels.get(k)},
            "severity": self.severity,
            "first_seen": iso(self.first_seen),
            "last_seen": iso(self.last_seen),
            "active": self.active,
            "summary": self.summary,
            "runbook": self.runbook,
            "evidence": {"source": self.source, "labels": self.labels, **self.extra},
        }


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def series_range(prom: Prometheus, promql: str, window: Window) -> list[dict[str, Any]]:
    """A range query over the window, at its step."""
    return prom.query_range(promql, window.start, window.end, window.step)


# ---------------------------------------------------------------------------------- the job's nodes
# The GPUs' job labels as rules/anomaly.yml records them (whether or not the anomaly service runs), and
# the scheduler names the anomaly service gives a job read from them (fleetsight/settings.py).
RECORDED_JOBS = "node_job:dcgm_gpus:group30s"
# The recorded series' labels that are not a training-job controller's pod label.
NOT_CONTROLLER = ("__name__", "cluster", "node", "modelName", "hpc_job", "namespace", "pod")


def job_nodes(prom: Prometheus, job: str, window: Window) -> dict[str, dict[str, str]]:
    """node -> its job-identity labels (cluster, namespace, scheduler), over the whole window: the
    anomaly service's identity first, then the nodes only the GPUs' own labels name (the fleet test's
    west cluster: an Xid moved a JobSet off a node before the anomaly service, started late, saw it
    there, and the health service could not tie that fault to the job)."""
    promql = (
        f"max by (cluster, node, hpc_job, namespace, scheduler) "
        f"(max_over_time(fleetsight_job_node_info{{hpc_job={quote(job)}}}[{window.range}]))"
    )
    nodes: dict[str, dict[str, str]] = {}
    for series in prom.query(promql, window.end):
        labels = series["metric"]
        if labels.get("node"):
            nodes[labels["node"]] = labels
    for node, labels in recorded_nodes(prom, job, window).items():
        nodes.setdefault(node, labels)
    return nodes


def recorded_nodes(prom: Prometheus, job: str, window: Window) -> dict[str, dict[str, str]]:
    """The job's nodes as the GPUs' labels name them: a Slurm job by dcgm-exporter's ``hpc_job`` label,
    a Kubernetes job ``<namespace>/<name>`` by its namespace and a controller's pod label of that name
    (whichever controller: the keys are the recording rule's, not repeated here)."""
    namespace, slash, name = job.partition("/")
    selector = f"namespace={quote(namespace)}" if slash else f"hpc_job={quote(job)}"
    promql = f"max_over_time({RECORDED_JOBS}{{{selector}}}[{window.range}])"
    nodes: dict[str, dict[str, str]] = {}
    for series in prom.query(promql, window.end):
        labels = series["metric"]
        named = any(value == name for key, value in labels.items() if key not in NOT_CONTROLLER)
        if not labels.get("node") or (slash and not named):
            continue
        scheduler = KUBERNETES if slash else HPC_JOB_LABEL
        nodes[labels["node"]] = {
            "cluster": labels.get("cluster", ""),
            "node": labels["node"],
            "hpc_job": job,
            "namespace": namespace if slash else labels.get("namespace", ""),
            "scheduler": scheduler,
        }
    return nodes


# ---------------------------------------------------------------------------------- alerts
def seen(series: dict[str, Any], window: Window) -> tuple[float, float, bool]:
    """First and last timestamps of a range-query series, and whether it is still there at the end."""
    stamps = [float(t) for t, _ in series["values"]]
    return stamps[0], stamps[-1], stamps[-1] >= window.end - window.step / 2


def alert_key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in NOISE_LABELS))


def active_since(prom: Prometheus, selector: str, window: Window) -> dict[tuple[tuple[str, str], ...], float]:
    """The earliest activeAt of each alert in the window (ALERTS_FOR_STATE's value)."""
    promql = f"min_over_time(ALERTS_FOR_STATE{{{selector}}}[{window.range}])"
    return {alert_key(s["metric"]): float(s["value"][1]) for s in prom.query(promql, window.end)}


def node_alerts(prom: Prometheus, nodes: Iterable[str], window: Window) -> list[Fault]:
    selector = f"node=~{any_of(nodes)}"
    since = active_since(prom, selector, window)
    faults = []
    for series in series_range(prom, f'ALERTS{{alertstate="firing", {selector}}}', window):
        labels = {k: v for k, v in series["metric"].items() if k not in NOISE_LABELS}
        first, last, active = seen(series, window)
        first = min(first, since.get(alert_key(labels), first))
        faults.append(alert_fault(labels, [labels["node"]], first, last, active))
    return faults


def switch_alerts(prom: Prometheus, nodes: Iterable[str], window: Window) -> list[Fault]:
    """Alerts on a switch or a switch port that name no host: the job's hosts behind it, from UFM's
    peers (a port: its one host; a switch: every host cabled to it)."""
    peers_promql = (
        "max by (switch, switch_port, node, hca_port) (max_over_time("
        f"fleetsight_fabric_switch_port_peer_info{{node=~{any_of(nodes)}}}[{window.range}]))"
    )
    peers = [s["metric"] for s in prom.query(peers_promql, window.end)]
    if not peers:
        return []
    switches = {p["switch"] for p in peers}
    selector = f'alertstate="firing", node="", switch=~{any_of(switches)}'
    faults = []
    for series in series_range(prom, f"ALERTS{{{selector}}}", window):
        labels = {k: v for k, v in series["metric"].items() if k not in NOISE_LABELS}
        # An alert on one port names that port; one on the whole switch (no switch_port) every port.
        port = labels.get("switch_port")
        behind = sorted(
            {p["node"] for p in peers if p["switch"] == labels["switch"] and port in (None, p["switch_port"])}
        )
        if behind:
            first, last, active = seen(series, window)
            faults.append(alert_fault(labels, behind, first, last, active, via="fabric peers"))
    return faults


def alert_fault(
    labels: dict[str, str], nodes: list[str], first: float, last: float, active: bool, via: str = ""
) -> Fault:
    extra = {"nodes_from": via} if via else {}
    return Fault(
        kind="alert",
        name=labels.get("alertname", "unnamed"),
        nodes=nodes,
        labels=labels,
        first_seen=first,
        last_seen=last,
        active=active,
        source="prometheus ALERTS",
        severity=labels.get("severity", ""),
        extra=extra,
    )


def stragglers(prom: Prometheus, job: str, window: Window) -> list[Fault]:
    promql = f"max by (cluster, node, hpc_job, cause) (fleetsight_straggler{{hpc_job={quote(job)}}} > 0)"
    faults = []
    for series in series_range(prom, promql, window):
        labels = series["metric"]
        first, last, active = seen(series, window)
        cause = labels.get("cause") or "unknown cause"
        faults.append(
            Fault(
                kind="straggler",
                name="straggler",
                nodes=[labels.get("node", "")],
                labels=labels,
                first_seen=first,
                last_seen=last,
                active=active,
                source="anomaly service (fleetsight_straggler)",
                severity="warning",
                summary=f"{labels.get('node')} is the slow node of job {job} ({cause})",
            )
        )
    return faults


# ---------------------------------------------------------------------------------- words and runbooks
def rule_annotations(prom: Prometheus) -> dict[str, list[tuple[dict[str, str], dict[str, str]]]]:
    """alertname -> (static labels, annotation templates) of each of its alerting rules: one name may
    have several rules (the host side and the switch side of InfiniBandLinkFlapping)."""
    found: dict[str, list[tuple[dict[str, str], dict[str, str]]]] = {}
    for group in prom.rules("alert"):
        for rule in group.get("rules", []):
            found.setdefault(rule.get("name", ""), []).append(
                (rule.get("labels", {}), rule.get("annotations", {}))
            )
    return found


def rule_of(rules: list[tuple[dict[str, str], dict[str, str]]], labels: dict[str, str]) -> dict[str, str]:
    """The annotations of the rule that made this alert: the most specific one whose static labels it
    carries (the switch side's `side: switch` before the host side's none)."""
    fitting = [(len(static), notes) for static, notes in rules if static.items() <= labels.items()]
    return max(fitting, key=lambda item: item[0])[1] if fitting else {}


def active_annotations(prom: Prometheus) -> dict[tuple[tuple[str, str], ...], dict[str, str]]:
    """The rendered annotations of the alerts active now, keyed like alert_key."""
    alerts = prom.alerts()
    return {alert_key(a.get("labels", {})): a.get("annotations", {}) for a in alerts}


_LABEL_REF = re.compile(r"\{\{\s*\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")


def render_summary(template: str, labels: dict[str, str]) -> str:
    """A rule's summary with its label references filled in; "" when it needs more than labels (its
    $value is gone once the alert resolved)."""
    text = _LABEL_REF.sub(lambda m: labels.get(m.group(1), ""), template)
    return "" if "{{" in text else text


def plain_summary(fault: Fault) -> str:
    where = ", ".join(f"{k} {fault.labels[k]}" for k in PLACE_LABELS if fault.labels.get(k))
    return f"{fault.name} on {', '.join(fault.nodes)}" + (f" ({where})" if where else "")


def describe(faults: list[Fault], prom: Prometheus, service: HealthService) -> None:
    rules = rule_annotations(prom)
    rendered = active_annotations(prom)
    for fault in faults:
        template = rule_of(rules.get(fault.name, []), fault.labels)
        now = rendered.get(alert_key(fault.labels), {}) if fault.active else {}
        if not fault.summary:
            from_rule = render_summary(template.get("summary", ""), fault.labels)
            fault.summary = now.get("summary") or from_rule or plain_summary(fault)
        fault.runbook = (
            now.get("runbook_url") or template.get("runbook_url") or service.policy.runbook(fault.name)
        )


# ---------------------------------------------------------------------------------- node states
def node_states(service: HealthService, nodes: Iterable[str]) -> list[dict[str, Any]]:
    """The health service's own view of each node now (its reasons, without history)."""
    known = service.engine.snapshot()["nodes"]
    states = []
    for node in sorted(nodes):
        item = known.get(node)
        if item is None:
            states.append({"node": node, "state": "unknown", "reasons": []})
            continue
        reasons = [
            {k: r.get(k) for k in ("signal", "source", "effect", "since", "summary", "runbook", "last_seen")}
            for r in item.get("reasons", [])
        ]
        states.append({"node": node, "state": item["state"], "since": item.get("since"), "reasons": reasons})
    return states


# ---------------------------------------------------------------------------------- the route
def parse_window(text: str, now: float) -> Window:
    try:
        seconds = parse_duration(text, "window")
    except PolicyError as exc:
        raise HTTPException(422, str(exc)) from exc
    if not 0 < seconds <= MAX_WINDOW_S:
        limit = f"{MAX_WINDOW_S // 86400}d"
        raise HTTPException(422, f"window: {text!r} must be more than 0s and at most {limit}")
    return Window(text, now - seconds, now)


def job_faults(service: HealthService, job: str, window: Window) -> dict[str, Any]:
    # The sources' own client (the service's source timeout; its connections kept between requests)
    prom = service.sources.prometheus
    if prom is None:
        # Jobs are known only from Prometheus (fleetsight_job_node_info, the GPUs' recorded job labels):
        # without it no job is known.
        raise HTTPException(404, f"unknown job {job!r}: no Prometheus (--prometheus-url) to find jobs in")
    try:
        return answer(service, prom, job, window)
    except PrometheusError as exc:
        raise HTTPException(502, str(exc)) from exc


def answer(service: HealthService, prom: Prometheus, job: str, window: Window) -> dict[str, Any]:
    nodes = job_nodes(prom, job, window)
    if not nodes:
        raise HTTPException(
            404,
            f"unknown job {job!r}: no fleetsight_job_node_info{{hpc_job={quote(job)}}} nor "
            f"{RECORDED_JOBS}{{hpc_job={quote(job)}}} in the last {window.text} (Kubernetes jobs are "
            "<namespace>/<name>)",
        )
    faults = node_alerts(prom, nodes, window) + switch_alerts(prom, nodes, window)
    faults += stragglers(prom, job, window)
    describe(faults, prom, service)
    faults.sort(key=lambda f: (f.first_seen, f.name, f.nodes))
    identity = next(iter(nodes.values()))
    return {
        "job": job,
        "cluster": identity.get("cluster", ""),
        "scheduler": identity.get("scheduler", ""),
        "namespace": identity.get("namespace", ""),
        "window": window.text,
        "from": iso(window.start),
        "to": iso(window.end),
        "nodes": node_states(service, nodes),
        "count": len(faults),
        "active": sum(f.active for f in faults),
        "faults": [f.as_json() for f in faults],
    }


# A bad window or job id is answered 422 with a sentence in ``detail`` (not FastAPI's list of field
# errors): the OpenAPI document says so, so a client (and the schema fuzz) expects it.
BAD_INPUT_RESPONSE: dict[int | str, dict[str, Any]] = {
    422: {
        "description": "A bad or too long window, or an empty job id",
        "content": {"application/json": {"schema": {"type": "object", "properties": {"detail": {}}}}},
    },
    502: {"description": "Prometheus unreachable or answering an error"},
}


def add_routes(app: FastAPI, service: HealthService, read_check: Any) -> None:
    """``read_check``: the service's read-scope check, as for every other read."""

    @app.get(
        "/v1/jobs/{job:path}/faults",
        summary="Every fault on a job's nodes and links over a window (?window=6h), with evidence",
        dependencies=[Depends(read_check)],
        responses=BAD_INPUT_RESPONSE,
    )
    def faults(
        job: str,
        window: str = Query(DEFAULT_WINDOW, description="How far back, e.g. 30m, 6h, 2d"),
    ) -> dict[str, Any]:
        # A blocking route on purpose: FastAPI runs it in its thread pool, so the Prometheus queries
        # never hold up the event loop that answers the scheduler's prolog.
        if not job.strip("/"):
            raise HTTPException(422, "job: empty job id")
        return job_faults(service, job, parse_window(window, time.time()))
