"""`fleetsight evaluate alerts`: the alert rules scored on twin scenarios, and their tables (Rich for the
terminal, Markdown for docs/alerts.md). Its own module: one sub-command family of `fleetsight evaluate`
(evaluation/cli.py holds the group), changed with the alerts' evaluation and its report.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .alert_scoring import ScenarioResult, as_json, median, merge
from .alerts import evaluate_scenario
from .replay import EvaluationError, work_folder
from .scenarios import agent_step_option, duration_option, resolve_or_fail, scenarios_option


@click.command("alerts")
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
