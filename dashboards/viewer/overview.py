"""The fleet overview's data, from the same Prometheus the dashboards read: every node's health state (the
health service's ``fleetsight_node_health_state``) placed in its rack (the rack label the service discovery
gives each node's dcgm-exporter), the alerts firing and pending (``ALERTS``: a pending one is a fault seen
but not yet held for its rule's ``for``), and the stragglers the anomaly service flags
(``fleetsight_straggler``). A query that fails is named in ``errors``; the rest is still drawn."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fleetsight.prometheus import Prometheus, PrometheusError

HEALTH = "fleetsight_node_health_state == 1"
RACKS = "group by (node, rack) (DCGM_FI_DEV_GPU_TEMP)"
ALERTS = "ALERTS"
STRAGGLERS = "fleetsight_straggler == 1"
NODE_DASHBOARD = "/d/fleetsight-node?var-node="
JOB_DASHBOARD = "/d/fleetsight-my-job?var-hpc_job="


def labels_of(prometheus: Prometheus, query: str, errors: list[str]) -> list[dict[str, str]]:
    try:
        return [sample["metric"] for sample in prometheus.query(query)]
    except PrometheusError as exc:
        errors.append(f"{query}: {exc}")
        return []


def nodes(prometheus: Prometheus, errors: list[str]) -> list[dict[str, str]]:
    """Every node the health service or the GPU exporters know, its state (``unknown`` where the health
    service has none) and its rack (``-`` where no exporter says)."""
    racks = {m["node"]: m.get("rack", "-") for m in labels_of(prometheus, RACKS, errors) if "node" in m}
    states = {
        m["node"]: m.get("state", "unknown") for m in labels_of(prometheus, HEALTH, errors) if "node" in m
    }
    every = sorted(set(racks) | set(states))
    return [{"node": n, "state": states.get(n, "unknown"), "rack": racks.get(n, "-")} for n in every]


def alert_row(labels: dict[str, str]) -> dict[str, Any]:
    return {
        "alertname": labels.get("alertname", ""),
        "state": labels.get("alertstate", ""),
        "severity": labels.get("severity", ""),
        "node": labels.get("node", ""),
        "labels": labels,
    }


def overview(
    prometheus: Prometheus, chat_url: str | None, clock: Callable[[], float] = time.time
) -> dict[str, Any]:
    errors: list[str] = []
    found_nodes = nodes(prometheus, errors)
    alerts = sorted(
        (alert_row(m) for m in labels_of(prometheus, ALERTS, errors)),
        key=lambda a: (a["state"] != "firing", a["severity"] != "critical", a["alertname"], a["node"]),
    )
    stragglers = sorted(
        ({"hpc_job": m.get("hpc_job", ""), "node": m.get("node", ""), "cause": m.get("cause", "")}
         for m in labels_of(prometheus, STRAGGLERS, errors)),
        key=lambda s: (s["hpc_job"], s["node"]),
    )  # fmt: skip
    links = {"chat": chat_url, "node": NODE_DASHBOARD, "job": JOB_DASHBOARD}
    return {
        "nodes": found_nodes,
        "alerts": alerts,
        "stragglers": stragglers,
        "links": links,
        "errors": errors,
        "at": clock(),
    }
