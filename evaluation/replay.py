"""The twin's history replayed in a real Prometheus: the building blocks the alerts' and the dashboards'
evaluations share.

1. The backfill (evaluation/backfill.py, in this process) writes the scenario's history as TSDB
   blocks (promtool), at the scenario's own timestamps, and the twin's ground truth beside them.
2. The anomaly service's detector runs offline over the same scenario; its flags go beside them as
   ``fleetsight_straggler`` blocks.
3. A real Prometheus serves the blocks (started here, on a free loopback port, no scraping).
4. The recording rules are computed over the whole span with `promtool tsdb create-blocks-from rules`,
   level by level (a record that reads another record is computed after it), and loaded into it.
5. Each alert's expression is evaluated over the span with a range query at the rule evaluation
   interval, which gives each alert's firing episodes (firings.py); their ``ALERTS`` series can be
   written back as blocks.

Its own module: how a history is served and queried changes with Prometheus and promtool, not with how
the alerts are scored (alert_scoring.py) or which panels are checked (dashboards.py).
"""

from __future__ import annotations

import datetime as dt
import math
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fleetsight.procs import free_loopback_port, stop_process
from fleetsight.prometheus import Prometheus, PrometheusError, PrometheusQueryError
from rules.ruleset import Rule, parse_duration, source_metrics
from twin.history import BackfillError
from twin.scenario import ScenarioError
from twin.scenario import load as load_scenario
from twin.scenario import parse_duration as scenario_duration

from . import anomaly as anomaly_eval
from .backfill import CaptureOptions, backfill_blocks
from .firings import ANOMALY_CYCLE_S, Episode, alerts_series, firing_episodes, straggler_samples

EVAL_INTERVAL_S = 15.0  # the rule evaluation interval of metrics/prometheus.yml
MAX_POINTS = 10_000  # Prometheus refuses range queries of more than 11,000 points per series
DEFAULT_START = "2026-01-05T00:00:00Z"
READY_TIMEOUT_S = 60.0


class EvaluationError(RuntimeError):
    """A step of the evaluation failed; the message names it."""


# ------------------------------------------------------------------------------------ scenarios


@dataclass
class ScenarioSpan:
    name: str
    start: float
    duration: float


def scenario_span(
    path: Path, start_override: str | None = None, duration_override: str | None = None
) -> ScenarioSpan:
    document = yaml.safe_load(path.read_text()) or {}
    start_text = start_override or str(document.get("start") or DEFAULT_START)
    duration = parse_duration(duration_override or str(document.get("duration", "20m")))
    return ScenarioSpan(str(document.get("name", path.stem)), iso_to_unix(start_text), duration)


def iso_to_unix(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def unix_to_iso(value: float) -> str:
    return dt.datetime.fromtimestamp(value, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rule_metrics_file(work: Path, rules: list[Rule]) -> Path:
    """The names every rule reads, for the backfill to keep only those of the exporters' series (the
    node agent exports hundreds of families per node; the rules read a few dozen)."""
    names: set[str] = set()
    for rule in rules:
        names |= source_metrics(rule, rules)
    path = work / "rule-metrics.txt"
    path.write_text("".join(f"{name}\n" for name in sorted(names)))
    return path


def scenario_cluster(scenario: Path) -> str:
    """The cluster's name, which every scraped series carries in `cluster`."""
    document = yaml.safe_load(scenario.read_text()) or {}
    return str((document.get("cluster") or {}).get("name", "twin"))


def backfill(
    scenario: Path,
    span: ScenarioSpan,
    blocks: Path,
    duration: str | None,
    metrics_file: Path | None = None,
    agent_step: str = "30s",
    collectors: tuple[str, ...] | None = None,
) -> Path:
    """The scenario's history as TSDB blocks in ``blocks``, ending at the span's end; returns the truth
    file the twin wrote beside them."""
    try:
        families = None
        if metrics_file is not None:
            families = frozenset(line for line in metrics_file.read_text().splitlines() if line.strip())
        capture = CaptureOptions(
            agent_step=scenario_duration(agent_step, "--agent-step"), families=families, collectors=collectors
        )
        end = dt.datetime.fromtimestamp(span.start + span.duration, dt.UTC)
        seconds = scenario_duration(duration, "--duration") if duration else None
        result = backfill_blocks(load_scenario(scenario), blocks, seconds, end, capture=capture)
    except (BackfillError, ScenarioError, ValueError) as exc:
        raise EvaluationError(f"backfill of {scenario}: {exc}") from exc
    return Path(result.truth)


def work_folder() -> Path | None:
    """Scratch space: FLEETSIGHT_EVAL_TMP if set, else the system temp folder."""
    value = os.environ.get("FLEETSIGHT_EVAL_TMP")
    return Path(value) if value else None


# ----------------------------------------------------------------------------------- Prometheus


@contextmanager
def prometheus(data_dir: Path, log: Path) -> Iterator[str]:
    """A Prometheus on a free loopback port serving data_dir (no scraping, no rules); yields its URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise EvaluationError(
            "prometheus is not installed (apt-get install prometheus, or `fleetsight setup`)"
        )
    config = data_dir.parent / "prometheus-eval.yml"
    config.write_text("global:\n  evaluation_interval: 15s\n")
    port = free_loopback_port()
    url = f"http://127.0.0.1:{port}"
    with log.open("a") as out:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={data_dir}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=100y",  # scenarios may lie in the past
                "--query.max-samples=200000000",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_ready(url, process, log)
        yield url
    finally:
        stop_process(process, timeout_s=30)


def wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    """Until the Prometheus at ``url`` has loaded its TSDB; EvaluationError if it exits or takes too long."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    with Prometheus(url, timeout=2) as api:
        while not api.ready():
            if process.poll() is not None:
                raise EvaluationError(f"prometheus exited with {process.returncode}; see {log}")
            if time.monotonic() > deadline:
                raise EvaluationError(f"prometheus was not ready after {READY_TIMEOUT_S:.0f} s; see {log}")
            time.sleep(0.2)


def query_range(api: Prometheus, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    """A range query's series (times to the millisecond); EvaluationError when it fails."""
    try:
        return api.query_range(expr, f"{start:.3f}", f"{end:.3f}", f"{step:g}")
    except PrometheusQueryError as exc:
        raise EvaluationError(f"query failed ({exc.error}): {expr[:200]}") from exc
    except PrometheusError as exc:
        raise EvaluationError(f"query failed ({exc}): {expr[:200]}") from exc


def metric_names(url: str, start: float, end: float) -> set[str]:
    """The names of every series over [start, end]; EvaluationError when Prometheus cannot list them."""
    try:
        with Prometheus(url, timeout=60) as api:
            return set(api.label_values("__name__", start=f"{start:.0f}", end=f"{end:.0f}"))
    except PrometheusError as exc:
        raise EvaluationError(f"could not list the metric names: {exc}") from exc


def write_rule_file(path: Path, rules: list[Rule]) -> None:
    """One group per level: promtool evaluates a file's rules against the server as it is."""
    group = {"name": "evaluation", "rules": [{"record": r.name, "expr": r.expr} for r in rules]}
    path.write_text(yaml.safe_dump({"groups": [group]}, sort_keys=False))


def record_level(
    url: str, rules: list[Rule], start: float, end: float, step: float, work: Path, data_dir: Path
) -> None:
    """Compute one level of recording rules over [start, end] with promtool and add the blocks."""
    rule_file = work / f"level-{len(list(work.glob('level-*.yml')))}.yml"
    write_rule_file(rule_file, rules)
    output = work / f"{rule_file.stem}-blocks"
    command = [
        shutil.which("promtool") or "promtool",
        "tsdb",
        "create-blocks-from",
        "rules",
        f"--start={int(start)}",
        f"--end={math.ceil(end)}",
        f"--eval-interval={int(step)}s",
        f"--url={url}",
        f"--output-dir={output}",
        str(rule_file),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=3600)
    if result.returncode != 0:
        raise EvaluationError(
            f"promtool could not record the rules: {(result.stderr or result.stdout)[-1500:]}"
        )
    for block in output.iterdir() if output.exists() else []:
        if block.is_dir() and (block / "meta.json").exists():
            shutil.move(str(block), data_dir / block.name)


# ------------------------------------------------------------------------------ anomaly service


def straggler_flags(scenario: Path, duration_s: float) -> list[dict[str, Any]]:
    """The anomaly service's detector run offline over the same scenario's first duration_s (the twin
    in-process, windows reduced as the service's PromQL reduces them): its flag, cause and clear
    events, in the scenario's own time."""
    run = anomaly_eval.run_scenario(scenario, ANOMALY_CYCLE_S, duration=math.ceil(duration_s))
    return anomaly_eval.flag_log([run])


def add_straggler_blocks(scenario: Path, span: ScenarioSpan, data_dir: Path, work: Path, cluster: str) -> int:
    """The straggler flags as TSDB blocks beside the backfill's; returns the number of samples."""
    samples = straggler_samples(
        straggler_flags(scenario, span.duration), span.start, span.start + span.duration, cluster
    )
    by_series: dict[str, list[float]] = {}
    for labels, stamp in samples:
        by_series.setdefault(labels, []).append(stamp)
    write_openmetrics_blocks(by_series, work / "stragglers", data_dir, span.duration)
    return len(samples)


def write_openmetrics_blocks(
    by_series: dict[str, list[float]], stem: Path, data_dir: Path, span_s: float
) -> None:
    """Series (`name{labels}` -> timestamps of value 1) as TSDB blocks in data_dir, through promtool's
    OpenMetrics import (stem.om is the source, stem-blocks its output)."""
    if not by_series:
        return
    source = stem.with_suffix(".om")
    with source.open("w") as handle:
        for labels, stamps in by_series.items():
            handle.writelines(f"{labels} 1 {stamp:.3f}\n" for stamp in sorted(stamps))
        handle.write("# EOF\n")
    output = stem.with_name(stem.name + "-blocks")
    hours = max(2, math.ceil(span_s / 3600 / 2) * 2)
    result = subprocess.run(
        [shutil.which("promtool") or "promtool", "tsdb", "create-blocks-from", "openmetrics",
         f"--max-block-duration={hours}h", str(source), str(output)],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    if result.returncode != 0:
        raise EvaluationError(f"promtool refused {source.name}: {(result.stderr or result.stdout)[-1500:]}")
    for block in output.iterdir():
        if (block / "meta.json").exists():
            shutil.move(str(block), data_dir / block.name)


# ------------------------------------------------------------------------------- ALERTS series


def alert_episodes(url: str, alert_rules: list[Rule], begin: float, end: float, step: float) -> list[Episode]:
    """Every alert's firing episodes over [begin, end], its expression evaluated every `step`."""
    episodes: list[Episode] = []
    with Prometheus(url, timeout=600, post_over=0) as api:  # a form: some expressions are long
        for rule in alert_rules:
            episodes += firing_episodes(rule, query_range(api, rule.expr, begin, end, step), step)
    return episodes


def add_alert_blocks(
    episodes: list[Episode],
    alert_rules: list[Rule],
    span: ScenarioSpan,
    step: float,
    data_dir: Path,
    work: Path,
) -> int:
    """The episodes' ALERTS series as TSDB blocks beside the backfill's; returns the number of samples."""
    waits = {rule.name: rule.for_seconds for rule in alert_rules}
    series = alerts_series(episodes, waits, span.start + span.duration, step)
    write_openmetrics_blocks(series, work / "alerts", data_dir, span.duration)
    return sum(len(stamps) for stamps in series.values())
