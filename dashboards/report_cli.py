"""`fleetsight report`: the executive report of a period, as HTML with plots and as JSON."""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from pathlib import Path

import click
import httpx
from rich.console import Console

from fleetsight.settings import Settings

from . import report as report_mod

RELATIVE = re.compile(r"^(now)?-(\d+)([mhd])$")
UNITS = {"m": 60, "h": 3600, "d": 86400}


def parse_when(value: str, now: float) -> float:
    """ISO 8601 (2026-11-21T00:00:00Z), `now`, or `now-7d` / `-12h`."""
    if value == "now":
        return now
    relative = RELATIVE.match(value)
    if relative:
        return now - int(relative.group(2)) * UNITS[relative.group(3)]
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise click.BadParameter(f"{value!r}: use ISO 8601 (2026-11-21T00:00:00Z), now, or now-7d") from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


@click.command()
@click.option("--from", "start", default="now-7d", show_default=True, help="Start of the period.")
@click.option("--to", "end", default="now", show_default=True, help="End of the period.")
@click.option("--prometheus", "prometheus_url", default=None, help="Prometheus or Thanos query URL.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("report"),
              show_default=True, help="Folder for report.html and report.json.")  # fmt: skip
@click.option("--price-per-kwh", type=float, default=0.12, show_default=True, help="Energy price.")
@click.option("--slack-webhook-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Post a short summary to the Slack webhook whose URL this file holds.")  # fmt: skip
def cli(
    start: str, end: str, prometheus_url: str | None, out: Path, price_per_kwh: float,
    slack_webhook_file: Path | None,
) -> None:  # fmt: skip
    """Write the executive report of a period: availability, effective training time, MTBF and MTTR,
    failures by category, GPU utilization, energy and its cost, each with its trend against the
    previous period of the same length, and the ten nodes that cost the most time.

    Reads Prometheus or Thanos (default: the local stack's Prometheus). Writes OUT/report.html (self-
    contained, plots inline) and OUT/report.json (the same figures).

    \b
    Examples:
      fleetsight report --from now-7d --to now --out /tmp/weekly
      fleetsight report --from 2026-11-21T00:00:00Z --to 2026-11-22T00:00:00Z --prometheus http://thanos:10902
    """
    now = time.time()
    start_s, end_s = parse_when(start, now), parse_when(end, now)
    if end_s <= start_s:
        raise click.BadParameter(f"--to ({end}) must be after --from ({start})")
    url = prometheus_url or Settings().url("prometheus")
    console = Console(stderr=True)
    try:
        with console.status(f"querying {url} for {report_mod.iso(start_s)} .. {report_mod.iso(end_s)}"):
            built = report_mod.build_report(url, start_s, end_s, price_per_kwh)
        with console.status("drawing the plots"):
            page = report_mod.render_html(built)
    except (report_mod.ReportError, httpx.HTTPError) as exc:
        raise click.ClickException(str(exc)) from exc
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.html").write_text(page)
    (out / "report.json").write_text(json.dumps(report_mod.public(built), indent=2) + "\n")
    click.echo(report_mod.slack_summary(built).replace("*", ""))
    click.echo(f"wrote {out / 'report.html'} and {out / 'report.json'}")
    if slack_webhook_file:
        post_to_slack(slack_webhook_file, report_mod.slack_summary(built))


def post_to_slack(webhook_file: Path, text: str) -> None:
    if not webhook_file.is_file():
        raise click.ClickException(f"{webhook_file}: no such file (it should hold the Slack webhook URL)")
    url = webhook_file.read_text().strip()
    try:
        httpx.post(url, json={"text": text}, timeout=10).raise_for_status()
    except httpx.HTTPError as exc:  # the URL is a secret: name the file, not the URL
        raise click.ClickException(
            f"posting to the Slack webhook in {webhook_file} failed: {type(exc).__name__}"
        ) from exc
    click.echo(f"posted the summary to the Slack webhook in {webhook_file}")
