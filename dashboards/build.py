"""Turns the catalogue (dashboards/catalog.py) into Grafana dashboard JSON with grafana-foundation-sdk.

The JSON files sit next to this module, where docker-compose's Grafana provisions them from; a test
rebuilds them and fails when the committed files are stale.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import (
    bargauge,
    dashboard,
    elasticsearch,
    heatmap,
    prometheus,
    stat,
    statushistory,
    table,
    timeseries,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableOption, VariableRefresh

from . import catalog, model

OUTPUT_DIR = Path(__file__).resolve().parent
PANEL_BUILDERS = {
    "timeseries": timeseries.Panel,
    "stat": stat.Panel,
    "table": table.Panel,
    "heatmap": heatmap.Panel,
    "statushistory": statushistory.Panel,
    "bargauge": bargauge.Panel,
}
DATASOURCE_TYPES = {model.PROMETHEUS: "prometheus", model.LOGS: "elasticsearch"}


def datasource(uid: str) -> DataSourceRef:
    return DataSourceRef(type_val=DATASOURCE_TYPES[uid], uid=uid)


def target(query: model.Query, ref_id: str) -> Any:
    if query.datasource == model.LOGS:
        return (
            elasticsearch.Dataquery()
            .ref_id(ref_id)
            .datasource(datasource(model.LOGS))
            .query(query.expr)
            .alias(query.legend)
            .time_field("@timestamp")
            .metrics([elasticsearch.Average().id("1").field(query.metric)])
            .bucket_aggs([elasticsearch.DateHistogram().id("2").field("@timestamp")])
        )
    built = prometheus.Dataquery().ref_id(ref_id).expr(query.expr).datasource(datasource(model.PROMETHEUS))
    if query.legend:
        built = built.legend_format(query.legend)
    return built.instant() if query.instant else built.range()


def panel(spec: model.Panel) -> Any:
    if spec.kind not in PANEL_BUILDERS:
        raise ValueError(
            f"panel {spec.title!r}: unknown kind {spec.kind!r} (known: {', '.join(PANEL_BUILDERS)})"
        )
    uid = spec.queries[0].datasource
    built = (
        PANEL_BUILDERS[spec.kind]()
        .title(spec.title)
        .datasource(datasource(uid))
        .span(spec.width)
        .height(spec.height)
    )
    if spec.description or spec.needs:
        needs = f" Needs: {spec.needs}." if spec.needs else ""
        built = built.description(f"{spec.description}{needs}".strip())
    if spec.unit:
        built = built.unit(spec.unit)
    if spec.link:
        built = built.data_links([dashboard.DashboardLink("Open").url(spec.link).target_blank(True)])
    for index, query in enumerate(spec.queries):
        built = built.with_target(target(query, chr(ord("A") + index)))
    return built


def variable(spec: model.Variable) -> Any:
    if spec.constant:
        return dashboard.ConstantVariable(spec.name).label(spec.label).value(spec.query)
    built = (
        dashboard.QueryVariable(spec.name)
        .label(spec.label)
        .query(spec.query)
        .datasource(datasource(model.PROMETHEUS))
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
    )
    if spec.multi:
        built = built.multi(True)
    if spec.include_all:
        built = built.include_all(True)
    if spec.all_value:
        # "All" selected when the dashboard opens: every cluster, the same numbers as before there were many
        all_option = VariableOption(selected=True, text="All", value="$__all")
        built = built.all_value(spec.all_value).current(all_option)
    return built


def build(spec: model.Dashboard) -> dict[str, Any]:
    """One dashboard as the JSON object Grafana provisions."""
    built = (
        dashboard.Dashboard(spec.title)
        .uid(spec.uid)
        .description(f"For the {spec.persona}: {spec.question}")
        .tags(list(spec.tags))
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("utc")
        .readonly()
    )
    for var in spec.variables:
        built = built.with_variable(variable(var))
    for row in spec.rows:
        built = built.with_row(dashboard.Row(row.title))
        for item in row.panels:
            built = built.with_panel(panel(item))
    return normalize(json.loads(JSONEncoder(sort_keys=True, indent=2).encode(built.build())))


# Keys the SDK (10.x) sets that Grafana 12's schema does not have: the interval variables' `auto*` and
# an `id` on every variable, and the dashboard's long-gone `style`.
NOT_IN_SCHEMA_VARIABLE_KEYS = ("auto", "auto_count", "auto_min", "id")


def normalize(node: Any) -> Any:
    """Drops what the SDK emits that Grafana 12's schema does not take (unset fields as null, the keys
    above), so that the JSON type-checks as a `Dashboard` of @grafana/schema."""
    if isinstance(node, list):
        return [normalize(item) for item in node]
    if not isinstance(node, dict):
        return node
    cleaned = {key: normalize(value) for key, value in node.items() if value is not None}
    if "query" in cleaned and cleaned.get("type") in ("query", "constant"):
        for key in NOT_IN_SCHEMA_VARIABLE_KEYS:
            cleaned.pop(key, None)
    if "schemaVersion" in cleaned:
        cleaned.pop("style", None)
    return cleaned


def render(spec: model.Dashboard) -> str:
    return json.dumps(build(spec), indent=2, sort_keys=True) + "\n"


def path_of(spec: model.Dashboard, out_dir: Path = OUTPUT_DIR) -> Path:
    return out_dir / f"{spec.uid.removeprefix('fleetsight-')}.json"


def write_all(out_dir: Path = OUTPUT_DIR) -> list[Path]:
    written = []
    for spec in catalog.DASHBOARDS:
        path = path_of(spec, out_dir)
        path.write_text(render(spec))
        written.append(path)
    return written


def stale(out_dir: Path = OUTPUT_DIR) -> list[str]:
    """Why the committed JSON differs from what the catalogue builds (empty when up to date)."""
    problems = []
    expected = {path_of(spec, out_dir).name: render(spec) for spec in catalog.DASHBOARDS}
    for name, text in expected.items():
        path = out_dir / name
        if not path.exists():
            problems.append(f"{name}: missing")
        elif path.read_text() != text:
            problems.append(f"{name}: differs from the catalogue")
    for path in sorted(out_dir.glob("*.json")):
        if path.name not in expected:
            problems.append(
                f"{path.name}: not in the catalogue (remove it or add it to dashboards/catalog.py)"
            )
    return problems
