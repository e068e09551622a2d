"""`fleetsight anomaly` sub-commands: serve the straggler detector, replay it over Prometheus's history,
evaluate it on the twin."""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from fleetsight import durations

DEFAULT_LISTEN = "127.0.0.1:19140"


def setup_logging() -> None:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per PromQL query is noise


@click.group(name="anomaly", context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Straggler detection: which node slows its job, and why.

    \b
    Examples:
      fleetsight anomaly serve --prometheus-url http://127.0.0.1:19110
      fleetsight anomaly evaluate --scenario case_01 --scenario fault_free_day
      fleetsight anomaly evaluate --scenario anomaly/eval/scenarios/gray_x110_16n.yaml --json
      fleetsight anomaly replay --prometheus-url http://127.0.0.1:19090 --since 2h
    """


def reading_options(slurm_help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """What `serve` and `replay` read and how: the same options, so a replay can match a service."""
    options = [
        click.option(
            "--prometheus-url",
            envvar="FLEETSIGHT_PROMETHEUS_URL",
            required=True,
            help="Prometheus or Thanos query base URL (PromQL over HTTP).",
        ),
        click.option("--slurm-url", envvar="FLEETSIGHT_SLURM_URL", default=None, help=slurm_help),
        click.option(
            "--interval", type=float, default=30.0, show_default=True, help="Seconds between cycles."
        ),
        click.option(
            "--window", default="30s", show_default=True, help="PromQL range each cycle summarises."
        ),
        click.option(
            "--step", default="5s", show_default=True, help="Subquery step (the dcgm scrape interval)."
        ),
    ]

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


@cli.command(short_help="Run the service: flag stragglers every cycle, serve the API.")
@reading_options("slurmrestd jobs URL (…/slurm/v0.0.40/jobs); without it, jobs come from the hpc_job label.")
@click.option(
    "--listen", default=DEFAULT_LISTEN, show_default=True, help="HOST:PORT of the REST API and /metrics."
)
def serve(
    prometheus_url: str, slurm_url: str | None, listen: str, interval: float, window: str, step: str
) -> None:
    """Run the service: read Prometheus every cycle, flag stragglers, serve /metrics and /v1/stragglers.

    \b
    Examples:
      fleetsight anomaly serve --prometheus-url http://127.0.0.1:19090
      fleetsight anomaly serve --prometheus-url http://thanos-query:10902 \\
          --slurm-url http://slurmrestd:6820/slurm/v0.0.40/jobs --listen 0.0.0.0:9140
      fleetsight anomaly serve --prometheus-url http://127.0.0.1:19090 --interval 10 --window 20s
    """
    import uvicorn

    from .service import AnomalyService, ServiceConfig, create_app

    setup_logging()
    host, _, port = listen.rpartition(":")
    if not port.isdigit():
        raise click.BadParameter(f"expected HOST:PORT, got {listen!r}", param_hint="--listen")
    if interval <= 0:
        raise click.BadParameter("must be positive", param_hint="--interval")
    config = ServiceConfig(
        prometheus_url=prometheus_url, slurm_url=slurm_url, interval_s=interval, window=window, step=step
    )
    service = AnomalyService(config)
    logging.getLogger("anomaly").info(
        json.dumps(
            {"event": "serving", "listen": listen, "prometheus_url": prometheus_url, "slurm_url": slurm_url}
        )
    )
    uvicorn.run(create_app(service), host=host or "127.0.0.1", port=int(port), log_level="warning")


def parse_when(value: str, now: float, hint: str) -> float:
    """Unix seconds from unix seconds, a duration ago (90s, 30m, 2h, 1d) or an ISO 8601 time (UTC
    unless it says otherwise)."""
    for read in (
        float,
        lambda text: now - durations.seconds(text),
        lambda text: durations.instant(text).timestamp(),
    ):
        try:
            return read(value)
        except ValueError:
            pass
    raise click.BadParameter(
        f"{value!r}: expected a duration ago (30m, 2h), unix seconds or an ISO 8601 time", param_hint=hint
    )


@cli.command(short_help="The detector over a past stretch of Prometheus data.")
@reading_options("slurmrestd jobs URL: jobs as they are *now*; without it, each window's hpc_job labels.")
@click.option("--since", required=True, help="Start: a duration ago (30m, 2h), unix seconds or ISO 8601.")
@click.option("--until", "until_", default=None, help="End (same forms; default: now).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per flag, clear and cause change.")
def replay(
    prometheus_url: str,
    slurm_url: str | None,
    since: str,
    until_: str | None,
    interval: float,
    window: str,
    step: str,
    as_json: bool,
) -> None:
    """Run the detector over a past stretch of Prometheus's data, cycle by cycle, as the service would
    have: which nodes it flags and clears, and why. Nothing is written anywhere.

    To reproduce what a running service did, give the service's cycle times: --since at one of its
    cycles (fleetsight_anomaly_last_cycle_timestamp_seconds) and its --interval, --window and --step.

    \b
    Examples:
      fleetsight anomaly replay --prometheus-url http://127.0.0.1:19090 --since 2h
      fleetsight anomaly replay --prometheus-url http://thanos-query:10902 \\
          --since 2026-11-23T19:45:55.841Z --until 2026-11-23T21:00:00Z --json
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from .detector import Detector
    from .source import PrometheusSource, Queries, SourceError

    now = time.time()
    start = parse_when(since, now, "--since")
    end = parse_when(until_, now, "--until") if until_ else now
    if interval <= 0:
        raise click.BadParameter("must be positive", param_hint="--interval")
    if end <= start:
        raise click.BadParameter(
            f"ends before it starts ({until_ or 'now'} <= {since})", param_hint="--until"
        )
    cycles = int((end - start) // interval) + 1
    source = PrometheusSource(prometheus_url, Queries(window, step), slurm_url)
    detector = Detector()
    lines: list[dict[str, Any]] = []
    try:
        with Progress(
            TextColumn("replaying"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} cycles"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        ) as progress:
            task = progress.add_task("replay", total=cycles)
            for cycle in range(cycles):
                at = start + cycle * interval
                try:
                    # As the event happened: a flag's straggler is updated in place later (score, cause).
                    lines += [_event_line(e) for e in detector.step(source.read(at=at)).events]
                except SourceError as exc:
                    raise click.ClickException(f"cycle at {_iso(at)}: {exc}") from exc
                progress.advance(task)
    finally:
        source.close()
    for line in lines:
        if as_json:
            click.echo(json.dumps(line))
        else:
            click.echo(
                f"{line['time']}  {line['event']:<5}  job {line['hpc_job']}  {line['node']} GPU {line['gpu']}"
                f"  {line['cause']}  z {line['score']:.1f}"
            )
    flags = sum(line["event"] == "flag" for line in lines)
    last = start + (cycles - 1) * interval
    click.echo(f"{cycles} cycles from {_iso(start)} to {_iso(last)}: {flags} flag(s)", err=True)


def _event_line(event: Any) -> dict[str, Any]:
    return {"event": event.kind, "time": _iso(event.time), **event.straggler.as_dict()}


def _iso(unix: float) -> str:
    return dt.datetime.fromtimestamp(unix, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@cli.command(short_help="Score the detector and two baselines on the twin.")
@click.option(
    "--scenario",
    "scenarios",
    multiple=True,
    required=True,
    help="Twin scenario file or shipped name (twin/scenarios, anomaly/eval/scenarios); repeatable.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option("--cycle", type=float, default=30.0, show_default=True, help="Detection cycle (s).")
@click.option(
    "--duration",
    help="Simulate only the first part of each scenario (90s, 30m, 2h; as `twin run --duration`).",
)
@click.option(
    "--flags-out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write every flag/clear as JSON lines.",
)
def evaluate(
    scenarios: tuple[str, ...], as_json: bool, cycle: float, duration: str | None, flags_out: Path | None
) -> None:
    """Run the detector and two baselines over the twin's simulated data (offline) and score them.

    Prints precision, recall, F1 and latency per fault kind and slowdown band, and false flags per
    1,000 node-hours on fault-free scenarios, for the detector and, beside it, the static power
    threshold and the plain per-job z-score.

    \b
    Examples:
      fleetsight anomaly evaluate --scenario case_01
      fleetsight anomaly evaluate $(printf -- "--scenario %s " anomaly/eval/scenarios/*.yaml) --json
      fleetsight anomaly evaluate --scenario fault_free_day --flags-out /tmp/flags.jsonl
      fleetsight anomaly evaluate --scenario mixed_day --duration 8h
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from . import evaluation

    try:
        paths = [evaluation.resolve_scenario(s) for s in scenarios]
        seconds = evaluation.parse_duration(duration) if duration else None
        ticks = evaluation.total_ticks(paths, seconds)
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
            evaluation.run_scenario(p, cycle, lambda n: progress.advance(task, n), seconds) for p in paths
        ]
    report = evaluation.report(runs, cycle)
    if flags_out is not None:
        with flags_out.open("w") as handle:
            for line in evaluation.flag_log(runs):
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
