"""`fleetsight evaluate sdc`: the silent-corruption check scored on the twin's training logs, offline (no
server): injected corruptions caught within N steps, false flags over long healthy runs. Its own module:
one sub-command of `fleetsight evaluate` (evaluation/cli.py holds the group)."""

from __future__ import annotations

import json

import click

from . import sdc as sdc_eval

COLUMNS = (
    ("records", "records"),
    ("magnitude", "magnitude"),
    ("runs", "runs"),
    ("flagged_in_time", "in time"),
    ("share", "share"),
    ("named_right", "named right"),
    ("flagged_before_onset", "before onset"),
    ("median_lag_steps", "median lag (steps)"),
)


@click.command("sdc", short_help="Score the silent-corruption check on the twin's training logs.")
@click.option("--cases", type=click.IntRange(1, 5000), default=200, show_default=True, help="Injected runs.")
@click.option(
    "--healthy-hours",
    type=click.FloatRange(0.5, 1000.0),
    default=10.0,
    show_default=True,
    help="Hours of healthy training (four replica-logging jobs, ~11,000 steps an hour).",
)
@click.option("--within", type=click.IntRange(1, 1000), default=10, show_default=True, help="Steps allowed.")
@click.option("--seed", type=int, default=1, show_default=True, help="Draws the runs (same seed, same runs).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def sdc_command(cases: int, healthy_hours: float, within: int, seed: int, as_json: bool) -> None:
    """Run the twin in-process and score anomaly/sdc.py on what its jobs log.

    Injected: each run draws a job (profile, 3-8 data-parallel replicas, pipeline stages), a corrupt node,
    an onset and a magnitude (log-uniform 0.05-1: the corrupt replica's relative gradient error); a run
    counts when the job is flagged at most --within steps after the first corrupt step, once with its
    per-replica lines and once with the job-wide Megatron lines only. Healthy: replica-logging jobs with
    ordinary loss spikes and the twin's benign disturbances; every flag is false. Prints a table per
    kind of records and the healthy runs' false flags.

    \b
    Examples:
      fleetsight evaluate sdc                       # 200 injected runs, 10 h of healthy training
      fleetsight evaluate sdc --cases 20 --healthy-hours 1 --json
      fleetsight evaluate sdc --within 5 --seed 7
    """
    report = sdc_eval.evaluate(cases, healthy_hours, seed=seed, within=within)
    figures = sdc_eval.summary(report)
    if as_json:
        click.echo(json.dumps(figures, indent=1))
        return
    click.echo(f"Injected sdc_training runs: flagged within {within} steps of the first corrupt step")
    click.echo("| " + " | ".join(title for _, title in COLUMNS) + " |")
    click.echo("|" + "---|" * len(COLUMNS))
    for row in figures["injected"]:
        click.echo("| " + " | ".join("-" if row[k] is None else str(row[k]) for k, _ in COLUMNS) + " |")
    healthy = figures["healthy"]
    click.echo("")
    click.echo("Healthy training: false flags")
    click.echo("| jobs | steps | ordinary spikes | false flags |")
    click.echo("|---|---|---|---|")
    cells = (healthy["jobs"], healthy["steps"], healthy["ordinary_spikes"], healthy["false_flags"])
    click.echo("| " + " | ".join(str(c) for c in cells) + " |")
    for flag in healthy["flags"]:
        click.echo(f"  false flag: {json.dumps(flag)}")
    targets = figures["targets"]
    share = targets["flagged_within_10_steps"]["measured"]
    false_rate = targets["false_flags_per_100k_healthy_steps"]["measured"]
    click.echo("")
    click.echo(f"target >= 90 % flagged in time (per-replica records): measured {share:.1%}")
    click.echo(f"target 0 false flags per 100,000 healthy steps: measured {false_rate}")
