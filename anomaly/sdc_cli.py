"""`fleetsight anomaly sdc`: the silent-corruption check from the training logs, once (`check`) or as a
small service that publishes its flags (`serve`). The check itself: anomaly/sdc.py; docs/anomaly.md,
"Silent data corruption"."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import click

from fleetsight.logs import setup_logging
from fleetsight.webconfig import listen_address

from .sdc import SdcInputError, detect
from .sdc_records import parse_lines
from .sdc_source import LogStore, SourceError

WINDOW = re.compile(r"^[1-9][0-9]*[smhd]$")
DEFAULT_LISTEN = "127.0.0.1:19146"


def _window(value: str) -> str:
    if not WINDOW.match(value):
        raise click.BadParameter(
            f"{value!r}: a number and a unit s, m, h or d (6h, 90m, 2d)", param_hint="--since"
        )
    return value


def _login(user: str | None, password_file: Path | None) -> tuple[str, str] | None:
    if not user:
        return None
    if password_file is None:
        raise click.UsageError("--logs-user needs --logs-password-file (the password is never an argument)")
    return user, password_file.read_text().strip()


def store_options(command: click.Command) -> click.Command:
    for option in reversed(
        [
            click.option(
                "--logs-url",
                envvar="FLEETSIGHT_LOGS_URL",
                default=None,
                help="OpenSearch/Elasticsearch base URL holding the fleetsight-logs-* indices.",
            ),
            click.option(
                "--logs-user", envvar="FLEETSIGHT_SDC_LOGS_USER", default=None, help="Read-only user."
            ),
            click.option(
                "--logs-password-file",
                envvar="FLEETSIGHT_SDC_LOGS_PASSWORD_FILE",
                type=click.Path(exists=True, dir_okay=False, path_type=Path),
                default=None,
                help="File holding that user's password.",
            ),
            click.option(
                "--logs-ca-file", envvar="FLEETSIGHT_LOGS_CA_FILE", default=None, help="CA of the store."
            ),
            click.option(
                "--since", default="6h", show_default=True, help="Window of steps to check (6h, 90m)."
            ),
        ]
    ):
        command = option(command)
    return command


class Verdict(Protocol):
    flagged: bool

    def as_dict(self) -> dict[str, Any]: ...


V = TypeVar("V", bound=Verdict)


def run_check(
    ctx: click.Context,
    options: dict[str, Any],
    from_lines: Callable[[list[str], str], V],
    from_store: Callable[[LogStore, str, str], V],
    input_error: type[Exception],
    line: Callable[[V], str],
) -> None:
    """A one-off check (sdc check, pace check): a verdict per job from the log files or the store, printed
    as a line or JSON; exit status 1 when one is flagged. Bad input is a clear error, not a trace."""
    verdicts: list[V] = []
    try:
        if options["files"]:
            lines = [text for path in options["files"] for text in Path(path).read_text().splitlines()]
            verdicts.append(from_lines(lines, ",".join(options["jobs"]) or "file"))
        else:
            if not options["logs_url"]:
                raise click.UsageError("give --logs-url (or FLEETSIGHT_LOGS_URL), or log files with --file")
            since = _window(str(options["since"]))  # before the store: a bad window leaves nothing open
            store = LogStore(
                str(options["logs_url"]),
                _login(options["logs_user"], options["logs_password_file"]),
                options["logs_ca_file"],
            )
            try:
                for job in options["jobs"] or store.jobs(since):
                    verdicts.append(from_store(store, job, since))
            finally:
                store.close()
    except (input_error, SourceError) as exc:
        raise click.ClickException(str(exc)) from None
    if not verdicts:
        click.echo(f"no job logged training steps in the last {options['since']}", err=True)
    for verdict in verdicts:
        click.echo(json.dumps(verdict.as_dict()) if options["as_json"] else line(verdict))
    ctx.exit(1 if any(v.flagged for v in verdicts) else 0)


@click.group(
    name="sdc",
    short_help="Silent data corruption from the training logs.",
    context_settings={"help_option_names": ["-h", "--help"]},
)
def sdc() -> None:
    """Silent data corruption from the training logs: a job whose updates turn anomalous without a NaN,
    and the data-parallel replica (its node) that disagrees with the others.

    Reads the jobs' training steps (Megatron progress lines; per-replica `step=N replica=R ... loss=X
    grad_norm=G` lines where the job prints them) from the log store, or from log files.

    \b
    Examples:
      fleetsight anomaly sdc check --logs-url http://127.0.0.1:19200
      fleetsight anomaly sdc check --logs-url https://logs:9200 --job 4101 --since 2h --json
      fleetsight anomaly sdc check --file /var/log/jobs/4101/rank-0.log --file /var/log/jobs/4101/rank-8.log
      fleetsight anomaly sdc serve --logs-url http://127.0.0.1:19200 --listen 127.0.0.1:19146
    """


def check_options(command: click.Command) -> click.Command:
    """A one-off check's options (sdc check, pace check): the store's, the jobs, log files instead, JSON."""
    options = [
        store_options,
        click.option(
            "--job",
            "jobs",
            multiple=True,
            help="Only this job (repeatable). Default: every job in the window.",
        ),
        click.option(
            "--file",
            "files",
            multiple=True,
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            help="Read these log files instead of the store (one job's rank logs).",
        ),
        click.option("--json", "as_json", is_flag=True, help="One JSON verdict per line."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@sdc.command(short_help="Check jobs once and print the verdicts.")
@check_options
@click.pass_context
def check(ctx: click.Context, **options: object) -> None:
    """Check each job once: flagged or not, at which step, why, and the suspect replica and node.
    Exit status 1 when a job is flagged.

    \b
    Examples:
      fleetsight anomaly sdc check --logs-url http://127.0.0.1:19200 --since 12h
      fleetsight anomaly sdc check --logs-url http://127.0.0.1:19200 --job 4101 --json
      FLEETSIGHT_LOGS_URL=http://127.0.0.1:19200 fleetsight anomaly sdc check --job 4101
      fleetsight anomaly sdc check --file rank-0.log --file rank-8.log --job 4101
    """
    run_check(
        ctx,
        options,
        from_lines=lambda lines, job: detect(parse_lines(lines), job),
        from_store=lambda store, job, since: detect(store.records(job, since), job),
        input_error=SdcInputError,
        line=_line,
    )


def _line(verdict: object) -> str:
    v = verdict.as_dict()  # type: ignore[attr-defined]
    if not v["flagged"]:
        return f"job {v['job']}: no sign of corruption over {v['steps']} steps ({v['replicas']} replicas)"
    named = ", ".join(
        f"replica {s['replica']} on {s['node'] or '?'} ({s['metric']}, z {s['score']})" for s in v["suspects"]
    )
    return f"job {v['job']}: FLAGGED at step {v['step']} ({v['reason']}){': ' + named if named else ''}"


@sdc.command(short_help="Check every cycle and publish the flags on /metrics.")
@store_options
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True, help="HOST:PORT of /metrics.")
@click.option("--interval", type=click.FloatRange(min=5.0), default=300.0, show_default=True, help="Seconds.")
def serve(**options: object) -> None:
    """Check every job in the window every --interval seconds; publish fleetsight_training_sdc_suspect
    (and _flagged, _source_up, ...) on /metrics for Prometheus, which alerts with
    TrainingSilentCorruptionSuspected (warning; never a drain). The same cycle measures each job's own
    pace (anomaly/pace.py; `fleetsight anomaly pace check` once): fleetsight_job_pace_slowdown_ratio,
    fleetsight_job_pace_gpu_hours_lost_total and fleetsight_job_pace_straggler{hpc_job,node,cause}.

    \b
    Examples:
      fleetsight anomaly sdc serve --logs-url http://127.0.0.1:19200
      fleetsight anomaly sdc serve --logs-url https://logs:9200 --logs-user sdc \\
          --logs-password-file /run/secrets/sdc --since 6h --interval 120 --listen 0.0.0.0:9146
    """
    from prometheus_client import CollectorRegistry, make_asgi_app

    from fleetsight.webconfig import run_server

    from .sdc_watch import SdcCollector, SdcWatch

    setup_logging()
    if not options["logs_url"]:
        raise click.UsageError("give --logs-url (or FLEETSIGHT_LOGS_URL)")
    host, port = listen_address(str(options["listen"]))
    store = LogStore(
        str(options["logs_url"]),
        _login(options["logs_user"], options["logs_password_file"]),
        options["logs_ca_file"],
    )
    watch = SdcWatch(store, _window(str(options["since"])))
    registry = CollectorRegistry()
    registry.register(SdcCollector(watch))
    interval = float(options["interval"])  # type: ignore[arg-type]

    def loop() -> None:
        while True:
            watch.cycle()
            time.sleep(interval)  # the pace of the cycle, not a synchronisation

    threading.Thread(target=loop, name="sdc-cycle", daemon=True).start()
    logging.getLogger("anomaly.sdc").info(json.dumps({"event": "serving", "listen": f"{host}:{port}"}))
    run_server(make_asgi_app(registry), host, port)
