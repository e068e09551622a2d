"""Every panel's PromQL over the twin's backfilled history: a real Prometheus serving the blocks that
`fleetsight evaluate backfill` cuts (dcgm-exporter, the node agents, the fabric exporter, `up`), with the
recording rules the panels and the alerts read computed over the span by promtool, as `fleetsight
evaluate alerts` does. Prometheus's own `ALERTS` series are written from the alerts' firing episodes
over the span (evaluation/firings.py applies `for:` as Prometheus does), and the anomaly service's
`fleetsight_straggler` flags from its detector run offline over the scenario (when the anomaly extra
is installed). Each query runs as a range query over the whole span, as a panel over that time range
would.

Some panels read series that only live services write (the health service's states, the anomaly
service's scores, the log pipeline in Elasticsearch): those cannot be in a backfill and are listed as
such, with the component they need; the live-stack test (tests/dashboards/test_dashboards.py) covers
them.
"""

from __future__ import annotations

import importlib.util
import math
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from dashboards import catalog, model, templating
from fleetsight.prometheus import Prometheus, PrometheusQueryError
from rules import ruleset

from . import replay as evaluate

# Series that only a live service writes. ALERTS and the straggler flags are backfilled (see
# check_history); the straggler score is not: the offline detector reports flags, not scores.
LIVE_ONLY = re.compile(r"\b(fleetsight_straggler_score|fleetsight_health\w*|fleetsight_anomaly\w*)\b")
# Series that the backfill writes only when their source ran: the offline anomaly detector.
ANOMALY_ONLY = re.compile(r"\bfleetsight_straggler\b")
# Counters the node agent creates with the first event they count (an Xid, an SXid, a kernel event).
EVENT_COUNTERS = re.compile(r"\b(fleetsight_gpu_xid_errors_total|fleetsight_nvswitch_sxid_errors_total)\b")
RANGE_STEP_S = 60
# Prometheus refuses a range query of more than 11,000 points a series: as a panel's max data points, it
# leaves $__interval at RANGE_STEP_S (the min interval) for spans up to a week.
MAX_DATA_POINTS = 11_000


@dataclass
class PanelResult:
    dashboard: str
    panel: str
    expr: str
    series: int
    error: str = ""
    why_empty: str = ""


@dataclass
class HistoryCheck:
    scenario: str
    start: str
    end: str
    variables: dict[str, str]
    results: list[PanelResult] = field(default_factory=list)
    alert_episodes: int = 0  # alert instances that fired over the span, written as ALERTS
    straggler_samples: int = 0  # fleetsight_straggler samples from the offline detector

    def empty(self) -> list[PanelResult]:
        """Queries that returned nothing."""
        return [r for r in self.results if not r.error and r.series == 0]

    def empty_panels(self) -> dict[tuple[str, str], str]:
        """Panels none of whose queries returned data, with the first reason given for one of them."""
        panels: dict[tuple[str, str], list[PanelResult]] = {}
        for result in self.results:
            panels.setdefault((result.dashboard, result.panel), []).append(result)
        return {
            key: next((r.why_empty for r in rows if r.why_empty), "")
            for key, rows in panels.items()
            if all(r.series == 0 for r in rows)
        }

    def unexplained(self) -> list[tuple[str, str]]:
        """Empty panels with no reason: a wrong metric, label or expression."""
        return [key for key, reason in self.empty_panels().items() if not reason]


def why_empty(panel: model.Panel, expr: str) -> str:
    """Why a panel may rightly show nothing over a history: it needs a live service, or it shows
    only what a fault makes (a filter such as `== 0` or `> 0`)."""
    if panel.needs:
        return f"needs {panel.needs}"
    found = LIVE_ONLY.search(expr)
    if found:
        return f"{found.group(1)} is written by a live service, not by a backfill"
    if ANOMALY_ONLY.search(expr) and not anomaly_installed():
        return "fleetsight_straggler needs the anomaly extra (numpy, scikit-learn) to be backfilled"
    if re.search(r"\bALERTS\b", expr):
        return "shows only while an alert fires"
    if re.search(r"==|>|<|\bunless\b", expr):
        return "shows only while a fault matches its filter"
    found = EVENT_COUNTERS.search(expr)
    if found:
        return f"{found.group(1)} appears with the first event it counts"
    return ""


def anomaly_installed() -> bool:
    """Whether the anomaly service's detector can run offline (its extra's libraries are installed)."""
    return all(importlib.util.find_spec(name) is not None for name in ("numpy", "sklearn"))


def panel_queries() -> list[tuple[model.Dashboard, model.Panel, model.Query]]:
    return [
        (spec, panel, query)
        for spec in catalog.DASHBOARDS
        for panel in spec.panels()
        for query in panel.queries
        if query.datasource == model.PROMETHEUS
    ]


def resolve_variables(prom: Prometheus, start: float, end: float) -> dict[str, str | templating.Selected]:
    """Each dashboard variable as Grafana would resolve it: its first value over the span; one with a
    custom all value (the cluster variable) at All, as the dashboards open; a variable's selector with
    the variables before it filled in (the nodes of the chosen clusters)."""
    values: dict[str, str | templating.Selected] = {}
    for spec in catalog.DASHBOARDS:
        for variable in spec.variables:
            if variable.constant:
                values[variable.name] = variable.query
                continue
            if variable.all_value:
                values[variable.name] = templating.Selected(
                    (), variable.multi, variable.include_all, all_selected=True, all_value=variable.all_value
                )
                continue
            label = re.fullmatch(r"label_values\((.+), *(\w+)\)", variable.query)
            if label is None:
                continue
            selector = templating.interpolate(label.group(1), values)
            found = prom.label_values(label.group(2), selector, start=f"{start:.0f}", end=f"{end:.0f}")
            if found:
                values[variable.name] = sorted(found)[0]
    return values


def run_range_queries(
    url: str, start: float, end: float, scrape_s: float = 5.0
) -> tuple[dict[str, str], list[PanelResult]]:
    results = []
    # Range queries as a POST form: a panel's PromQL with its variables filled in can be long.
    with Prometheus(url, timeout=120, post_over=0) as prom:
        variables = resolve_variables(prom, start, end)
        # Grafana's macros for the span, the min interval one step: $__rate_interval is then
        # max(step + scrape, 4 x scrape), the scrape being the sparsest source's (the node agents'
        # --agent-step in a backfill), so that a rate over it holds the samples it would live.
        macros = templating.builtins(start, end, scrape_s, MAX_DATA_POINTS, min_interval_s=RANGE_STEP_S)
        step = int(macros["__interval_ms"]) / 1000
        for spec, panel, query in panel_queries():
            expr = templating.interpolate(query.expr, {**variables, **macros})
            try:
                series = len(prom.query_range(expr, f"{start:.0f}", f"{end:.0f}", f"{step:g}"))
            except PrometheusQueryError as exc:
                results.append(PanelResult(spec.uid, panel.title, expr, 0, exc.error or "?"))
                continue
            reason = "" if series else why_empty(panel, expr)
            results.append(PanelResult(spec.uid, panel.title, expr, series, why_empty=reason))
    shown = {name: value if isinstance(value, str) else "All" for name, value in variables.items()}
    return shown, results


def check_history(
    scenario: Path,
    duration: str | None = None,
    agent_step: str = "30s",
    work_root: Path | None = None,
    progress: Callable[[str], None] = lambda _stage: None,
    stragglers: bool = True,
    also: Callable[[str, float, float, Path], None] | None = None,
) -> HistoryCheck:
    """Backfill the scenario (its first DURATION), serve it, record what the panels and the alerts
    read, write the alerts that fired (and, with `stragglers` and the anomaly extra, the detector's
    flags), query the panels. `also(prometheus_url, start, end, truth_file)` runs on the same
    Prometheus afterwards (the bench's report against the truth), before the blocks are deleted."""
    span = evaluate.scenario_span(scenario, None, duration)
    begin, end = span.start, span.start + span.duration
    if work_root is not None:
        work_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dashboards-history-", dir=work_root) as scratch:
        work = Path(scratch)
        blocks = work / "blocks"
        flagged = 0
        progress("backfill")
        evaluate.backfill(scenario, span, blocks, duration, None, agent_step)
        if stragglers and anomaly_installed():
            # Before the records: StragglerNode reads the flags.
            progress("straggler flags")
            cluster = evaluate.scenario_cluster(scenario)
            flagged = evaluate.add_straggler_blocks(scenario, span, blocks, work, cluster)
        rules = ruleset.load_rules()
        alert_rules = [rule for rule in rules if rule.is_alert]
        readers = [SimpleNamespace(expr=q.expr) for _, _, q in panel_queries()]
        log = work / "prometheus.log"
        # Prometheus's rule interval, coarser only where the span would exceed a range query's points.
        step = max(evaluate.EVAL_INTERVAL_S, math.ceil(span.duration / evaluate.MAX_POINTS))
        for number, level in enumerate(ruleset.recording_levels([*readers, *alert_rules], rules)):
            progress(f"record level {number}")
            with evaluate.prometheus(blocks, log) as url:
                evaluate.record_level(url, level, begin, end, step, work, blocks)
        progress("alerts")
        with evaluate.prometheus(blocks, log) as url:
            episodes = evaluate.alert_episodes(url, alert_rules, begin, end, step)
        evaluate.add_alert_blocks(episodes, alert_rules, span, step, blocks, work)
        progress("queries")
        with evaluate.prometheus(blocks, log) as url:
            variables, results = run_range_queries(url, begin, end, ruleset.parse_duration(agent_step))
            if also is not None:
                progress("also")
                also(url, begin, end, blocks.with_name(blocks.name + ".truth.jsonl"))
    return HistoryCheck(
        span.name,
        evaluate.unix_to_iso(begin),
        evaluate.unix_to_iso(end),
        variables,
        results,
        alert_episodes=len(episodes),
        straggler_samples=flagged,
    )
