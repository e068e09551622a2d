"""The early warning alone, scored on long twin scenarios: ComponentFailureForecast through the real rules
(rules/precursors.yml), its lead time before each degrading part fails, and its false warnings per
1,000 node-days of healthy running.

`fleetsight evaluate alerts` scores every alert, which costs about a minute of two cores per node-day
(each alert's recording rules over the whole span); the warning needs days of history, so this runs
the same steps (backfill, real Prometheus, promtool's recording rules, range queries, the scorer of
alert_scoring.py) for that one alert and the rules it reads.

Run: ``python -m evaluation.precursors --help``.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from itertools import repeat
from pathlib import Path
from typing import Any

import click
import yaml
from scipy import stats

from rules.ruleset import load_rules, recording_levels

from .alert_scoring import load_truth, median, score
from .lead_time import TARGET_LEAD_S, WARNING_ALERT, warned_in_time
from .replay import (
    EVAL_INTERVAL_S,
    MAX_POINTS,
    alert_episodes,
    backfill,
    prometheus,
    record_level,
    rule_metrics_file,
    scenario_span,
    work_folder,
)
from .scenarios import resolve_or_fail

RECORD_INTERVAL_S = 300.0  # rules/precursors.yml, group fleetsight-precursor-records: interval 5m
# The node agent's collectors whose series the warning reads (the InfiniBand port counters; the GPU
# counters are dcgm-exporter's). The backfill fails if a family the rules read was never written.
AGENT_COLLECTORS = ("infiniband",)
# A part can be warned about only once its counter has a sample 29 hours back (rules/precursors.yml:
# `max_over_time(precursor:errors:total[1h] offset 29h)`): before that no false warning is possible,
# so the false-warning rate is per node-day with the warning armed.
ARMED_AFTER_S = 29 * 3600.0
CONFIDENCE = 0.95


def evaluate(scenario: Path, agent_step: str = "5m", duration: str | None = None) -> dict[str, Any]:
    """One scenario: each degrading part's lead time, the false warnings, the node-days watched."""
    started = time.monotonic()
    span = scenario_span(scenario, None, duration)
    rules = load_rules()
    alert = [r for r in rules if r.is_alert and r.name == WARNING_ALERT]
    levels = recording_levels(alert, rules)
    needed = [r for level in levels for r in level] + alert
    with tempfile.TemporaryDirectory(prefix="precursors-eval-", dir=work_folder()) as scratch:
        work = Path(scratch)
        blocks = work / "blocks"
        metrics = rule_metrics_file(work, needed)
        truth = backfill(scenario, span, blocks, duration, metrics, agent_step, AGENT_COLLECTORS)
        faults = load_truth(truth)
        begin, end = span.start, span.start + span.duration
        # The precursor records' group runs every 5 minutes in production (rules/precursors.yml): the
        # same step here, not the 15 s of the other groups.
        step = max(RECORD_INTERVAL_S, EVAL_INTERVAL_S, math.ceil(span.duration / MAX_POINTS))
        log = work / "prometheus.log"
        for level in levels:
            with prometheus(blocks, log) as url:
                record_level(url, level, begin, end, step, work, blocks)
        with prometheus(blocks, log) as url:
            episodes = alert_episodes(url, alert, begin, end, step)
    _, kinds, false_alerts, _ = score(span.name, faults, episodes, {WARNING_ALERT: True})
    nodes = _node_count(scenario)
    node_days = nodes * span.duration / 86400.0
    armed = nodes * max(0.0, span.duration - ARMED_AFTER_S) / 86400.0
    leads = {name: k.leads_s for name, k in kinds.items() if k.leads_s}
    return {
        "scenario": span.name,
        "nodes": nodes,
        "node_days": round(node_days, 1),
        "armed_node_days": round(armed, 1),
        "step_s": step,
        "leads_h": {k: [None if x is None else round(x / 3600, 1) for x in v] for k, v in leads.items()},
        "warned_24h": {k: warned_in_time(v) for k, v in leads.items()},
        "median_lead_h": {
            k: round((median([x or 0.0 for x in v]) or 0.0) / 3600, 1) for k, v in leads.items()
        },
        "false_warnings": len(false_alerts),
        "false_per_1000_node_days": round(1000 * len(false_alerts) / node_days, 2) if node_days else None,
        "false_per_1000_armed_node_days": round(1000 * len(false_alerts) / armed, 2) if armed else None,
        "false_alerts": false_alerts,
        "wall_seconds": round(time.monotonic() - started, 1),
    }


def rate_bound(false_warnings: int, node_days: float, confidence: float = CONFIDENCE) -> float | None:
    """The largest rate of false warnings per 1,000 node-days that the count still allows at
    ``confidence`` (Poisson, one-sided: 0 in N gives about 3/N at 95 %)."""
    if node_days <= 0:
        return None
    return 1000 * float(stats.chi2.ppf(confidence, 2 * false_warnings + 2)) / 2 / node_days


def _node_count(scenario: Path) -> int:
    document = yaml.safe_load(scenario.read_text()) or {}
    return int((document.get("cluster") or {}).get("nodes", 0))


@click.command()
@click.option(
    "--scenario", "scenarios", multiple=True, required=True, help="Scenario file or name (repeatable)."
)
@click.option(
    "--agent-step", default="5m", show_default=True, help="Node agents' scrape step in the history."
)
@click.option("--duration", default=None, help="Only the scenario's first part (e.g. 36h).")
@click.option(
    "--processes",
    default=1,
    show_default=True,
    type=click.IntRange(1, None),
    help="Scenarios evaluated at once (each is one process and its Prometheus: one core apiece).",
)
def main(scenarios: tuple[str, ...], agent_step: str, duration: str | None, processes: int) -> None:
    """Score ComponentFailureForecast on twin scenarios: lead time before each degrading part fails
    (target: >= 24 h for half of them) and false warnings per 1,000 node-days (target: <= 1).

    \b
    Examples:
      python -m evaluation.precursors --scenario evaluation/scenarios/precursors/degrading.yaml
      python -m evaluation.precursors --scenario evaluation/scenarios/precursors/healthy.yaml --duration 3d
      python -m evaluation.precursors --agent-step 15m --processes 4 --scenario healthy \\
          --scenario healthy_b --scenario healthy_c --scenario healthy_d   # the false-warning rate
    """
    paths = [resolve_or_fail(name) for name in scenarios]
    with ProcessPoolExecutor(max_workers=min(processes, len(paths))) as pool:
        results = list(pool.map(evaluate, paths, repeat(agent_step), repeat(duration)))
    click.echo(json.dumps(results, indent=2))
    lead_target_h = TARGET_LEAD_S / 3600
    for result in results:
        click.echo(
            f"{result['scenario']}: {result['node_days']} node-days, warned >= {lead_target_h:g} h before "
            f"failure {result['warned_24h']}, false warnings {result['false_warnings']} "
            f"({result['false_per_1000_node_days']} per 1,000 node-days), {result['wall_seconds']} s",
            err=True,
        )
    false_warnings = sum(r["false_warnings"] for r in results)
    armed = sum(r["armed_node_days"] for r in results)
    bound = rate_bound(false_warnings, armed)
    click.echo(
        f"all: {false_warnings} false warnings in {armed:.1f} node-days with the warning armed "
        f"(after {ARMED_AFTER_S / 3600:g} h of history): at most "
        f"{'-' if bound is None else f'{bound:.1f}'} per 1,000 node-days ({CONFIDENCE:.0%} upper bound)",
        err=True,
    )


if __name__ == "__main__":
    main()
