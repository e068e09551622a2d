"""`fleetsight rules ...`: check and unit-test the rule files with both promtool generations, and score
the alerts on the digital twin."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fleetsight.settings import Settings

from .evaluate import (
    EvaluationError,
    ScenarioResult,
    as_json,
    evaluate_scenario,
    median,
    merge,
    work_folder,
)
from .install import PROMTOOL3_BUILD
from .ruleset import RULES_DIR, rule_files

SCENARIO_DIR = RULES_DIR.parent / "twin" / "scenarios"


def promtools() -> dict[str, str | None]:
    """promtool 2.x (Debian) and 3.x (built by `fleetsight setup`), None where missing."""
    built = PROMTOOL3_BUILD.binary(Settings())
    return {"promtool": shutil.which("promtool"), "promtool3": str(built) if built.exists() else None}


def run_promtool(binary: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary, *args], capture_output=True, text=True, check=False, cwd=RULES_DIR.parent)


def resolve_scenario(value: str) -> Path:
    path = Path(value)
    if path.exists():
        return path
    shipped = SCENARIO_DIR / f"{value}.yaml"
    if shipped.exists():
        return shipped
    raise click.BadParameter(f"no scenario file {value!r} (and no shipped scenario of that name)")


@click.group(name="rules", context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Prometheus recording and alerting rules (rules/*.yml): check, unit-test, score on the twin.

    \b
    Examples:
      fleetsight rules check
      fleetsight rules test
      fleetsight rules evaluate --scenario case_01 --scenario fault_free_day --duration 2h
    """


def promtool_all(args: list[str], files: list[str]) -> None:
    failed = False
    for name, binary in promtools().items():
        if binary is None:
            how = "apt-get install prometheus" if name == "promtool" else "run `fleetsight setup`"
            click.echo(f"{name}: not installed ({how})", err=True)
            failed = True
            continue
        result = run_promtool(binary, [*args, *files])
        status = "ok" if result.returncode == 0 else "FAILED"
        click.echo(f"{name}: {status}")
        if result.returncode != 0:
            click.echo((result.stdout + result.stderr).strip(), err=True)
            failed = True
    if failed:
        raise SystemExit(1)


@cli.command()
def check() -> None:
    """`promtool check rules` on every rule file, with promtool 2.x and 3.x.

    \b
    Examples:
      fleetsight rules check
    """
    promtool_all(["check", "rules"], [str(p) for p in rule_files()])


@cli.command()
def test() -> None:
    """`promtool test rules` on the unit tests in rules/tests/, with promtool 2.x and 3.x.

    \b
    Examples:
      fleetsight rules test
    """
    promtool_all(["test", "rules"], [str(p) for p in sorted((RULES_DIR / "tests").glob("*.yml"))])


@cli.command()
@click.option(
    "--scenario",
    "scenarios",
    multiple=True,
    required=True,
    help="Twin scenario file or shipped name (repeatable).",
)
@click.option("--json", "as_json_output", is_flag=True, help="Print the results as JSON.")
@click.option("--markdown", is_flag=True, help="Print the tables as Markdown (for docs/alerts.md).")
@click.option(
    "--save", type=click.Path(dir_okay=False, path_type=Path), help="Also write the JSON results here."
)
@click.option(
    "--truth", type=click.Path(dir_okay=False, path_type=Path), help="Ground-truth file (one scenario only)."
)
@click.option("--start", default=None, help="Simulated start (ISO 8601; default: the scenario's).")
@click.option("--duration", default=None, help="Override the scenarios' duration (e.g. 2h).")
@click.option(
    "--agent-step",
    default="30s",
    show_default=True,
    help="Scrape interval of the node agents and fabric exporter in the backfill (coarser: faster).",
)
@click.option(
    "--anomaly/--no-anomaly",
    default=True,
    show_default=True,
    help="Also run the anomaly service's detector offline for StragglerNode's fleetsight_straggler.",
)
def evaluate(
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

    Each scenario is backfilled (`fleetsight twin backfill`) into a real Prometheus started here on a
    free loopback port; the recording rules are computed over the whole span with promtool, every
    alert is evaluated over it (with its `for:`), and the firings are matched to the ground truth.

    \b
    Examples:
      fleetsight rules evaluate --scenario case_01
      fleetsight rules evaluate --scenario case_06 --scenario case_02 --json
      fleetsight rules evaluate --scenario /tmp/my_day.yaml --duration 6h
      fleetsight rules evaluate --scenario mixed_day --agent-step 60s
    """
    if truth and len(scenarios) > 1:
        raise click.UsageError("--truth names the truth of one scenario: give one --scenario with it")
    paths = [resolve_scenario(s) for s in scenarios]
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


if __name__ == "__main__":
    sys.exit(cli())
