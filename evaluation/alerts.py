"""Detection quality of the alert rules on the digital twin, scored against its ground truth: one
scenario's whole pipeline (:func:`evaluate_scenario`), from its steps in replay.py (backfill, Prometheus,
promtool, range queries), firings.py (episodes) and alert_scoring.py (the score).

For each scenario:
1. The backfill (evaluation/backfill.py, in this process) writes the scenario's history as TSDB
   blocks (promtool), at the scenario's own timestamps, and the twin's ground truth beside them
   (or `--truth`).
2. A real Prometheus serves the blocks (started here, on a free loopback port, no scraping).
3. The recording rules the alerts need are computed over the whole span with
   `promtool tsdb create-blocks-from rules`, level by level (a record that reads another record is
   computed after it), and loaded into that Prometheus.
4. Each alert's expression is evaluated over the span with a range query at the rule evaluation
   interval; `for:` is applied as Prometheus applies it (the condition must hold at every evaluation
   for that long), which gives each alert's firing episodes.
5. Episodes are matched to the truth's faults by node and time: caught, missed, false alerts, and the
   delay from fault onset to firing.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rules.ruleset import CONTEXT_METRICS, load_rules, recording_levels, source_metrics

from .alert_scoring import ScenarioResult, load_truth, score
from .replay import (
    EVAL_INTERVAL_S,
    MAX_POINTS,
    add_straggler_blocks,
    alert_episodes,
    backfill,
    metric_names,
    prometheus,
    record_level,
    rule_metrics_file,
    scenario_cluster,
    scenario_span,
    unix_to_iso,
)


def evaluate_scenario(
    scenario: Path,
    work_root: Path | None = None,
    truth: Path | None = None,
    start: str | None = None,
    duration: str | None = None,
    progress: Callable[[str], None] = lambda _stage: None,
    agent_step: str = "30s",
    stragglers: bool = True,
) -> ScenarioResult:
    started = time.monotonic()
    span = scenario_span(scenario, start, duration)
    rules = load_rules()
    alert_rules = [r for r in rules if r.is_alert]
    with tempfile.TemporaryDirectory(prefix="rules-eval-", dir=work_root) as scratch:
        work = Path(scratch)
        blocks = work / "blocks"
        progress("backfill")
        written = backfill(scenario, span, blocks, duration, rule_metrics_file(work, rules), agent_step)
        progress("truth")
        faults = load_truth(truth or written)
        if stragglers:
            progress("anomaly")
            add_straggler_blocks(scenario, span, blocks, work, scenario_cluster(scenario))
        data_dir = blocks  # promtool wrote the blocks straight into a folder Prometheus can open
        begin, end = span.start, span.start + span.duration
        step = max(EVAL_INTERVAL_S, math.ceil(span.duration / MAX_POINTS))
        log = work / "prometheus.log"
        for number, level in enumerate(recording_levels(alert_rules, rules)):
            progress(f"record level {number}")
            with prometheus(data_dir, log) as url:
                record_level(url, level, begin, end, step, work, data_dir)
        progress("alerts")
        with prometheus(data_dir, log) as url:
            present = metric_names(url, begin, end)
            episodes = alert_episodes(url, alert_rules, begin, end, step)
        observable: dict[str, bool] = {}
        for rule in alert_rules:
            sources = source_metrics(rule, rules) - CONTEXT_METRICS
            observable[rule.name] = observable.get(rule.name, False) or bool(sources & present)
        alerts, kinds, false_alerts, missed = score(span.name, faults, episodes, observable)
    return ScenarioResult(
        scenario=span.name,
        start=unix_to_iso(begin),
        end=unix_to_iso(end),
        faults=len([f for f in faults if not f.benign]),
        metrics_present=sorted(m for m in present if m.startswith(("DCGM_", "fleetsight_")) or m == "up"),
        alerts=alerts,
        kinds=kinds,
        false_alerts=false_alerts,
        missed_faults=missed,
        wall_seconds=round(time.monotonic() - started, 1),
        episodes=episodes,
    )
