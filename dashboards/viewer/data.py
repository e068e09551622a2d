"""What the dashboard viewer draws: each panel's targets run as Grafana's datasources send them (the
project's runner, dashboards/verify.py, with Grafana's macro and variable semantics), answered as frames
a browser can plot; the dashboards' variables with their options from the real Prometheus; Grafana's time
range words (``now-6h``) as seconds.

A frame is one series: ``{"refId", "name", "labels", "points": [[ms, value or null], ...]}``. An instant
query gives one point per series, at the range's end. A target that fails gives its error, never an empty
frame list that would read as "no data".
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleetsight.durations import seconds
from fleetsight.prometheus import PrometheusError, PrometheusQueryError

from .. import templating, verify

LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
NO_LOGS = "needs the logs datasource: this viewer was started without --logs"
LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(.+?)\s*,\s*)?(\w+)\s*\)\s*$")


class BadRange(ValueError):
    """A time range the viewer cannot read (its message says which part and why)."""


@dataclass(frozen=True)
class TimeRange:
    start: float
    end: float


def instant_of(word: str, now: float) -> float:
    """Grafana's time words: ``now``, ``now-6h``, or epoch milliseconds (what its URLs carry)."""
    text = word.strip()
    if text == "now":
        return now
    if text.startswith("now-"):
        try:
            return now - seconds(text[4:])
        except ValueError as exc:
            raise BadRange(f"{word!r}: {exc}") from None
    try:
        value = float(text)
    except ValueError:
        raise BadRange(f"{word!r} is neither now, now-<duration> (now-6h) nor epoch milliseconds") from None
    if not math.isfinite(value):
        raise BadRange(f"{word!r} is not a finite time")
    return value / 1000.0


def time_range(start: str, end: str, now: float | None = None) -> TimeRange:
    now = time.time() if now is None else now
    parsed = TimeRange(instant_of(start, now), instant_of(end, now))
    if parsed.end <= parsed.start:
        raise BadRange(f"the range ends ({end}) before it starts ({start})")
    return parsed


def legend(labels: Mapping[str, str], fmt: str) -> str:
    """Grafana's legend: ``{{label}}`` filled from the series' labels; without a format, the metric's
    name and its labels as Prometheus prints a series."""
    if fmt:
        return LEGEND_LABEL.sub(lambda m: labels.get(m.group(1), ""), fmt)
    name = labels.get("__name__", "")
    rest = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return f"{name}{{{rest}}}" if rest or not name else name


def number(text: Any) -> float | None:
    """A Prometheus sample's text as a number; NaN and the infinities as null (JSON has no word for them)."""
    value = float(text)
    return value if math.isfinite(value) else None


def promql_frames(result: Any, ref: str, fmt: str) -> list[dict[str, Any]]:
    if isinstance(result, list) and len(result) == 2 and not isinstance(result[0], dict):  # a scalar
        return [
            {
                "refId": ref,
                "name": fmt or "scalar",
                "labels": {},
                "points": [[result[0] * 1000, number(result[1])]],
            }
        ]
    frames = []
    for series in result:
        labels = series.get("metric", {})
        samples = series.get("values") or [series["value"]]
        points = [[round(float(t) * 1000), number(v)] for t, v in samples]
        frames.append({"refId": ref, "name": legend(labels, fmt), "labels": labels, "points": points})
    return frames


def logs_frames(answer: Mapping[str, Any], target: Mapping[str, Any], ref: str) -> list[dict[str, Any]]:
    """One frame per metric of the date histogram (the count as ``Count``)."""
    names = {m["id"]: f"{m['type']} {m.get('field', '')}".strip() for m in target.get("metrics", [])}
    frames: dict[str, dict[str, Any]] = {}
    for aggregation in answer.get("aggregations", {}).values():
        for bucket in aggregation.get("buckets", []):
            at = bucket["key"]
            for metric_id, name in names.items():
                value = (
                    bucket.get("doc_count") if name == "count" else (bucket.get(metric_id) or {}).get("value")
                )
                frame = frames.setdefault(metric_id, {"refId": ref, "name": name, "labels": {}, "points": []})
                frame["points"].append([at, value])
    return list(frames.values())


Chosen = Mapping[str, str | list[str]]


def variable_values(dashboard: Mapping[str, Any], chosen: Chosen) -> dict[str, templating.Selected]:
    """The choices the page sent (one value, several, or ``$__all``), each formatted by its variable's
    options (an unknown name is ignored; a variable not sent that opens at All, at All)."""
    names = {v["name"] for v in dashboard.get("templating", {}).get("list", [])}
    return verify.variable_values(dict(dashboard), {k: v for k, v in chosen.items() if k in names})


def panel_data(
    runner: verify.Runner, dashboard: Mapping[str, Any], panel: Mapping[str, Any], chosen: Chosen
) -> dict[str, Any]:
    """Every target of ``panel`` run over the runner's range: its frames, and each target's query as sent
    and its error, or why it was not run (``unavailable``: a logs target without a logs datasource)."""
    variables = variable_values(dashboard, chosen)
    frames: list[dict[str, Any]] = []
    queries = []
    for body in panel.get("targets", []):
        source_ref = body.get("datasource") or panel.get("datasource") or {}
        target = verify.Target(
            dashboard.get("uid", "?"), panel.get("title", "?"), source_ref.get("uid", ""), body
        )
        sent, found, error = run_target(runner, target, variables)
        frames += found
        query = {"refId": body.get("refId", ""), "query": sent, "error": error}
        if error == NO_LOGS:
            query.update(error="", unavailable=NO_LOGS)
        queries.append(query)
    return {"frames": frames, "queries": queries}


def run_target(
    runner: verify.Runner, target: verify.Target, variables: Mapping[str, templating.Selected]
) -> tuple[str, list[dict[str, Any]], str]:
    """(the query as sent, its frames, its error), from the runner `verify` uses."""
    ref = target.body.get("refId", "A")
    try:
        sent = runner.answer(target, variables)
    except PrometheusError as exc:  # unreachable: the panel says so
        return target.body.get("expr", ""), [], str(exc)
    if sent.skipped:
        return sent.query, [], NO_LOGS
    if sent.error:
        return sent.query, [], sent.error
    if sent.datasource == "elasticsearch":
        return sent.query, logs_frames(sent.result, target.body, ref), ""
    return sent.query, promql_frames(sent.result, ref, target.body.get("legendFormat", "")), ""


def variable_options(
    runner: verify.Runner,
    variable: Mapping[str, Any],
    values: Mapping[str, templating.Selected] | None = None,
) -> tuple[list[str], str]:
    """(options, error) of one dashboard variable: a constant's value, or a query variable's
    ``label_values([selector,] label)`` over the range, sorted; the selector's variables (``$cluster``)
    at ``values``, as Grafana sends a chained variable's query."""
    query = str(variable.get("query", ""))
    if variable.get("type") == "constant":
        return [query], ""
    if variable.get("type") == "custom":
        return [part.strip() for part in query.split(",") if part.strip()], ""
    match = LABEL_VALUES.match(query)
    if variable.get("type") != "query" or match is None:
        return [], f"variable {variable.get('name')!r}: only label_values(...) queries are drawn here"
    selector, label = match.group(1), match.group(2)
    matchers = [templating.interpolate(selector, values or {})] if selector else []
    try:
        found = runner.prometheus.label_values(label, *matchers, start=runner.start, end=runner.end)
    except PrometheusQueryError as exc:
        return [], exc.error
    except PrometheusError as exc:  # unreachable, or no API answer
        return [], str(exc)
    return sorted(found), ""


def variables_of(
    runner: verify.Runner, dashboard: Mapping[str, Any], chosen: Chosen | None = None
) -> list[dict[str, Any]]:
    """The dashboard's variables, in order, with their options (a hidden constant is listed, flagged),
    each variable's options read with the others at ``chosen`` (the cluster restricts the nodes); a
    variable with an All option says so (``includeAll``, ``multi``) and whether it opens at All
    (``default``: ``$__all``)."""
    values = variable_values(dashboard, chosen or {})
    listed = []
    for variable in dashboard.get("templating", {}).get("list", []):
        options, error = variable_options(runner, variable, values)
        listed.append({
            "name": variable["name"], "label": variable.get("label") or variable["name"],
            "type": variable.get("type", ""), "options": options, "error": error,
            "hidden": variable.get("type") == "constant" or bool(variable.get("hide")),
            "multi": bool(variable.get("multi")), "includeAll": bool(variable.get("includeAll")),
            "default": templating.ALL if verify.opens_at_all(variable) else None,
        })  # fmt: skip
    return listed
