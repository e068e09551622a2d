"""The fleet page's data (``/fleet``): one row per cluster, from the global layer's ``GET /v1/clusters``
(fleet/api.py: whether each cluster's health service answers, its node states, whether its metrics
answer) and from the Prometheus/Thanos Query the dashboards read (firing alerts and GPUs reporting per
cluster, and the firing alerts with their cluster), plus the clusters the view is missing.

Partial is honest, as the global layer is: every cluster the layer names under ``missing`` (its health
service did not answer) or ``metrics_missing`` (none of its metrics stores answers) is named in
``partial``, the page's banner, with the reason. Without a global layer (no ``--fleet-url``) the page says
so and shows what Thanos alone tells. A source that fails is named in ``errors``; the rest is still drawn.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from fleetsight.prometheus import Prometheus, PrometheusError

from ..common_queries import FIRING, FIRING_BY_CLUSTER, GPUS_BY_CLUSTER

NO_LABEL = ""  # a series without a cluster label (a Prometheus read directly, not through Thanos)
CLUSTERS_PATH = "/v1/clusters"


def per_cluster(prometheus: Prometheus, query: str, errors: list[str]) -> dict[str, float] | None:
    """``count by (cluster) (...)``'s value per cluster ("" for series without the label); None when the
    query failed (the figures are then unknown, not zero)."""
    try:
        found = prometheus.query(query)
    except PrometheusError as exc:
        errors.append(f"{query}: {exc}")
        return None
    return {s["metric"].get("cluster", NO_LABEL): float(s["value"][1]) for s in found}


def firing_alerts(prometheus: Prometheus, errors: list[str]) -> list[dict[str, Any]]:
    try:
        found = prometheus.query(FIRING)
    except PrometheusError as exc:
        errors.append(f"{FIRING}: {exc}")
        return []
    rows = [
        {
            "cluster": m.get("cluster", NO_LABEL),
            "alertname": m.get("alertname", ""),
            "severity": m.get("severity", ""),
            "node": m.get("node", ""),
            "labels": m,
        }
        for m in (s["metric"] for s in found)
    ]
    return sorted(rows, key=lambda a: (a["cluster"], a["severity"] != "critical", a["alertname"], a["node"]))


def global_layer(client: httpx.Client | None, fleet_url: str | None) -> tuple[dict[str, Any] | None, str]:
    """(the layer's /v1/clusters answer, the error): (None, "") without a layer configured."""
    if client is None or not fleet_url:
        return None, ""
    url = fleet_url.rstrip("/") + CLUSTERS_PATH
    try:
        answer = client.get(url)
    except httpx.HTTPError as exc:
        return None, f"the global layer ({url}) did not answer: {exc}"
    if not answer.is_success:
        return None, f"the global layer ({url}) answered HTTP {answer.status_code}: {answer.text[:300]}"
    try:
        body = answer.json()
    except ValueError:
        return None, f"the global layer ({url}) answered no JSON: {answer.text[:300]}"
    if not isinstance(body, dict) or not isinstance(body.get("clusters"), list):
        return None, f"the global layer ({url}) answered no cluster list"
    return body, ""


def partial(layer: dict[str, Any] | None) -> list[dict[str, str]]:
    """Every cluster the view is missing, once per cluster and side: ``what`` is ``health`` (its health
    service did not answer the layer) or ``metrics`` (no store of its metrics answers)."""
    if layer is None:
        return []
    gaps = [{"cluster": str(g.get("cluster", "")), "what": "health", "error": str(g.get("error", ""))}
            for g in layer.get("missing") or []]  # fmt: skip
    gaps += [
        {"cluster": str(g.get("cluster", "")), "what": "metrics", "error": str(g.get("error", ""))}
        for g in layer.get("metrics_missing") or []
    ]
    return gaps


def figure(values: dict[str, float] | None, name: str, blind: bool) -> int | None:
    """A cluster's count, or None (unknown) when its metrics cannot be read or the query failed: a
    cluster the global Query cannot see has no GPUs *reported*, which is not zero GPUs."""
    if values is None or blind:
        return None
    return int(values.get(name, 0))


def row(
    name: str,
    item: dict[str, Any] | None,
    alerts: dict[str, float] | None,
    gpus: dict[str, float] | None,
    blind: bool = False,
) -> dict[str, Any]:
    """One cluster's row: the layer's item (None when only Thanos knows the cluster) and the figures
    (None where ``blind``: the layer says the global Query reads none of the cluster's live stores)."""
    found: dict[str, Any] = {
        "cluster": name,
        "firing": figure(alerts, name, blind),
        "gpus": figure(gpus, name, blind),
        "known_to_layer": item is not None,
    }
    if item is not None:
        found.update(
            answers=bool(item.get("answers")),
            answer_seconds=item.get("answer_seconds"),
            error=item.get("error") or "",
            states=item.get("states") or {},
            role=item.get("role"),
            updated=item.get("updated"),
            metrics=item.get("metrics"),  # absent without the layer's --thanos-url
        )
    return found


def fleet(
    prometheus: Prometheus,
    client: httpx.Client | None,
    fleet_url: str | None,
    clock: Callable[[], float] = time.time,
) -> dict[str, Any]:
    errors: list[str] = []
    layer, layer_error = global_layer(client, fleet_url)
    if layer_error:
        errors.append(layer_error)
    alerts = per_cluster(prometheus, FIRING_BY_CLUSTER, errors)
    gpus = per_cluster(prometheus, GPUS_BY_CLUSTER, errors)
    items = {str(i.get("cluster", "")): i for i in (layer or {}).get("clusters", []) if isinstance(i, dict)}
    seen = set(alerts or {}) | set(gpus or {})
    names = list(items) + sorted(seen - set(items))  # the layer's order first
    blind = {str(g.get("cluster", "")) for g in (layer or {}).get("metrics_missing") or []}
    return {
        "configured": bool(fleet_url),
        "fleet_url": fleet_url,
        "clusters": [row(name, items.get(name), alerts, gpus, name in blind) for name in names],
        "partial": partial(layer),
        "alerts": firing_alerts(prometheus, errors),
        "metrics_side": layer is not None and "metrics_missing" in layer,
        "errors": errors,
        "at": clock(),
    }
