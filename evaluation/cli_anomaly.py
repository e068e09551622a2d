"""`fleetsight evaluate anomaly`: the straggler detector and two baselines scored on twin scenarios, and
their report as tables. Its own module: one sub-command family of `fleetsight evaluate` (evaluation/cli.py
holds the group), changed with the anomaly evaluation and its figures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from . import anomaly as anomaly_eval
from .anomaly_feed import total_ticks
from .scenarios import duration_option, resolve, scenarios_option


@click.command("anomaly", short_help="Score the detector and two baselines on the twin.")
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
        ticks = total_ticks(paths, seconds)
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
