"""`fleetsight evaluate ...`: score the components against the digital twin's ground truth.

The evaluation layer sits above the components and imports them as any program would; no component
imports it, and it is not part of the installed package (it needs the twin and the repository's
scenarios). Every command takes scenarios by file or by name (twin/scenarios, evaluation/scenarios/*).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fleetsight.logs import setup_logging
from fleetsight.settings import Settings
from health.policy import DEFAULT_POLICY, PolicyError, parse_duration
from health.policy import load as load_policy
from twin.cli import truth_option
from twin.history import BackfillError
from twin.scenario import ScenarioError, parse_time
from twin.scenario import parse_duration as scenario_duration

from . import anomaly as anomaly_eval
from .alerts import EvaluationError, ScenarioResult, as_json, evaluate_scenario, median, merge, work_folder
from .backfill import CaptureOptions, backfill_blocks
from .dashboards import check_history
from .health import markdown, node_markdown, run_check
from .scenarios import (
    agent_step_option,
    duration_option,
    load_or_fail,
    resolve,
    resolve_or_fail,
    scenario_option,
    scenarios_option,
)

CONTEXT = {"help_option_names": ["-h", "--help"]}


@click.group(name="evaluate", context_settings=CONTEXT)
def cli() -> None:
    """Score the stack on the digital twin: alerts, the straggler detector, the dashboards' panels and
    the health service, each against the twin's ground truth; and the twin's history as TSDB blocks.

    \b
    Examples:
      fleetsight evaluate alerts --scenario case_01 --scenario fault_free_day --duration 2h
      fleetsight evaluate anomaly --scenario case_01 --scenario fault_free_day
      fleetsight evaluate backfill --scenario fault_free_day --out /tmp/blocks --duration 12h
      fleetsight evaluate dashboards --scenario mixed_day --duration 2h
      fleetsight evaluate health --scenario tests/health/scenarios/health_faults.yaml --out /tmp/hc
    """


@cli.command("alerts")
@scenarios_option()
@click.option("--json", "as_json_output", is_flag=True, help="Print the results as JSON.")
@click.option("--markdown", is_flag=True, help="Print the tables as Markdown (for docs/alerts.md).")
@click.option(
    "--save", type=click.Path(dir_okay=False, path_type=Path), help="Also write the JSON results here."
)
@click.option(
    "--truth", type=click.Path(dir_okay=False, path_type=Path), help="Ground-truth file (one scenario only)."
)
@click.option("--start", default=None, help="Simulated start (ISO 8601; default: the scenario's).")
@duration_option()
@agent_step_option()
@click.option(
    "--anomaly/--no-anomaly",
    default=True,
    show_default=True,
    help="Also run the anomaly service's detector offline for StragglerNode's fleetsight_straggler.",
)
def alerts_command(
    scenarios: tuple[str, ...],
    as_json_output: bool,
    markdown: bool,
    save: Path | None,
    truth: Path | None,
    start: str | None,
    duration: str | None,
    agent_step: str,
    anomaly: bool,
) -> None:
    """Score the alerts on twin scenarios: faults caught, missed, false alerts, onset-to-firing delay.

    Each scenario is backfilled (`fleetsight evaluate backfill`) into a real Prometheus started here on a
    free loopback port; the recording rules are computed over the whole span with promtool, every
    alert is evaluated over it (with its `for:`), and the firings are matched to the ground truth.

    \b
    Examples:
      fleetsight evaluate alerts --scenario case_01
      fleetsight evaluate alerts --scenario case_06 --scenario case_02 --json
      fleetsight evaluate alerts --scenario /tmp/my_day.yaml --duration 6h
      fleetsight evaluate alerts --scenario mixed_day --agent-step 60s
    """
    if truth and len(scenarios) > 1:
        raise click.UsageError("--truth names the truth of one scenario: give one --scenario with it")
    paths = [resolve_or_fail(s) for s in scenarios]
    console = Console(stderr=True)
    results: list[ScenarioResult] = []
    failures: list[str] = []
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=as_json_output or markdown,
    ) as progress:
        stages = 7  # backfill, truth, anomaly, record levels (2), alerts, done
        task = progress.add_task("evaluating", total=len(paths) * stages)
        for index, path in enumerate(paths):
            base = index * stages
            counter = iter(range(1, stages))

            def stage(name: str, path: Path = path, base: int = base, counter=counter) -> None:
                progress.update(
                    task, description=f"{path.stem}: {name}", completed=base + next(counter, stages - 1)
                )

            try:
                results.append(
                    evaluate_scenario(path, work_folder(), truth, start, duration, stage, agent_step, anomaly)
                )
            except EvaluationError as exc:  # report it, go on with the other scenarios
                failures.append(f"{path.name}: {exc}")
                console.print(f"[red]{path.name}: evaluation failed[/red]: {exc}")
            progress.update(task, completed=base + stages, description=f"{path.stem}: done")
    if failures and not results:
        raise click.ClickException("no scenario could be evaluated:\n" + "\n".join(failures))
    if save:
        save.write_text(json.dumps(as_json(results), indent=2) + "\n")
    if as_json_output:
        click.echo(json.dumps(as_json(results), indent=2))
    elif markdown:
        click.echo(markdown_tables(results))
    else:
        print_tables(results, Console())
    if failures:
        click.echo(f"{len(failures)} scenario(s) could not be evaluated:\n" + "\n".join(failures), err=True)
        raise SystemExit(1)


def fmt_delay(values: list[float]) -> str:
    middle = median(values)
    return "-" if middle is None else f"{middle:.0f} s (max {max(values):.0f})"


def markdown_tables(results: list[ScenarioResult]) -> str:
    """Per fault kind and per alert, summed over the scenarios, as Markdown."""
    alerts, kinds = merge(results)
    header = ("fault kind", "faults", "caught", "missed", "not observable", "no alert expected",
              "delay onset->firing, median (max)", "alerts that catch it")  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for k in sorted(kinds.values(), key=lambda k: k.kind):
        lines.append(
            f"| {k.kind} | {k.faults} | {k.caught} | {k.missed} | {k.not_observable} | {k.no_alert_expected} "
            f"| {fmt_delay(k.delays_s)} | {', '.join(k.expected) or '-'} |"
        )
    lines += [
        "",
        "| alert | data present | firings | true | false | faults caught | delay, median (max) |",
        "|---|---|---|---|---|---|---|",
    ]
    for a in sorted(alerts.values(), key=lambda a: a.alertname):
        lines.append(
            f"| {a.alertname} | {'yes' if a.observable else 'no'} | {a.episodes} | {a.true_episodes} "
            f"| {a.false_episodes} | {a.faults_caught} | {fmt_delay(a.delays_s)} |"
        )
    lines.append("")
    lines.append(f"False alerts: {sum(a.false_episodes for a in alerts.values())}.")
    return "\n".join(lines)


def print_tables(results: list[ScenarioResult], console: Console) -> None:
    alerts, kinds = merge(results)
    scenario_names = ", ".join(r.scenario for r in results)
    by_kind = Table(title=f"Per fault kind ({scenario_names})")
    for column in (
        "fault kind",
        "faults",
        "caught",
        "missed",
        "not observable",
        "no alert expected",
        "delay onset->firing (median)",
        "alerts that catch it",
    ):
        by_kind.add_column(column)
    for k in sorted(kinds.values(), key=lambda k: k.kind):
        by_kind.add_row(
            k.kind,
            str(k.faults),
            str(k.caught),
            str(k.missed),
            str(k.not_observable),
            str(k.no_alert_expected),
            fmt_delay(k.delays_s),
            ", ".join(k.expected) or "-",
        )
    console.print(by_kind)
    by_alert = Table(title="Per alert")
    for column in ("alert", "data present", "firings", "true", "false", "faults caught", "delay (median)"):
        by_alert.add_column(column)
    for a in sorted(alerts.values(), key=lambda a: a.alertname):
        by_alert.add_row(
            a.alertname,
            "yes" if a.observable else "no",
            str(a.episodes),
            str(a.true_episodes),
            str(a.false_episodes),
            str(a.faults_caught),
            fmt_delay(a.delays_s),
        )
    console.print(by_alert)
    false_total = sum(a.false_episodes for a in alerts.values())
    console.print(f"false alerts: {false_total}")
    for result in results:
        for item in result.false_alerts[:20]:
            console.print(f"  false: {item['scenario']} {item['alertname']} {item['labels']} {item['start']}")
        for item in result.missed_faults[:20]:
            console.print(
                f"  missed: {item['scenario']} {item['fault']} {item['kind']} {item['node']} {item['onset']}"
            )


@cli.command("anomaly", short_help="Score the detector and two baselines on the twin.")
@scenarios_option()
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option("--cycle", type=float, default=30.0, show_default=True, help="Detection cycle (s).")
@duration_option()
@click.option(
    "--flags-out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write every flag/clear as JSON lines.",
)
@click.option(
    "--dcgm-labels",
    type=click.Choice(["slurm", "kubernetes"]),
    default=None,
    help="Run every job as this scheduler's: slurm (jobs from slurmrestd) or kubernetes (pods with "
    "JobSet/PyTorchJob labels, jobs from dcgm-exporter's pod labels only). Default: as the scenario says.",
)
def anomaly_command(
    scenarios: tuple[str, ...],
    as_json: bool,
    cycle: float,
    duration: str | None,
    flags_out: Path | None,
    dcgm_labels: str | None,
) -> None:
    """Run the detector and two baselines over the twin's simulated data (offline) and score them.

    Prints precision, recall, F1 and latency per fault kind and slowdown band, and false flags per
    1,000 node-hours on fault-free scenarios, for the detector and, beside it, the static power
    threshold and the plain per-job z-score.

    \b
    Examples:
      fleetsight evaluate anomaly --scenario case_01
      fleetsight evaluate anomaly $(printf -- "--scenario %s " evaluation/scenarios/anomaly/*.yaml) --json
      fleetsight evaluate anomaly --scenario fault_free_day --flags-out /tmp/flags.jsonl
      fleetsight evaluate anomaly --scenario mixed_day --duration 8h
      fleetsight evaluate anomaly --scenario case_01 --dcgm-labels kubernetes   # Kubernetes-shaped
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    try:
        paths = [resolve(s) for s in scenarios]
        seconds = anomaly_eval.parse_duration(duration) if duration else None
        ticks = anomaly_eval.total_ticks(paths, seconds)
    except (FileNotFoundError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    console = Console(stderr=True)
    with Progress(
        TextColumn("simulating"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("twin", total=ticks)
        runs = [
            anomaly_eval.run_scenario(p, cycle, lambda n: progress.advance(task, n), seconds, dcgm_labels)
            for p in paths
        ]
    report = anomaly_eval.report(runs, cycle)
    if flags_out is not None:
        with flags_out.open("w") as handle:
            for line in anomaly_eval.flag_log(runs):
                handle.write(json.dumps(line) + "\n")
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        print_report(report)


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def print_report(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    methods = {"detector": report, **report["baselines"]}
    table = Table(
        title="Stragglers per fault kind and slowdown band (episodes = faults that slow a job >= 5%)"
    )
    for column in (
        "method",
        "kind",
        "band",
        "episodes",
        "precision",
        "recall",
        "F1",
        "lat. median s",
        "lat. p95 s",
    ):
        table.add_column(column, justify="left" if column in ("method", "kind", "band") else "right")
    for name, figures in methods.items():
        rows = [("all", "all", figures)]
        rows += [(r["kind"], r["band"], r) for r in figures["by_kind_band"]]
        for kind, band, r in rows:
            table.add_row(
                name,
                kind,
                band,
                str(r["episodes"]),
                _fmt(r["precision"]),
                _fmt(r["recall"]),
                _fmt(r["f1"]),
                _fmt(r["latency_median_s"], 0),
                _fmt(r["latency_p95_s"], 0),
            )
        table.add_section()
    console.print(table)
    free = Table(title="Fault-free scenarios")
    for column in ("method", "false flags", "node-hours", "per 1,000 node-hours"):
        free.add_column(column)
    for name, figures in methods.items():
        free.add_row(
            name,
            str(figures["false_flag_count"]),
            _fmt(figures["fault_free_node_hours"], 1),
            _fmt(figures["false_flags"]),
        )
    console.print(free)
    target = report["at_target"]
    console.print(
        f"at the targets' set (power brake, thermal, PCIe, gray nodes slowing their job >= 10%): "
        f"{target['detected']} of {target['episodes']} episodes found, recall {_fmt(target['recall'])}, "
        f"latency median {_fmt(target['latency_median_s'], 0)} s"
    )
    if report["detected_by_held_flag"]:
        console.print(
            f"{report['detected_by_held_flag']} episode(s) found by a flag already held on the node "
            "(raised for an earlier fault of it): counted as found, no latency"
        )
    cpu = report["detector_cpu_per_cycle_s"]
    console.print(
        f"truth: {report['truth_source']}; detector CPU per cycle: median {_fmt(cpu['median'], 4)} s, "
        f"max {_fmt(cpu['max'], 4)} s; cause right on {_fmt(report['cause_accuracy'])} of true flags"
    )


@cli.command("backfill")
@scenario_option(dest="scenario_name")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Folder for the TSDB blocks.",
)
@duration_option()
@click.option(
    "--end", default=None, help="Time the history ends (ISO 8601; default: now, so the blocks are queryable)."
)
@click.option("--keep-openmetrics", is_flag=True, help="Keep the intermediate OpenMetrics file.")
@truth_option
@agent_step_option()
@click.option(
    "--no-agents",
    is_flag=True,
    help="dcgm-exporter's series only: do not run the node agents and the fabric exporter.",
)
@click.option(
    "--metrics-file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="Keep only the exporters' series named in this file (one name a line); `up` and dcgm's always.",
)
def backfill(
    scenario_name: str,
    out: Path,
    duration: str | None,
    end: str | None,
    keep_openmetrics: bool,
    truth: Path | None,
    agent_step: str,
    no_agents: bool,
    metrics_file: Path | None,
) -> None:
    """Simulate the scenario at max speed and write what a live stack would have scraped as Prometheus
    TSDB blocks: dcgm-exporter's series every tick, and every --agent-step the real node agent of each
    node (over the twin's files and BMCs) and the fabric exporter (over its UFM), with `up` per target
    (OpenMetrics in block-sized chunks, then `promtool tsdb create-blocks-from openmetrics`). Copy the
    blocks into a Prometheus data folder (or point Thanos at them) to query hours or days at once.

    \b
    The ground truth goes to --truth (default OUT.truth.jsonl beside OUT).

    \b
    Examples:
      fleetsight evaluate backfill --scenario fault_free_day --out /tmp/blocks --duration 12h
      fleetsight evaluate backfill --scenario eval_medium --out /tmp/b --truth /tmp/b-truth.jsonl
      fleetsight evaluate backfill --scenario mixed_day --out /tmp/day --agent-step 60s
    """
    setup_logging()
    scenario = load_or_fail(scenario_name)
    try:
        seconds = scenario_duration(duration, "--duration") if duration else None
        end_time = parse_time(end, "--end") if end else None
        step = scenario_duration(agent_step, "--agent-step")
        families = None
        if metrics_file is not None:
            families = frozenset(
                line.strip() for line in metrics_file.read_text().splitlines() if line.strip()
            )
        capture = CaptureOptions(agents=not no_agents, agent_step=step, families=families)
        result = backfill_blocks(scenario, out, seconds, end_time, keep_openmetrics, truth, capture)
    except (BackfillError, ScenarioError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(
        f"backfill: {result.samples} samples of {result.series} series, {result.blocks} block(s) in {out} "
        f"({result.start} .. {result.end}); {result.wall_seconds:.1f} s; truth in {result.truth}"
    )


@cli.command("dashboards")
@scenario_option("mixed_day")
@duration_option("15m")
@agent_step_option()
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def dashboards_command(scenario: str, duration: str, agent_step: str, as_json: bool) -> None:
    """Run every panel's PromQL over the twin's backfilled history (a real Prometheus on the blocks of
    `fleetsight evaluate backfill`, with the recording rules the panels read), each as a range query over
    the span. Lists the panels that return nothing and why; exits 1 when a query is refused or a panel
    is empty for no reason (not a live-only series, not a fault filter).

    \b
    Examples:
      fleetsight evaluate dashboards
      fleetsight evaluate dashboards --scenario mixed_day --duration 2h --agent-step 60s --json
    """
    path = resolve_or_fail(scenario)
    check = check_history(path, duration, agent_step, verify_work_root())
    refused = [r for r in check.results if r.error]
    if as_json:
        click.echo(json.dumps(asdict(check), indent=2))
    else:
        click.echo(f"{check.scenario} {check.start} .. {check.end}; variables {check.variables}")
        for r in refused:
            click.echo(f"REFUSED {r.dashboard} / {r.panel}: {r.error}\n    {r.expr}")
        for r in check.empty():
            click.echo(f"empty query  {r.dashboard} / {r.panel}: {r.why_empty or 'no reason'}")
        empty = check.empty_panels()
        for (dashboard, panel), reason in empty.items():
            click.echo(f"EMPTY PANEL  {dashboard} / {panel}: {reason or 'NO REASON'}")
        panels = len({(r.dashboard, r.panel) for r in check.results})
        click.echo(
            f"{len(check.results)} queries ({len(check.empty())} empty, {len(refused)} refused); "
            f"{panels} panels: {panels - len(empty)} with data, {len(empty)} empty "
            f"({len(check.unexplained())} without a reason)"
        )
    sys.exit(1 if refused or check.unexplained() else 0)


def verify_work_root() -> Path | None:
    value = os.environ.get("FLEETSIGHT_EVAL_TMP")
    return Path(value) if value else None


@cli.command("health")
@click.option(
    "--scenario",
    "scenario",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="Twin scenario YAML to play in real time.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Folder for the stack's run directory, logs and the report.",
)
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=DEFAULT_POLICY,
    show_default=True,
)
@click.option(
    "--port-base", type=int, default=None, help="Port base of this stack (default: the environment's)."
)
@click.option(
    "--settle", default="60s", show_default=True, help="Keep watching this long after the scenario ends."
)
def health_command(scenario: Path, out: Path, policy_path: Path, port_base: int | None, settle: str) -> None:
    """Play a twin scenario on a live stack (exporters, Prometheus + rules, Alertmanager, anomaly, health)
    and report, per fault, the state and reason its node reached and how long after onset.

    Writes OUT/report.json and OUT/report.md; prints the table.

    \b
    Examples:
      fleetsight evaluate health --scenario tests/health/scenarios/health_faults.yaml --out /tmp/hc
      fleetsight evaluate health --scenario mass.yaml --out /tmp/mf --port-base 36000
    """
    try:
        load_policy(policy_path)
        settle_s = parse_duration(settle, "--settle")
    except PolicyError as exc:
        raise click.ClickException(str(exc)) from exc
    out.mkdir(parents=True, exist_ok=True)
    try:
        report = run_check(scenario, out, port_base or Settings().port_base, policy_path, settle_s)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from exc
    (out / "report.json").write_text(json.dumps(report, indent=1))
    table = markdown(report["rows"]) + "\n\nEvery node:\n\n" + node_markdown(report["nodes"])
    wrong = report["nodes_out_of_service_without_a_hardware_fault"]
    table += f"\n\nNodes out of service without a hardware fault: {len(wrong)} {wrong or ''}"
    (out / "report.md").write_text(table + "\n")
    click.echo(table)
    for name, problem in report["problems"].items():
        click.echo(f"component {name}: {problem}", err=True)
