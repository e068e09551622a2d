"""`fleetsight evaluate ...`: score the components against the digital twin's ground truth.

The evaluation layer sits above the components and imports them as any program would; no component
imports it, and it is not part of the installed package (it needs the twin and the repository's
scenarios). Every command takes scenarios by file or by name (twin/scenarios, evaluation/scenarios/*).

The alerts' and the anomaly detector's sub-commands, with their reports, live in cli_alerts.py and
cli_anomaly.py; the history's (backfill, dashboards) and the health service's, short, are here.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import click

from fleetsight.logs import setup_logging
from fleetsight.settings import Settings
from health.policy import DEFAULT_POLICY, PolicyError, parse_duration
from health.policy import load as load_policy
from twin.cli import truth_option
from twin.history import BackfillError
from twin.scenario import ScenarioError, parse_time
from twin.scenario import parse_duration as scenario_duration

from .backfill import CaptureOptions, backfill_blocks
from .cli_alerts import alerts_command
from .cli_anomaly import anomaly_command
from .cli_pace import pace_command
from .cli_sdc import sdc_command
from .dashboards import check_history
from .health import markdown, node_markdown, run_check
from .replay import work_folder
from .scenarios import (
    agent_step_option,
    duration_option,
    load_or_fail,
    resolve_or_fail,
    scenario_option,
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


cli.add_command(alerts_command)
cli.add_command(anomaly_command)
cli.add_command(sdc_command)
cli.add_command(pace_command)


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
    check = check_history(path, duration, agent_step, work_folder())
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
