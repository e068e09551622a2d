"""Detection quality of the alert rules on the digital twin, scored against its ground truth.

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

import datetime as dt
import math
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from fleetsight.procs import stop_process
from fleetsight.xid_catalog import lookup as xid_lookup
from rules.ruleset import CONTEXT_METRICS, Rule, load_rules, parse_duration, recording_levels, source_metrics
from twin.history import BackfillError
from twin.scenario import ScenarioError
from twin.scenario import load as load_scenario
from twin.scenario import parse_duration as scenario_duration
from twin.truth import Fault, TruthError, load_faults

from . import anomaly as anomaly_eval
from .backfill import CaptureOptions, backfill_blocks

EVAL_INTERVAL_S = 15.0  # the rule evaluation interval of metrics/prometheus.yml
MAX_POINTS = 10_000  # Prometheus refuses range queries of more than 11,000 points per series
# An alert that starts within this long after a fault ends still belongs to it (windows of 10 minutes
# in the rules, and `for:` durations, keep alerts firing a little after the fault).
AFTER_END_GRACE_S = 15 * 60
DEFAULT_START = "2026-01-05T00:00:00Z"
READY_TIMEOUT_S = 60.0

# Which alerts catch which fault kind (Xid faults depend on their code: see expected_alerts).
EXPECTED_BY_KIND: dict[str, tuple[str, ...]] = {
    "psu_failure": ("PSUFailed", "GPUPowerBrakeActive"),
    "thermal_throttle": ("GPUThermalThrottling",),
    "pcie_downgrade": ("PCIeLinkDowngraded", "PCIeBandwidthDegraded"),
    "ib_link_flap": ("InfiniBandLinkFlapping", "InfiniBandSymbolErrors"),
    "ib_port_down": ("InfiniBandPortDown",),
    "hbm_row_remap": ("GPURowRemapPending",),
    "host_crash": ("NodeDown",),
    "nvswitch_fatal": ("NVSwitchFatal",),
    "lustre_ost_slow": ("LustreOSTSlow", "LustreClientErrors"),
    "gray_slow_node": ("StragglerNode",),
    "loss_spike": (),  # application logs: the log pipeline's alerts, not Prometheus rules
}


class EvaluationError(RuntimeError):
    """A step of the evaluation failed; the message names it."""


def expected_alerts(fault: Fault) -> tuple[str, ...]:
    """The alerts that catch this fault (none for a benign disturbance)."""
    if fault.benign:
        return ()
    if fault.kind != "xid":
        return EXPECTED_BY_KIND.get(fault.kind, ())
    if fault.code == 79:
        return ("GPUFellOffBus",)
    if fault.code == 74:
        return ("GPUNVLinkErrors",)
    if fault.code is not None and xid_lookup(fault.code).action in (
        "reset_gpu",
        "check_hardware",
        "reboot_node",
    ):
        return ("GPUXidUncorrectable", "GPURowRemapPending", "GPURowRemapFailed")
    return ()  # application Xids (13, 31, 43, ...): the job's own error, no hardware alert


@dataclass
class Episode:
    """One alert instance (label set) firing from start to end (seconds)."""

    alertname: str
    labels: dict[str, str]
    start: float
    end: float
    fault: str | None = None


@dataclass
class AlertScore:
    alertname: str
    observable: bool
    episodes: int = 0
    true_episodes: int = 0
    false_episodes: int = 0
    faults_caught: int = 0
    delays_s: list[float] = field(default_factory=list)


@dataclass
class KindScore:
    kind: str
    faults: int = 0
    expected: tuple[str, ...] = ()
    caught: int = 0
    missed: int = 0
    not_observable: int = 0
    no_alert_expected: int = 0
    delays_s: list[float] = field(default_factory=list)


@dataclass
class ScenarioResult:
    scenario: str
    start: str
    end: str
    faults: int
    metrics_present: list[str]
    alerts: dict[str, AlertScore]
    kinds: dict[str, KindScore]
    false_alerts: list[dict[str, Any]]
    missed_faults: list[dict[str, Any]]
    wall_seconds: float


# ---------------------------------------------------------------------------------------- truth


def load_truth(path: Path) -> list[Fault]:
    """The twin's ground truth, typed by the twin's one reader (twin.truth.load_faults)."""
    try:
        return load_faults(path)
    except TruthError as exc:
        raise EvaluationError(f"not a truth file the scorer understands: {exc}") from exc


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
    import datetime as dt

    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def unix_to_iso(value: float) -> str:
    import datetime as dt

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
) -> Path:
    """The scenario's history as TSDB blocks in ``blocks``, ending at the span's end; returns the truth
    file the twin wrote beside them."""
    try:
        families = None
        if metrics_file is not None:
            families = frozenset(line for line in metrics_file.read_text().splitlines() if line.strip())
        capture = CaptureOptions(agent_step=scenario_duration(agent_step, "--agent-step"), families=families)
        end = dt.datetime.fromtimestamp(span.start + span.duration, dt.UTC)
        seconds = scenario_duration(duration, "--duration") if duration else None
        result = backfill_blocks(load_scenario(scenario), blocks, seconds, end, capture=capture)
    except (BackfillError, ScenarioError, ValueError) as exc:
        raise EvaluationError(f"backfill of {scenario}: {exc}") from exc
    return Path(result.truth)


# ----------------------------------------------------------------------------------- Prometheus


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    port = free_port()
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
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready(url):
            if process.poll() is not None:
                raise EvaluationError(f"prometheus exited with {process.returncode}; see {log}")
            if time.monotonic() > deadline:
                raise EvaluationError(f"prometheus was not ready after {READY_TIMEOUT_S:.0f} s; see {log}")
            time.sleep(0.2)
        yield url
    finally:
        stop_process(process, timeout_s=30)


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def query_range(url: str, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    response = httpx.post(
        f"{url}/api/v1/query_range",
        data={"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"},
        timeout=600,
    )
    body = response.json()
    if body.get("status") != "success":
        raise EvaluationError(f"query failed ({body.get('error', response.status_code)}): {expr[:200]}")
    return body["data"]["result"]


def metric_names(url: str, start: float, end: float) -> set[str]:
    response = httpx.get(
        f"{url}/api/v1/label/__name__/values",
        params={"start": f"{start:.0f}", "end": f"{end:.0f}"},
        timeout=60,
    )
    return set(response.json().get("data", []))


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


# ------------------------------------------------------------------------------------- alerting


def firing_episodes(rule: Rule, series: list[dict[str, Any]], step: float) -> list[Episode]:
    """Prometheus's alert state machine on a range-query result: pending at the first evaluation where
    the expression has the series, firing once it has held for `for:`, resolved at the first
    evaluation without it."""
    episodes = []
    for item in series:
        labels = {k: v for k, v in item["metric"].items() if k != "__name__"}
        labels.update(rule.labels)
        stamps = [float(t) for t, _ in item["values"]]
        run_start = previous = None
        for stamp in [*stamps, math.inf]:
            if previous is not None and stamp - previous > step * 1.5:
                if previous - run_start >= rule.for_seconds:
                    episodes.append(Episode(rule.name, labels, run_start + rule.for_seconds, previous + step))
                run_start = None
            if run_start is None:
                run_start = stamp
            previous = stamp
    return episodes


# -------------------------------------------------------------------------------------- scoring


def matches(episode: Episode, fault: Fault) -> bool:
    if fault.node is not None and episode.labels.get("node") not in (None, fault.node):
        return False
    if fault.node is not None and "node" not in episode.labels:
        return False
    return episode.start <= fault.end + AFTER_END_GRACE_S and episode.end >= fault.onset


def score(
    scenario: str,
    faults: list[Fault],
    episodes: list[Episode],
    observable: dict[str, bool],
) -> tuple[dict[str, AlertScore], dict[str, KindScore], list[dict[str, Any]], list[dict[str, Any]]]:
    alerts = {name: AlertScore(name, observable[name]) for name in observable}
    kinds: dict[str, KindScore] = {}
    false_alerts: list[dict[str, Any]] = []
    missed: list[dict[str, Any]] = []
    for episode in episodes:
        alerts[episode.alertname].episodes += 1
        fault = next((f for f in faults if not f.benign and matches(episode, f)), None)
        if fault is None:
            alerts[episode.alertname].false_episodes += 1
            false_alerts.append(
                {
                    "scenario": scenario,
                    "alertname": episode.alertname,
                    "labels": episode.labels,
                    "start": unix_to_iso(episode.start),
                    "end": unix_to_iso(episode.end),
                }
            )
        else:
            episode.fault = fault.id
            alerts[episode.alertname].true_episodes += 1
    for fault in faults:
        if fault.benign:
            continue
        kind = kinds.setdefault(fault.kind, KindScore(fault.kind))
        kind.faults += 1
        expected = expected_alerts(fault)
        kind.expected = tuple(dict.fromkeys((*kind.expected, *expected)))
        if not expected:
            kind.no_alert_expected += 1
            continue
        hits = [e for e in episodes if e.fault == fault.id and e.alertname in expected]
        if hits:
            kind.caught += 1
            delay = min(e.start for e in hits) - fault.onset
            kind.delays_s.append(max(0.0, delay))
            for name in {e.alertname for e in hits}:
                alerts[name].faults_caught += 1
                alerts[name].delays_s.append(
                    max(0.0, min(e.start for e in hits if e.alertname == name) - fault.onset)
                )
        elif not any(observable.get(name, False) for name in expected):
            kind.not_observable += 1
        else:
            kind.missed += 1
            missed.append(
                {
                    "scenario": scenario,
                    "fault": fault.id,
                    "kind": fault.kind,
                    "node": fault.node,
                    "onset": unix_to_iso(fault.onset),
                    "expected": list(expected),
                }
            )
    return alerts, kinds, false_alerts, missed


# ------------------------------------------------------------------------------ anomaly service

ANOMALY_CYCLE_S = 30.0  # the anomaly service's detection cycle, and how often Prometheus scrapes it


def straggler_flags(scenario: Path, duration_s: float) -> list[dict[str, Any]]:
    """The anomaly service's detector run offline over the same scenario's first duration_s (the twin
    in-process, windows reduced as the service's PromQL reduces them): its flag, cause and clear
    events, in the scenario's own time."""
    run = anomaly_eval.run_scenario(scenario, ANOMALY_CYCLE_S, duration=math.ceil(duration_s))
    return anomaly_eval.flag_log([run])


def straggler_samples(
    events: list[dict[str, Any]], begin: float, end: float, cluster: str
) -> list[tuple[str, float]]:
    """`fleetsight_straggler{hpc_job,node,cause} 1` as Prometheus would have scraped it from the
    service every cycle while a flag stood (its cause may change while it stands)."""
    standing: dict[tuple[str, str], tuple[str, float]] = {}
    spans: list[tuple[str, str, str, float, float]] = []
    for event in sorted(events, key=lambda e: float(e["time"])):
        key, at = (str(event["hpc_job"]), str(event["node"])), float(event["time"])
        if key in standing:
            cause, since = standing.pop(key)
            spans.append((*key, cause, since, at))
        if event["event"] in ("flag", "cause"):
            standing[key] = (str(event.get("cause") or "unknown"), at)
    spans += [(*key, cause, since, end) for key, (cause, since) in standing.items()]
    samples = []
    for job, node, cause, since, until in spans:
        labels = (
            f'fleetsight_straggler{{hpc_job="{job}",node="{node}",cause="{cause}",'
            f'cluster="{cluster}",instance="twin-backfill:anomaly",job="anomaly"}}'
        )
        stamp = math.ceil(max(since, begin) / ANOMALY_CYCLE_S) * ANOMALY_CYCLE_S
        while stamp < min(until, end):
            samples.append((labels, stamp))
            stamp += ANOMALY_CYCLE_S
    return samples


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
    for rule in alert_rules:
        episodes += firing_episodes(rule, query_range(url, rule.expr, begin, end, step), step)
    return episodes


def series_text(name: str, labels: dict[str, str]) -> str:
    """`name{a="1",b="2"}` with OpenMetrics escaping (a label value may hold a quote or backslash)."""

    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return name + "{" + ",".join(f'{k}="{escape(v)}"' for k, v in sorted(labels.items())) + "}"


def alerts_series(
    episodes: list[Episode], for_seconds: dict[str, float], end: float, step: float
) -> dict[str, list[float]]:
    """Prometheus's own `ALERTS` series for the episodes, as its rule evaluation writes them every
    `step`: `alertstate="pending"` during the `for:` wait, then `alertstate="firing"` until the
    first evaluation without the condition. The alert's labels are the expression's result labels
    and the rule's static labels (Episode.labels), plus alertname."""
    series: dict[str, list[float]] = {}
    for episode in episodes:
        labels = {**episode.labels, "alertname": episode.alertname}
        wait = for_seconds.get(episode.alertname, 0.0)
        pending = series_text("ALERTS", {**labels, "alertstate": "pending"})
        firing = series_text("ALERTS", {**labels, "alertstate": "firing"})
        stamp = episode.start - wait
        while stamp < min(episode.end, end + step / 2):
            series.setdefault(pending if stamp < episode.start else firing, []).append(stamp)
            stamp += step
    return series


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


# ------------------------------------------------------------------------------------ one scenario


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
    )


# ------------------------------------------------------------------------------------- summaries


def merge(results: list[ScenarioResult]) -> tuple[dict[str, AlertScore], dict[str, KindScore]]:
    alerts: dict[str, AlertScore] = {}
    kinds: dict[str, KindScore] = {}
    for result in results:
        for name, a in result.alerts.items():
            total = alerts.setdefault(name, AlertScore(name, False))
            total.observable = total.observable or a.observable
            total.episodes += a.episodes
            total.true_episodes += a.true_episodes
            total.false_episodes += a.false_episodes
            total.faults_caught += a.faults_caught
            total.delays_s += a.delays_s
        for name, k in result.kinds.items():
            total_k = kinds.setdefault(name, KindScore(name))
            total_k.faults += k.faults
            total_k.expected = tuple(dict.fromkeys((*total_k.expected, *k.expected)))
            total_k.caught += k.caught
            total_k.missed += k.missed
            total_k.not_observable += k.not_observable
            total_k.no_alert_expected += k.no_alert_expected
            total_k.delays_s += k.delays_s
    return alerts, kinds


def median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def as_json(results: list[ScenarioResult]) -> dict[str, Any]:
    alerts, kinds = merge(results)

    def alert_row(a: AlertScore) -> dict[str, Any]:
        return {
            **asdict(a),
            "median_delay_s": median(a.delays_s),
            "max_delay_s": max(a.delays_s, default=None),
        }

    def kind_row(k: KindScore) -> dict[str, Any]:
        return {
            **asdict(k),
            "median_delay_s": median(k.delays_s),
            "max_delay_s": max(k.delays_s, default=None),
        }

    return {
        "scenarios": [
            {
                "scenario": r.scenario,
                "start": r.start,
                "end": r.end,
                "faults": r.faults,
                "wall_seconds": r.wall_seconds,
                "metrics_present": r.metrics_present,
                "alerts": {n: alert_row(a) for n, a in r.alerts.items()},
                "kinds": {n: kind_row(k) for n, k in r.kinds.items()},
                "false_alerts": r.false_alerts,
                "missed_faults": r.missed_faults,
            }
            for r in results
        ],
        "total": {
            "alerts": {n: alert_row(a) for n, a in alerts.items()},
            "kinds": {n: kind_row(k) for n, k in kinds.items()},
            "false_alerts": sum(a.false_episodes for a in alerts.values()),
        },
    }


def work_folder() -> Path | None:
    """Scratch space: FLEETSIGHT_EVAL_TMP if set, else the system temp folder."""
    value = os.environ.get("FLEETSIGHT_EVAL_TMP")
    return Path(value) if value else None
