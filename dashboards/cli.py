"""`fleetsight dashboards`: build the JSON from the catalogue, list the panels, verify the queries."""

from __future__ import annotations

import os
import re
import sys
import time

import click
import httpx

from fleetsight.settings import Settings

from . import build, catalog, grafana_verify, verify


@click.group()
def cli() -> None:
    """Persona dashboards as code (grafana-foundation-sdk): researcher, sysadmin, facilities, executive.

    \b
    Examples:
      fleetsight dashboards build            regenerate dashboards/*.json from dashboards/catalog.py
      fleetsight dashboards build --check    exit 1 if the committed JSON is stale
      fleetsight dashboards list             every panel and its query
    """


@cli.command("build")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if a committed file differs.")
def build_command(check: bool) -> None:
    """Write one JSON file per dashboard next to the catalogue, where Grafana provisions them from.

    \b
    Examples:
      fleetsight dashboards build
      fleetsight dashboards build --check
    """
    if check:
        problems = build.stale()
        for problem in problems:
            click.echo(f"stale: {problem}")
        if problems:
            click.echo("run `fleetsight dashboards build` and commit the result")
            sys.exit(1)
        click.echo(f"up to date: {len(catalog.DASHBOARDS)} dashboards")
        return
    for path in build.write_all():
        click.echo(f"wrote {path}")


@cli.command("list")
def list_command() -> None:
    """Every dashboard, its question, and each panel with its queries.

    \b
    Examples:
      fleetsight dashboards list
      fleetsight dashboards list | grep -A2 Straggler
    """
    for spec in catalog.DASHBOARDS:
        click.echo(f"\n{spec.title} ({spec.persona}; uid {spec.uid}): {spec.question}")
        for variable in spec.variables:
            click.echo(f"  variable ${variable.name}: {variable.query}")
        for row in spec.rows:
            click.echo(f"  [{row.title}]")
            for item in row.panels:
                needs = f"  (needs {item.needs})" if item.needs else ""
                click.echo(f"    {item.title} [{item.kind}]{needs}")
                for query in item.queries:
                    click.echo(f"      {query.datasource}: {query.expr}")


@cli.command("verify")
@click.option("--prometheus", "prometheus_url", default=None, help="Prometheus or Thanos query URL.")
@click.option(
    "--grafana",
    "grafana_url",
    default=None,
    help="Check through this Grafana instead: folders, stored JSON, every target via /api/ds/query.",
)
@click.option("--window", type=float, default=3600.0, show_default=True, help="Seconds queried, ending --at.")
@click.option(
    "--offline-datasource",
    "offline",
    multiple=True,
    metavar="UID",
    help="With --grafana: a datasource not running here; its targets are reported empty, not queried.",
)
@click.option(
    "--min-interval",
    default="",
    help="With --grafana: each target's min interval (the sparsest scrape, e.g. 60s for a backfill).",
)
@click.option(
    "--may-be-absent",
    default="",
    metavar="REGEX",
    help="With --grafana: metrics this stack does not write (a backfill has no live services' series); "
    "any other metric that no series ever had is an error.",
)
@click.option("--var", "variables", multiple=True, metavar="NAME=VALUE", help="A dashboard variable.")
@click.option("--at", type=float, default=None, help="Unix time to evaluate at (default: now).")
@click.option("--types/--no-types", default=True, help="Also type-check the JSON with tsc.")
def verify_command(
    prometheus_url: str | None,
    grafana_url: str | None,
    window: float,
    offline: tuple[str, ...],
    min_interval: str,
    may_be_absent: str,
    variables: tuple[str, ...],
    at: float | None,
    types: bool,
) -> None:
    """Run every panel's PromQL against a real Prometheus and type-check the JSON against @grafana/schema.

    Exits 1 when a query is refused or the types do not check; queries that return no series are listed
    (a panel over a fault that has not happened is empty, which is not an error).

    \b
    Examples:
      fleetsight dashboards verify --var hpc_job=4101 --var node=n0001
      fleetsight dashboards verify --prometheus http://thanos:10902 --no-types
      fleetsight dashboards verify --grafana http://127.0.0.1:19145 --offline-datasource logs

    With --grafana, Grafana's admin login is read from GRAFANA_USER and GRAFANA_PASSWORD when set.
    """
    if grafana_url:
        verify_with_grafana(grafana_url, window, offline, min_interval, may_be_absent, at)
        return
    settings = Settings()
    url = prometheus_url or settings.url("prometheus")
    values = dict(v.split("=", 1) for v in variables)
    for spec in catalog.DASHBOARDS:
        for variable in spec.variables:
            if variable.constant:
                values.setdefault(variable.name, variable.query)
    results = verify.run_queries(url, values, at or time.time())
    failed = [r for r in results if r.error]
    empty = [r for r in results if not r.error and r.series == 0]
    for result in failed:
        click.echo(f"REFUSED {result.dashboard} / {result.panel}: {result.error}\n    {result.expr}")
    for result in empty:
        click.echo(f"empty   {result.dashboard} / {result.panel}")
    click.echo(
        f"{len(results)} queries: {len(results) - len(failed) - len(empty)} with data, "
        f"{len(empty)} empty, {len(failed)} refused"
    )
    ok = not failed
    if types:
        typed, output = verify.typecheck(settings)
        click.echo("types: ok" if typed else f"types: FAILED\n{output}")
        ok = ok and typed
    sys.exit(0 if ok else 1)


def verify_with_grafana(
    url: str, window: float, offline: tuple[str, ...], min_interval: str, absent: str, at: float | None
) -> None:
    """Print the per-dashboard table; exit 1 on any error (listing, round-trip, refused query)."""
    end = at or time.time()
    user, password = os.environ.get("GRAFANA_USER", "admin"), os.environ.get("GRAFANA_PASSWORD")
    try:
        checks = grafana_verify.verify(
            url,
            end - window,
            end,
            offline,
            min_interval,
            (user, password) if password else None,
            re.compile(absent) if absent else None,
        )
    except httpx.HTTPError as error:
        raise click.ClickException(f"Grafana at {url} did not answer: {error}") from error
    click.echo(grafana_verify.table(checks))
    sys.exit(1 if any(check.failed for check in checks) else 0)
