"""`fleetsight dashboards`: build the JSON from the catalogue, list the panels, verify the queries."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from fleetsight.settings import Settings
from fleetsight.webconfig import listen_address, run_server

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
@click.option(
    "--logs",
    "logs_url",
    default=None,
    help="OpenSearch/Elasticsearch URL for the logs panels (skipped without it).",
)
@click.option("--window", type=float, default=3600.0, show_default=True, help="Seconds queried, ending --at.")
@click.option(
    "--var",
    "variables",
    multiple=True,
    metavar="NAME=VALUE[,VALUE]",
    help="A dashboard variable; several values (comma-separated) for a multi-value one.",
)
@click.option("--at", type=float, default=None, help="Unix time to evaluate at (default: now).")
@click.option(
    "--dir",
    "folder",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="A folder of dashboard JSON to check instead of the committed files (e.g. an edited copy).",
)
@click.option("--types/--no-types", default=True, help="Also type-check the JSON with tsc.")
def verify_command(
    prometheus_url: str | None,
    logs_url: str | None,
    window: float,
    variables: tuple[str, ...],
    at: float | None,
    folder: Path | None,
    types: bool,
) -> None:
    """Run every panel target of the committed JSON as Grafana would send it (its documented macros and
    variable formats: dashboards/templating.py) against a real Prometheus, and the logs panels against
    OpenSearch/Elasticsearch; type-check the JSON against @grafana/schema.

    Exits 1 when a query is refused, a datasource uid is not provisioned, or the types do not check;
    queries that return no series are listed (a panel over a fault that has not happened is empty, which
    is not an error).

    \b
    Examples:
      fleetsight dashboards verify --var hpc_job=4101 --var node=n0001
      fleetsight dashboards verify --prometheus http://thanos:10902 --logs http://127.0.0.1:9200 --no-types
    """
    settings = Settings()
    url = prometheus_url or settings.url("prometheus")
    values = {name: value.split(",") if "," in value else value
              for name, value in (v.split("=", 1) for v in variables)}  # fmt: skip
    results = verify.run_queries(
        url, values, at or time.time(), int(window), logs_url, folder or build.OUTPUT_DIR
    )
    click.echo(report(results))
    ok = not any(r.error for r in results)
    if types:
        typed, output = verify.typecheck(settings, folder)
        click.echo("types: ok" if typed else f"types: FAILED\n{output}")
        ok = ok and typed
    sys.exit(0 if ok else 1)


def report(results: list[verify.QueryResult]) -> str:
    """One line per refused, skipped or empty target, then the counts."""
    failed = [r for r in results if r.error]
    skipped = [r for r in results if r.skipped]
    empty = [r for r in results if not r.error and not r.skipped and r.series == 0]
    lines = [f"REFUSED {r.dashboard} / {r.panel}: {r.error}\n    {r.expr}" for r in failed]
    lines += [f"skipped {r.dashboard} / {r.panel}: {r.skipped}" for r in skipped]
    lines += [f"empty   {r.dashboard} / {r.panel}" for r in empty]
    with_data = len(results) - len(failed) - len(skipped) - len(empty)
    lines.append(
        f"{len(results)} queries: {with_data} with data, {len(empty)} empty, "
        f"{len(skipped)} skipped, {len(failed)} refused"
    )
    return "\n".join(lines)


@cli.command("serve")
@click.option("--listen", default=None, help="HOST:PORT (default: the local stack's dashboards port).")
@click.option(
    "--prometheus",
    "prometheus_url",
    default=None,
    help="Prometheus or Thanos Query URL the panels read (default: the local stack's Thanos Query).",
)
@click.option("--logs", "logs_url", default=None, help="OpenSearch/Elasticsearch URL for the logs panels.")
@click.option("--chat-url", default=None, help="The chat page to link from the home and overview pages.")
@click.option(
    "--fleet-url",
    default=None,
    help="The global layer's API (fleetsight fleet serve) for the /fleet page: each cluster, whether it "
    "answers, its node states; without it /fleet shows only what Prometheus/Thanos tells per cluster.",
)
@click.option(
    "--fleet-token-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A token with scope `read` on the global layer (if it was started with --token-reads).",
)
def serve_command(
    listen: str | None,
    prometheus_url: str | None,
    logs_url: str | None,
    chat_url: str | None,
    fleet_url: str | None,
    fleet_token_file: Path | None,
) -> None:
    """Draw the persona dashboards in a browser, from the committed Grafana JSON (what production Grafana
    provisions), every query run against the real Prometheus/Thanos and OpenSearch; plus a fleet overview
    (/overview: every node's health by rack, firing alerts, stragglers) and the fleet's clusters side by
    side (/fleet: from the global layer at --fleet-url, and Thanos). Not Grafana: readable, and the
    same numbers. --logs and --fleet-url are optional: without them the pages say what they lack.

    \b
    Examples:
      fleetsight dashboards serve                       on the local stack (make up starts it)
      fleetsight dashboards serve --listen 127.0.0.1:3001 --prometheus http://thanos:10902 \\
          --logs http://127.0.0.1:9200
      fleetsight dashboards serve --prometheus http://global-query:10902 \\
          --fleet-url http://fleet.example:9450        the global view: no logs, every cluster
    """
    from .npm import echarts_file
    from .viewer.app import Sources, create_app

    settings = Settings()
    host, port = listen_address(listen or f"{settings.host}:{settings.port('dashboards')}")
    charts = echarts_file(settings)
    if not charts.is_file():
        raise click.ClickException(f"{charts} is missing: run `fleetsight setup --only echarts`")
    token = None
    if fleet_token_file is not None:
        from fleetsight.secrets import SecretFileError, read_secret_file

        try:
            token = read_secret_file(fleet_token_file, "--fleet-token-file")
        except SecretFileError as exc:
            raise click.ClickException(str(exc)) from None
    sources = Sources(prometheus_url or settings.url("thanos_query"), logs_url, chat_url, fleet_url, token)
    run_server(create_app(sources, charts), host, port, limit_concurrency=64)
