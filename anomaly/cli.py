"""`fleetsight anomaly` sub-commands: serve the straggler detector, replay it over Prometheus's history.
Its scores on the twin are the evaluation layer's (`fleetsight evaluate anomaly`)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from fleetsight import durations
from fleetsight.logs import setup_logging
from fleetsight.webconfig import listen_address, run_server, uvicorn_tls, web_config_option

from .declared import DEFAULT_ROUTING_COMMENT, ROUTING_COMMENT_ENV, routing_comment_pattern
from .jobs import DEFAULT_POD_LABEL_KEYS, pod_label_keys
from .pace_cli import pace as pace_group
from .sdc_cli import sdc as sdc_group

DEFAULT_LISTEN = "127.0.0.1:19140"


@click.group(name="anomaly", context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Straggler detection: which node slows its job, and why.

    \b
    Examples:
      fleetsight anomaly serve --prometheus-url http://127.0.0.1:19110
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
            "--interval",
            type=float,
            default=30.0,
            show_default=True,
            envvar="FLEETSIGHT_ANOMALY_INTERVAL",
            help="Seconds between cycles.",
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


def _pod_owners(kubeconfig: Path | None) -> Any:
    """The API server's pod owners, or a usage error that says why it cannot be reached."""
    from fleetsight.kubeapi import KubeAPIError, connect

    from .owners import PodOwners

    try:
        return PodOwners(connect(kubeconfig))
    except (KubeAPIError, OSError, KeyError) as exc:
        raise click.UsageError(f"--pod-owners: {exc}") from None


@cli.command(short_help="Run the service: flag stragglers every cycle, serve the API.")
@reading_options(
    "slurmrestd base URL (http://slurmrestd:6820: the newest API version it offers) or a versioned "
    "jobs URL (…/slurm/v0.0.40/jobs); UNIX socket: FLEETSIGHT_SLURM_SOCKET, JWT: SLURM_JWT. Without it, "
    "jobs come from the hpc_job label."
)
@click.option(
    "--listen", default=DEFAULT_LISTEN, show_default=True, help="HOST:PORT of the REST API and /metrics."
)
@click.option(
    "--open-reads/--token-reads",
    default=True,
    show_default=True,
    help="Answer the API without a token (cluster network), or only to a token with scope `read` "
    "(FLEETSIGHT_ANOMALY_TOKENS='tok=read' or FLEETSIGHT_ANOMALY_TOKENS_FILE).",
)
@click.option(
    "--job-pod-labels",
    envvar="FLEETSIGHT_JOB_POD_LABELS",
    default=",".join(DEFAULT_POD_LABEL_KEYS),
    show_default=True,
    help="On Kubernetes, the pod-label keys that name a GPU's training job, first match wins "
    "(comma-separated, as the pods carry them; dcgm-exporter's sanitised form is matched).",
)
@click.option(
    "--routing-comment",
    envvar=ROUTING_COMMENT_ENV,
    default=DEFAULT_ROUTING_COMMENT,
    show_default=True,
    help="A regular expression (case-insensitive) a Slurm job's comment matches to declare that the "
    "job routes experts (a MoE job): its nodes' load moves by design, and a straggler without a "
    "hardware signal is held longer than routing lasts, from the job's first window. On "
    "Kubernetes the pod label fleetsight.io/expert-routing=true says the same.",
)
@click.option(
    "--cluster",
    envvar="FLEETSIGHT_CLUSTER",
    default="",
    help="`cluster` of the job-node series where the GPU series carry none.",
)
@click.option(
    "--pod-owners/--no-pod-owners",
    envvar="FLEETSIGHT_POD_OWNERS",
    default=False,
    show_default=True,
    help="On Kubernetes, name the job of a GPU pod without controller labels (the GPU operator's "
    "dcgm-exporter publishes none by default) from its owners in the API server: JobSet, PyTorchJob, "
    "TrainJob, LeaderWorkerSet, Job. Reads pods, jobs and statefulsets (get).",
)
@click.option(
    "--kubeconfig",
    envvar="KUBECONFIG",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="With --pod-owners: the API server's kubeconfig (token users); default: the pod's ServiceAccount.",
)
@click.option(
    "--dcgm-interval",
    envvar="FLEETSIGHT_DCGM_INTERVAL",
    default="5s",
    show_default=True,
    help="dcgm-exporter's collection interval (DCGM_EXPORTER_INTERVAL; what each profiling sample "
    "averages). The one-window fast path for large stragglers runs at 5s or more; shorter samples "
    'over-read a step\'s waits (docs/anomaly.md, "Sampling cadence").',
)
@web_config_option
def serve(
    prometheus_url: str,
    slurm_url: str | None,
    listen: str,
    open_reads: bool,
    interval: float,
    window: str,
    step: str,
    job_pod_labels: str,
    routing_comment: str,
    cluster: str,
    pod_owners: bool = False,
    kubeconfig: Path | None = None,
    dcgm_interval: str = "5s",
    web_config_file: str | None = None,
) -> None:
    """Run the service: read Prometheus every cycle, flag stragglers, serve /metrics and /v1/stragglers.

    \b
    Examples:
      fleetsight anomaly serve --prometheus-url http://127.0.0.1:19090
      fleetsight anomaly serve --prometheus-url http://thanos-query:10902 \\
          --slurm-url http://slurmrestd:6820 --listen 0.0.0.0:9140
      fleetsight anomaly serve --prometheus-url http://prometheus:9090 --pod-owners   # in a pod
      fleetsight anomaly serve --prometheus-url http://127.0.0.1:19090 --interval 10 --window 20s
      fleetsight anomaly serve --prometheus-url http://thanos-query:10902 --token-reads \\
          --web.config.file /etc/fleetsight/web-config.yml    # TLS; Prometheus scrapes with a read token
    """
    from fleetsight import auth

    from .paths import fast_path_runs
    from .service import AnomalyService, ServiceConfig, create_app
    from .state import DetectorConfig

    setup_logging()
    try:
        guard = auth.TokenGuard(auth.load_tokens("FLEETSIGHT_ANOMALY", (auth.READ,)), open_reads)
    except auth.TokenError as exc:
        raise click.ClickException(str(exc)) from None
    if not open_reads and not guard.tokens:
        raise click.UsageError("--token-reads needs at least one token (FLEETSIGHT_ANOMALY_TOKENS)")
    host, port = listen_address(listen)
    if interval <= 0:
        raise click.BadParameter("must be positive", param_hint="--interval")
    tls = uvicorn_tls(web_config_file)
    try:
        routing_comment_pattern(routing_comment)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--routing-comment") from None
    detector = DetectorConfig(sample_average_s=_interval_seconds(dcgm_interval))
    config = ServiceConfig(
        detector=detector,
        prometheus_url=prometheus_url,
        slurm_url=slurm_url,
        interval_s=interval,
        window=window,
        step=step,
        pod_label_keys=pod_label_keys(job_pod_labels),
        routing_comment=routing_comment,
        cluster=cluster,
        pod_owners=_pod_owners(kubeconfig) if pod_owners else None,
    )
    service = AnomalyService(config)
    logging.getLogger("anomaly").info(
        json.dumps(
            {
                "event": "serving",
                "listen": listen,
                "tls": bool(tls),
                "prometheus_url": prometheus_url,
                "slurm_url": slurm_url,
                "dcgm_interval_s": detector.sample_average_s,
                "fast_path": fast_path_runs(detector),
            }
        )
    )
    run_server(create_app(service, guard=guard), host, port, tls, limit_concurrency=256)


def _interval_seconds(value: str) -> float:
    try:
        seconds = float(durations.seconds(value))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--dcgm-interval") from None
    if not 0 < seconds <= 600:
        raise click.BadParameter(
            f"{value!r}: expected more than 0 and at most 10m", param_hint="--dcgm-interval"
        )
    return seconds


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
    from .queries import Queries
    from .source import PrometheusSource, SourceError

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


cli.add_command(sdc_group)  # silent data corruption from the training logs (anomaly/sdc_cli.py)
cli.add_command(pace_group)  # a job's own pace and its stragglers, from the same logs (anomaly/pace_cli.py)
