"""`fleetsight anomaly pace`: a job's own pace from its training logs, once (`check`): its slowdown against
its own healthy pace, the GPU-hours lost, and the straggler no GPU signal shows. The check itself:
anomaly/pace.py; the service that publishes it every cycle is the training watch (`fleetsight anomaly
sdc serve`, anomaly/sdc_watch.py); docs/anomaly.md, "The job's own pace"."""

from __future__ import annotations

import click

from .pace import PaceVerdict, detect
from .pace_records import PaceInputError, from_documents, parse_lines
from .sdc_cli import check_options, run_check


@click.group(
    name="pace",
    short_help="A job's own pace and its stragglers, from the training logs.",
    context_settings={"help_option_names": ["-h", "--help"]},
)
def pace() -> None:
    """A job's own pace from its training logs: how much slower it runs than its own recent healthy
    pace, the GPU-hours that cost, and the straggler with no GPU signature (a slow host: cause host; a
    slow NIC or fabric: cause communication).

    Reads the step times the jobs log (`fleetsight-train step=N ... step_time_ms=T data_ms=D
    compute_ms=C comm_ms=M`, or Megatron's progress line for the slowdown alone) from the log store, or
    from log files. The watch that publishes it every cycle: `fleetsight anomaly sdc serve`.

    \b
    Examples:
      fleetsight anomaly pace check --logs-url http://127.0.0.1:19200 --job 4101
      fleetsight anomaly pace check --logs-url https://logs:9200 --since 2h --json
      fleetsight anomaly pace check --file /var/log/jobs/4101/rank-0.log --job 4101
    """


@pace.command(short_help="Check jobs once and print their pace.")
@check_options
@click.pass_context
def check(ctx: click.Context, **options: object) -> None:
    """Check each job once: its status (ok, slow, straggler, unknown), slowdown, GPU-hours lost and the
    straggler's node and cause. Exit status 1 when a straggler is named.

    \b
    Examples:
      fleetsight anomaly pace check --logs-url http://127.0.0.1:19200 --since 12h
      fleetsight anomaly pace check --logs-url http://127.0.0.1:19200 --job 4101 --json
      fleetsight anomaly pace check --file rank-0.log --file rank-8.log --job 4101
    """
    run_check(
        ctx,
        options,
        from_lines=lambda lines, job: detect(parse_lines(lines), job),
        from_store=lambda store, job, since: detect(from_documents(store.sources(job, since)), job),
        input_error=PaceInputError,
        line=_line,
    )


def _line(verdict: PaceVerdict) -> str:
    v = verdict
    if v.status == "unknown":
        return f"job {v.job}: pace unknown ({v.reason})"
    pace = f"{v.step_ms:.0f} ms/step"
    if v.slowdown_ratio is not None and v.healthy_ms is not None:
        pace += f", {v.slowdown_ratio:+.1%} against its healthy {v.healthy_ms:.0f} ms"
    cost = f"{v.gpu_hours_lost:.2f} GPU-hours lost"
    if v.straggler is None:
        note = f" ({v.reason})" if v.reason else ""
        return f"job {v.job}: {v.status}{note}: {pace}; {cost}"
    s = v.straggler
    where = f"on {s.node}" if s.node else "on the whole ring (no single node)"
    return (
        f"job {v.job}: STRAGGLER, cause {s.cause}, {where} (+{s.excess_ms:.0f} ms/step, "
        f"since step {s.step}): {pace}; {cost}"
    )
