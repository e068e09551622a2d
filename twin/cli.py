"""`fleetsight twin` sub-commands: run a scenario (files, and HTTP endpoints with --serve), list and check
scenario files. Its history as Prometheus blocks is the evaluation layer's `fleetsight evaluate backfill`."""

from __future__ import annotations

import datetime as dt
import sys
from dataclasses import replace
from pathlib import Path

import click

from fleetsight.logs import setup_logging
from fleetsight.settings import CLUSTER_NAME

from .scenario import SHIPPED_DIR, dcgm_settings, load, resolve
from .scenario_fields import ScenarioError, parse_duration, parse_time
from .scenario_model import DCGM_LABEL_MODES, DCGM_XID_FORMS

# The truth file's option, for every command that writes a run's folder (the evaluation layer's too).
truth_option = click.option(
    "--truth",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Ground-truth file (JSON lines), outside OUT; default: OUT.truth.jsonl beside OUT.",
)


def resolve_scenario(value: str) -> Path:
    """A path, or the name of a shipped scenario (`demo` -> twin/scenarios/demo.yaml)."""
    try:
        return resolve(value)
    except ScenarioError as exc:
        raise click.BadParameter(str(exc), param_hint="--scenario") from None


def load_or_fail(value: str):
    """The scenario, or one line naming the file, key and reason (as `validate` prints it)."""
    try:
        return load(resolve_scenario(value))
    except ScenarioError as exc:
        raise click.ClickException(f"{value}: {exc}") from exc


@click.group(name="twin", context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """The digital twin: a GPU training cluster in software, in real formats, with faults and truth.

    \b
    Examples:
      fleetsight twin run --scenario demo --out run/data/twin --serve --speed realtime
      fleetsight twin run --scenario eval_medium --out /tmp/eval/twin --truth /tmp/eval/truth.jsonl
      fleetsight twin calibrate
      fleetsight twin validate twin/scenarios/*.yaml
      fleetsight twin scenarios
    """


@cli.command()
@click.option(
    "--scenario", "scenario_name", required=True, help="Scenario YAML file, or a shipped scenario's name."
)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True, help="Output folder.")
@click.option(
    "--speed", default="max", show_default=True, help="realtime, max, or a factor (10 = ten times real time)."
)
@click.option(
    "--serve", is_flag=True, help="Serve dcgm-exporter, Redfish, UFM, slurmrestd and targets over HTTP."
)
@click.option(
    "--listen",
    default="127.0.0.1:0",
    show_default=True,
    help="HOST:PORT for --serve (port 0: any free port).",
)
@click.option("--duration", default=None, help="Override the scenario's duration (e.g. 10m, 2h).")
@click.option(
    "--start",
    default=None,
    help="Simulated start time (ISO 8601 or 'now'); default: now when paced, else the scenario's.",
)
@click.option(
    "--write-every",
    default=None,
    help="Simulated time between rewrites of the sysfs/procfs trees "
    "(default: every tick when paced, at the end at max speed).",
)
@truth_option
@click.option(
    "--history",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also cut the run's dcgm-exporter history (with hpc_job) into Prometheus TSDB blocks here.",
)
@click.option(
    "--dcgm-counters",
    default=None,
    help="dcgm-exporter counters file the twin publishes: shipped (exporters/dcgm/counters.csv), stock "
    "(the pinned image's default-counters.csv) or a path; default: the scenario's, else shipped.",
)
@click.option(
    "--dcgm-xid",
    type=click.Choice(DCGM_XID_FORMS),
    default=None,
    help="Xid series: 4x (err_code/err_msg labels, the pinned dcgm-exporter) or 3x (value = last Xid).",
)
@click.option(
    "--dcgm-labels",
    type=click.Choice(DCGM_LABEL_MODES),
    default=None,
    help="dcgm-exporter's workload labels: bare, slurm (hpc_job) or kubernetes (pod, namespace, container).",
)
@click.option(
    "--dcgm-pod-labels/--no-dcgm-pod-labels",
    default=None,
    help="With --dcgm-labels kubernetes: also the pods' labels, sanitised (--kubernetes-enable-pod-labels).",
)
@click.option(
    "--cluster-name",
    default=None,
    help="Name the cluster this instead of the scenario's name: every target's `cluster` label, meta.json "
    "and the records follow (the local stack passes FLEETSIGHT_CLUSTER).",
)
@click.option(
    "--exit-at-end",
    is_flag=True,
    help="With --serve: stop when the scenario ends instead of serving its last state.",
)
def run(
    scenario_name: str,
    out: Path,
    speed: str,
    serve: bool,
    listen: str,
    duration: str | None,
    start: str | None,
    write_every: str | None,
    truth: Path | None,
    history: Path | None,
    dcgm_counters: str | None,
    dcgm_xid: str | None,
    dcgm_labels: str | None,
    dcgm_pod_labels: bool | None,
    cluster_name: str | None,
    exit_at_end: bool,
) -> None:
    """Run a scenario, writing each node's sysfs/procfs trees, kernel log and job logs under OUT/nodes/
    and OUT/meta.json; the ground truth (one line per fault or benign disturbance) goes to --truth,
    outside OUT, where no component under evaluation reads it.

    \b
    Examples:
      fleetsight twin run --scenario demo --out run/data/twin --serve --speed realtime \\
        --listen 127.0.0.1:19100
      fleetsight twin run --scenario case_05 --out /tmp/c5/twin --duration 20m
      fleetsight twin run --scenario eval_small --out /tmp/e/twin --truth /tmp/e/truth.jsonl
      fleetsight twin run --scenario eval_small --out /tmp/e/twin --history /tmp/e/tsdb
      fleetsight twin run --scenario mixed_day --out /tmp/day --speed 60 --serve
      fleetsight twin run --scenario demo --out /tmp/k8s --serve --dcgm-labels kubernetes --dcgm-pod-labels
    """
    from .runner import Runner, RunOptions, install_signal_handlers, parse_speed

    setup_logging()
    scenario = load_or_fail(scenario_name)
    overrides = {
        "counters": dcgm_counters,
        "xid": dcgm_xid,
        "labels": dcgm_labels,
        "pod_labels": dcgm_pod_labels,
    }
    try:
        dcgm = dcgm_settings({k: v for k, v in overrides.items() if v is not None}, scenario.dcgm)
    except ScenarioError as exc:
        raise click.BadParameter(str(exc), param_hint="--dcgm-*") from None
    scenario = replace(scenario, dcgm=dcgm)
    if cluster_name is not None:
        if not CLUSTER_NAME.match(cluster_name):
            raise click.BadParameter(
                f"{cluster_name!r}: 1-63 letters, digits, '.', '_' or '-'", param_hint="--cluster-name"
            )
        scenario = replace(scenario, cluster=replace(scenario.cluster, name=cluster_name))
    try:
        factor = parse_speed(speed)
        host, _, port_text = listen.rpartition(":")
        port = int(port_text)
        options = RunOptions(
            out=out,
            speed=factor,
            serve=serve,
            host=host or "127.0.0.1",
            port=port,
            duration=parse_duration(duration, "--duration") if duration else None,
            start=(
                dt.datetime.now(dt.UTC).replace(microsecond=0)
                if start == "now"
                else parse_time(start, "--start")
            )
            if start
            else None,
            write_every=parse_duration(write_every, "--write-every") if write_every else None,
            linger=not exit_at_end,
            truth=truth,
            history=history,
        )
    except (ValueError, ScenarioError) as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        runner = Runner(scenario, options)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    install_signal_handlers(runner)
    try:
        summary = runner.run()
    except OSError as exc:
        raise click.ClickException(f"cannot serve or write: {exc}") from exc
    except RuntimeError as exc:  # promtool refused the history
        raise click.ClickException(str(exc)) from exc
    click.echo(
        f"twin: {summary.nodes} nodes, {summary.ticks} ticks ({summary.sim_seconds:.0f} s simulated) in "
        f"{summary.wall_seconds:.1f} s; {summary.faults} faults; outputs in {out}"
    )


@cli.command()
def scenarios() -> None:
    """List the shipped scenarios with their size and faults.

    \b
    Example:
      fleetsight twin scenarios
    """
    for path in sorted(SHIPPED_DIR.glob("*.yaml")):
        try:
            scenario = load(path)
        except ScenarioError as exc:
            click.echo(f"{path.stem:<22} INVALID: {exc}")
            continue
        click.echo(
            f"{path.stem:<22} {scenario.cluster.nodes:>5} nodes  {scenario.duration / 3600:6.2f} h  "
            f"{len(scenario.jobs)} jobs  {len(scenario.faults):>4} faults  {scenario.description}"
        )


@cli.command()
@click.argument("files", nargs=-1, required=True)
def validate(files: tuple[str, ...]) -> None:
    """Check scenario files for what `run` would trip on: unknown keys, jobs that overlap or exceed
    the cluster, onsets after the end, magnitudes outside physics, GPU/port/PSU/OST indices out of
    range. One line per file (file, key, reason); exit 1 if any is invalid.

    \b
    Examples:
      fleetsight twin validate twin/scenarios/*.yaml
      fleetsight twin validate my_scenario.yaml
    """
    bad = 0
    for name in files:
        try:
            scenario = load(resolve_scenario(name))
            click.echo(f"ok       {name}: {scenario.cluster.nodes} nodes, {len(scenario.faults)} faults")
        except (ScenarioError, click.BadParameter) as exc:
            bad += 1
            click.echo(f"INVALID  {name}: {exc}")
    if bad:
        sys.exit(1)


@cli.command()
@click.option(
    "--scenario",
    "scenario_name",
    default=None,
    help="Scenario YAML or shipped name (default: a 16-node llm-70b job, 4 pipeline stages, 40 min).",
)
@click.option("--slowdown", default=1.10, show_default=True, help="Compute-time multiplier of the slow node.")
@click.option("--node", default=None, help="The slow node (default: the middle node of the largest job).")
def calibrate(scenario_name: str | None, slowdown: float, node: str | None) -> None:
    """Measure how hard the twin is for a straggler detector: the per-sample spread of tensor activity
    across a healthy job's GPUs, the spread of nodes' 10-minute means, and how far a node that
    computes SLOWDOWN times slower stands out from its peers in one sample and over minutes.

    \b
    Examples:
      fleetsight twin calibrate
      fleetsight twin calibrate --scenario eval_medium --slowdown 1.05
    """
    import yaml

    from .calibrate import measure, report

    raw = None
    if scenario_name is not None:
        load_or_fail(scenario_name)  # one clear line if the file is bad
        raw = yaml.safe_load(resolve_scenario(scenario_name).read_text())
    try:
        click.echo(report(measure(raw, slowdown, node)))
    except (ScenarioError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
