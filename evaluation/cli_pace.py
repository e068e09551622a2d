"""`fleetsight evaluate pace`: the pace check scored on the twin's training logs, offline (no server):
slow NICs and slow hosts found, their cause and node, how fast, and false flags per job-hour over runs
with checkpoints, evaluations and the twin's benign disturbances. Its own module: one sub-command of
`fleetsight evaluate` (evaluation/cli.py holds the group)."""

from __future__ import annotations

import json

import click

from . import pace as pace_eval

COLUMNS = (
    ("kind", "kind"),
    ("slowdown", "job slowdown"),
    ("runs", "runs"),
    ("found", "found"),
    ("recall", "recall"),
    ("cause_right", "cause right"),
    ("node_right", "node right"),
    ("node_logs", "node logs"),
    ("latency_steps_median", "latency steps (median)"),
    ("latency_steps_p95", "(p95)"),
    ("latency_s_median", "latency s (median)"),
    ("latency_s_p95", "(p95)"),
)


@click.command("pace", short_help="Score the pace check (slow NIC, slow host) on the twin's training logs.")
@click.option("--cases", type=click.IntRange(0, 5000), default=40, show_default=True, help="Drawn runs.")
@click.option(
    "--no-scenarios", is_flag=True, help="Skip the scenario files under evaluation/scenarios/pace/."
)
@click.option("--seed", type=int, default=1, show_default=True, help="Draws the runs (same seed, same runs).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON (with every case).")
def pace_command(cases: int, no_scenarios: bool, seed: int, as_json: bool) -> None:
    """Run the twin in-process and score anomaly/pace.py on what its jobs log.

    Drawn runs: a job (profile, nodes, pipeline stages, its own checkpoints every 10-20 min), one
    slow_nic or slow_host on a drawn node, sized so the job slows 3-40 %. Scenario files: the faults at
    three sizes beside healthy jobs, and a 4-hour run of every benign training kind. A fault is found
    when a straggler episode begins while it lasts; cause right: communication (slow_nic), host
    (slow_host); node right: the fault's node. Every episode on a job before its fault, or on a healthy
    job, is a false flag.

    \b
    Examples:
      fleetsight evaluate pace                      # 40 drawn runs and the scenario files
      fleetsight evaluate pace --cases 10 --no-scenarios --json
      fleetsight evaluate pace --cases 100 --seed 7
    """
    report = pace_eval.evaluate(cases, seed=seed, scenarios=not no_scenarios)
    figures = pace_eval.summary(report)
    if as_json:
        click.echo(json.dumps(figures, indent=1))
        return
    click.echo(f"Injected slow_nic / slow_host ({figures['runs']} runs): found while the fault lasts")
    click.echo("| " + " | ".join(title for _, title in COLUMNS) + " |")
    click.echo("|" + "---|" * len(COLUMNS))
    for row in figures["injected"]:
        click.echo("| " + " | ".join("-" if row[k] is None else str(row[k]) for k, _ in COLUMNS) + " |")
    quiet = figures["quiet"]
    click.echo("")
    click.echo("Quiet training (before onsets, healthy jobs): false flags")
    click.echo("| job-hours | false flags | per job-hour |")
    click.echo("|---|---|---|")
    click.echo(f"| {quiet['job_hours']} | {quiet['false_flags']} | {quiet['per_job_hour']} |")
    for flag in quiet["flags"]:
        click.echo(f"  false flag: {json.dumps(flag)}")
