"""Checks the dashboards without Grafana: every panel target of the committed JSON (what Grafana
provisions) run by the project's own runner against the real Prometheus and, for the logs panels, the real
OpenSearch/Elasticsearch, with Grafana's documented macro and variable semantics (dashboards/templating.py);
and the JSON against Grafana's own TypeScript types (`@grafana/schema`, compiled by `tsc --strict`)."""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from fleetsight.durations import seconds
from fleetsight.prometheus import Prometheus, PrometheusBadAnswer, PrometheusHTTPError, PrometheusQueryError
from fleetsight.settings import Settings

from . import build, catalog, model, templating
from .npm import npm_dir, tsc_path

PROVISIONING = Path(__file__).resolve().parent / "provisioning"
# Grafana's default max data points is the panel's width in pixels: about this for a full-width panel.
MAX_DATA_POINTS = 1000
Choice = str | list[str] | tuple[str, ...] | templating.Selected


@dataclass(frozen=True)
class QueryResult:
    dashboard: str
    panel: str
    expr: str
    series: int
    error: str = ""
    datasource: str = model.PROMETHEUS
    skipped: str = ""  # why the target was not run (a datasource not given)


@dataclass(frozen=True)
class Answer:
    """One target as sent and answered: its datasource type, the query text after interpolation, the
    server's result (PromQL's result or the logs search's response), an error, or why it was not run."""

    datasource: str
    query: str
    result: Any
    error: str = ""
    skipped: str = ""


@dataclass(frozen=True)
class Target:
    dashboard: str
    panel: str
    uid: str
    body: dict[str, Any]


def datasources(folder: Path = PROVISIONING / "datasources") -> dict[str, dict[str, Any]]:
    """Every provisioned datasource by uid (the files docker-compose.yml and any Grafana provision)."""
    found = {}
    for path in sorted(folder.glob("*.yml")):
        for source in yaml.safe_load(path.read_text()).get("datasources", []):
            found[source["uid"]] = source
    return found


def scrape_interval_s(source: Mapping[str, Any]) -> float:
    """The Prometheus datasource's scrape interval (`timeInterval`; Grafana's default is 15 s)."""
    return seconds(source.get("jsonData", {}).get("timeInterval", "15s"))


def dashboard_files(folder: Path = build.OUTPUT_DIR) -> list[Path]:
    return sorted(folder.glob("*.json"))


def targets(dashboard: dict[str, Any]) -> Iterator[Target]:
    """Each target of each panel, with the datasource uid Grafana would use (the target's, else the
    panel's)."""
    for panel in dashboard.get("panels", []):
        for body in panel.get("targets", []):
            source = body.get("datasource") or panel.get("datasource") or {}
            yield Target(dashboard.get("uid", "?"), panel.get("title", "?"), source.get("uid", ""), body)


def variable_values(
    dashboard: dict[str, Any], chosen: Mapping[str, Choice]
) -> dict[str, templating.Selected]:
    """The dashboard's variables: constants at their value, the others at the choice given (formatted by
    the variable's own `multi`, `includeAll` and `allValue`); one not chosen whose saved choice is All
    (the cluster variable) at All, as Grafana opens the dashboard."""
    values: dict[str, templating.Selected] = {}
    for variable in dashboard.get("templating", {}).get("list", []):
        name = variable["name"]
        if name in chosen:
            choice = chosen[name]
            values[name] = (
                choice if isinstance(choice, templating.Selected) else templating.selection(variable, choice)
            )
        elif variable.get("type") == "constant":
            values[name] = templating.Selected((str(variable.get("query", "")),))
        elif opens_at_all(variable):
            values[name] = templating.selection(variable, [templating.ALL])
    return values


def opens_at_all(variable: Mapping[str, Any]) -> bool:
    """Whether the dashboard opens with the variable at All and a custom all value (needs no options)."""
    current = variable.get("current") or {}
    value = current.get("value")
    saved = value[0] if isinstance(value, list) and value else value
    return bool(variable.get("includeAll")) and bool(variable.get("allValue")) and saved == templating.ALL


class Runner:
    """Runs targets over [start, end] as Grafana's datasources would send them."""

    def __init__(self, prometheus: Prometheus, logs: httpx.Client | None, start: float, end: float) -> None:
        self.prometheus, self.logs, self.start, self.end = prometheus, logs, start, end
        self.sources = datasources()

    def macros(self, source: Mapping[str, Any]) -> dict[str, str]:
        return templating.builtins(self.start, self.end, scrape_interval_s(source), MAX_DATA_POINTS)

    def run(self, target: Target, variables: Mapping[str, templating.Selected]) -> QueryResult:
        sent = self.answer(target, variables)
        if sent.datasource == "elasticsearch":
            series = metrics_with_values(sent.result) if sent.result else 0
        else:
            series = len(sent.result) if isinstance(sent.result, list) else 1
        return QueryResult(
            target.dashboard, target.panel, sent.query, series, sent.error, target.uid, sent.skipped
        )

    def answer(self, target: Target, variables: Mapping[str, templating.Selected]) -> Answer:
        """The target as its datasource would send it (Grafana's macros and variable formats) and the
        server's answer: a PromQL result, or the logs search's response. The one place both `verify` and
        the viewer (dashboards/viewer/data.py) run a target."""
        source = self.sources.get(target.uid)
        if source is None:
            known = ", ".join(sorted(self.sources))
            error = f"datasource uid {target.uid!r} is not provisioned (known: {known})"
            return Answer("", json.dumps(target.body), [], error)
        macros = self.macros(source)
        values = {**variables, **macros}
        if source["type"] == "elasticsearch":
            lucene = templating.interpolate(target.body.get("query", ""), values, "elasticsearch")
            if self.logs is None:
                return Answer("elasticsearch", lucene, {}, skipped="no logs URL given")
            found, error = self.logs_search(target, source, lucene, macros["__interval"])
            return Answer("elasticsearch", lucene, found, error)
        expr = templating.interpolate(target.body.get("expr", ""), values)
        instant = bool(target.body.get("instant", False))
        result, error = self.promql_result(expr, instant, int(macros["__interval_ms"]))
        return Answer("prometheus", expr, result, error)

    def promql_result(self, expr: str, instant: bool, step_ms: int) -> tuple[Any, str]:
        """(result, error): an instant query's result at the end (a vector's samples, or a scalar's
        [time, text]), or a range query's series stepped by $__interval; Prometheus's words on an error."""
        start, end, step = f"{self.start:.3f}", f"{self.end:.3f}", f"{step_ms / 1000:g}"
        try:
            if instant:
                return self.prometheus.query_data(expr, end)["result"], ""
            return self.prometheus.query_range(expr, start, end, step), ""
        except PrometheusQueryError as exc:  # the query's fault: Prometheus's own words
            return [], exc.error
        except (PrometheusHTTPError, PrometheusBadAnswer) as exc:  # no API answer (a proxy's, say)
            return [], str(exc)

    def logs_search(
        self, target: Target, source: Mapping[str, Any], lucene: str, interval: str
    ) -> tuple[dict[str, Any], str]:
        """(answer, error) of the search the Elasticsearch datasource sends for a metrics target."""
        assert self.logs is not None
        options = source.get("jsonData", {})
        body = search_body(
            target.body, lucene, self.start, self.end, interval, options.get("timeField", "@timestamp")
        )
        try:
            answer = self.logs.post(f"/{options['index']}/_search", json=body)
        except httpx.HTTPError as exc:
            return {}, f"logs search failed: {exc}"
        if not answer.is_success:
            return {}, f"HTTP {answer.status_code}: {answer.text[:300]}"
        return answer.json(), ""


def search_body(
    target: Mapping[str, Any], lucene: str, start: float, end: float, interval: str, time_field: str
) -> dict[str, Any]:
    """The search the Elasticsearch datasource sends for a metrics target: the Lucene query and the time
    range as filters, a date histogram by $__interval, each metric inside it."""
    histogram = next(a for a in target.get("bucketAggs", []) if a["type"] == "date_histogram")
    metrics = {
        m["id"]: {m["type"]: {"field": m["field"]}} for m in target.get("metrics", []) if m["type"] != "count"
    }
    bounds = {"min": round(start * 1000), "max": round(end * 1000)}
    time_range = {"gte": bounds["min"], "lte": bounds["max"], "format": "epoch_millis"}
    return {
        "size": 0,
        "query": {"bool": {"filter": [
            {"range": {time_field: time_range}},
            {"query_string": {"analyze_wildcard": True, "query": lucene}},
        ]}},
        "aggs": {histogram["id"]: {
            "date_histogram": {
                "field": histogram.get("field", time_field), "fixed_interval": interval,
                "min_doc_count": 0, "extended_bounds": bounds, "format": "epoch_millis",
            },
            "aggs": metrics,
        }},
    }  # fmt: skip


def metrics_with_values(answer: Mapping[str, Any]) -> int:
    """How many metrics of the histogram have a value in at least one bucket (a series each)."""
    with_values: set[str] = set()
    for aggregation in answer.get("aggregations", {}).values():
        for bucket in aggregation.get("buckets", []):
            with_values |= {
                k for k, v in bucket.items() if isinstance(v, dict) and v.get("value") is not None
            }
    return len(with_values)


def run_queries(
    prometheus_url: str,
    variables: Mapping[str, Choice],
    at: float,
    range_s: int = 3600,
    logs_url: str | None = None,
    folder: Path = build.OUTPUT_DIR,
) -> list[QueryResult]:
    """Every target of every dashboard JSON in `folder` over the `range_s` seconds ending `at`: PromQL as
    a range query (an instant query at `at` where the target is instant), logs targets against
    `logs_url` (skipped without one). A datasource uid that is not provisioned is an error."""
    results = []
    logs = httpx.Client(base_url=logs_url, timeout=30) if logs_url else None
    # Every query as a POST form, as Grafana's Prometheus datasource sends them (its default method).
    with Prometheus(prometheus_url, timeout=30, post_over=0) as prometheus:
        runner = Runner(prometheus, logs, at - range_s, at)
        for path in dashboard_files(folder):
            dashboard = json.loads(path.read_text())
            values = variable_values(dashboard, variables)
            results += [runner.run(target, values) for target in targets(dashboard)]
    if logs is not None:
        logs.close()
    return results


def typecheck(settings: Settings, out_dir: Path | None = None) -> tuple[bool, str]:
    """Compile every dashboard as a `Dashboard` of @grafana/schema with `tsc --noEmit --strict`."""
    tsc = tsc_path(settings)
    if not tsc.exists():
        raise FileNotFoundError(f"{tsc} is missing: run `fleetsight setup --only grafana-schema`")
    with tempfile.TemporaryDirectory(dir=npm_dir(settings)) as work:
        files = []
        for spec in catalog.DASHBOARDS:
            text = (out_dir / build.path_of(spec).name).read_text() if out_dir else build.render(spec)
            source = Path(work) / f"{spec.uid.replace('-', '_')}.ts"
            source.write_text(
                'import { Dashboard } from "@grafana/schema";\n'
                f"export const dashboard: Dashboard = {json.dumps(json.loads(text), indent=1)};\n"
            )
            files.append(str(source))
        result = subprocess.run(
            [str(tsc), "--noEmit", "--strict", "--skipLibCheck", "--moduleResolution", "node", *files],
            capture_output=True,
            text=True,
            cwd=npm_dir(settings),
        )
    return result.returncode == 0, (result.stdout + result.stderr).replace(work, "<dashboards>")
