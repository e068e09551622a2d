"""`fleetsight dashboards`: build the JSON from the catalogue, list the panels, verify the queries."""

from __future__ import annotations

import sys
import time

import click

from fleetsight.settings import Settings

from . import build, catalog, verify


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
@click.option("--var", "variables", multiple=True, metavar="NAME=VALUE", help="A dashboard variable.")
@click.option("--at", type=float, default=None, help="Unix time to evaluate at (default: now).")
@click.option("--types/--no-types", default=True, help="Also type-check the JSON with tsc.")
def verify_command(
    prometheus_url: str | None, variables: tuple[str, ...], at: float | None, types: bool
) -> None:
    """Run every panel's PromQL against a real Prometheus and type-check the JSON against @grafana/schema.

    Exits 1 when a query is refused or the types do not check; queries that return no series are listed
    (a panel over a fault that has not happened is empty, which is not an error).

    \b
    Examples:
      fleetsight dashboards verify --var hpc_job=4101 --var node=n0001
      fleetsight dashboards verify --prometheus http://thanos:10902 --no-types
    """
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
