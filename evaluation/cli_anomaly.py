"""`fleetsight evaluate anomaly`: the straggler detector and two baselines scored on twin scenarios, and
their report as tables. Its own module: one sub-command family of `fleetsight evaluate` (evaluation/cli.py
holds the group), changed with the anomaly evaluation and its figures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from fleetsight import durations

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
@click.option(
    "--sample-window",
    default=None,
    metavar="DURATION",
    help="What each DCGM sample averages (dcgm-exporter's collection interval: 5s as FleetSight ships "
    "it, 30s at dcgm-exporter's default), replacing the scenarios' realism.sample_window (1s: the twin's "
    "pessimistic default). The detector is told it, as the service is by --dcgm-interval.",
)
def anomaly_command(
    scenarios: tuple[str, ...],
    as_json: bool,
    cycle: float,
    duration: str | None,
    flags_out: Path | None,
    dcgm_labels: str | None,
    sample_window: str | None = None,
) -> None:
    """Run the detector and two baselines over the twin's simulated data (offline) and score them.

    Prints recall, recall within 15 minutes, precision and latency (median, p95) per slowdown band
    (5 %, 10 %, 20 %, 40 % of the job's step time) and per cause, and false flags per 1,000 node-hours
    on fault-free scenarios, for the detector and, beside it, the static power threshold and the plain
    per-job z-score. --json has them per fault kind too.

    \b
    Examples:
      fleetsight evaluate anomaly --scenario case_01
      fleetsight evaluate anomaly $(printf -- "--scenario %s " evaluation/scenarios/anomaly/*.yaml) --json
      fleetsight evaluate anomaly --scenario fault_free_day --flags-out /tmp/flags.jsonl
      fleetsight evaluate anomaly --scenario mixed_day --duration 8h
      fleetsight evaluate anomaly --scenario case_01 --dcgm-labels kubernetes   # Kubernetes-shaped
      fleetsight evaluate anomaly --scenario benign_training --sample-window 5s  # shipped cadence
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    try:
        paths = [resolve(s) for s in scenarios]
        seconds = anomaly_eval.parse_duration(duration) if duration else None
        averaged = sample_seconds(sample_window) if sample_window else None
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
            anomaly_eval.run_scenario(
                p, cycle, lambda n: progress.advance(task, n), seconds, dcgm_labels, averaged
            )
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


def sample_seconds(value: str) -> float:
    """--sample-window in seconds, within what the twin accepts (realism.sample_window)."""
    try:
        seconds = float(durations.seconds(value))
    except ValueError as exc:
        raise ValueError(f"--sample-window: {exc}") from None
    if not 0.05 <= seconds <= 60:
        raise ValueError(f"--sample-window: expected 0.05 s..60 s, got {value!r}")
    return seconds


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


BAND_COLUMNS = (
    ("episodes", "episodes", 0),
    ("recall", "recall", 3),
    ("recall_15min", "recall <= 15 min", 3),
    ("precision", "precision", 3),
    ("latency_median_s", "lat. median s", 0),
    ("latency_p95_s", "lat. p95 s", 0),
)
CAUSE_KINDS = (
    "power_brake: psu_failure; thermal: thermal_throttle; pcie: pcie_downgrade; network: ib_link_flap; "
    "unknown: gray_slow_node"
)


def _figure_table(
    title: str, heads: tuple[str, ...], rows: list[tuple[tuple[str, ...], dict[str, Any]]]
) -> Any:
    """One row per (labels, figures), with the band columns: recall, recall within 15 min, precision,
    latency median and p95; a section between methods (the first label)."""
    from rich.table import Table

    table = Table(title=title)
    for head in heads:
        table.add_column(head)
    for _, name, _ in BAND_COLUMNS:
        table.add_column(name, justify="right")
    last = None
    for labels, r in rows:
        if last is not None and labels[0] != last:
            table.add_section()
        last = labels[0]
        table.add_row(*labels, *(_fmt(r[key], digits) for key, _, digits in BAND_COLUMNS))
    return table


def print_report(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    methods = {"detector": report, **report["baselines"]}
    # Per band (issue 42: 5 %, 10 %, 20 %, 40 % of the job's step time): "<5%" has no episodes, only
    # the wrong flags raised while a neutral fault, a benign disturbance or nothing paced the job.
    rows = []
    for name, figures in methods.items():
        rows.append(((name, "all"), figures))
        rows += [((name, band), r) for band, r in figures["by_band"].items()]
    console.print(
        _figure_table(
            "Stragglers per slowdown band (episodes = faults that slow their job >= 5%; bands 5% [5, 7.5), "
            "10% [7.5, 15), 20% [15, 30), 40% >= 30 %)",
            ("method", "band"),
            rows,
        )
    )
    rows = [
        ((name, cause), r) for name, figures in methods.items() for cause, r in figures["by_cause"].items()
    ]
    console.print(_figure_table(f"Stragglers per cause ({CAUSE_KINDS})", ("method", "cause"), rows))
    rows = [((r["cause"], r["band"]), r) for r in report["by_cause_band"]]
    console.print(_figure_table("The detector per cause and band", ("cause", "band"), rows))
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
