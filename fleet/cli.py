"""``fleetsight fleet``: the global layer's read API over every cluster's health service, and a check of
its clusters file."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import click

from fleetsight import auth
from fleetsight.durations import seconds
from fleetsight.logs import setup_logging
from fleetsight.webconfig import listen_address, run_server, uvicorn_tls, web_config_option

from .clusters import Cluster, ClustersFileError, FanOut, load_clusters

log = logging.getLogger("fleet")
TOKENS_PREFIX = "FLEETSIGHT_FLEET"
# Callers at once before the answer is 503: each request fans out to every cluster.
MAX_CONCURRENT_REQUESTS = 64

clusters_file_option = click.option(
    "--clusters-file",
    envvar="FLEETSIGHT_FLEET_CLUSTERS_FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="YAML: `clusters:`, a list of {name, health, token_file, ca_file} (docs/fleet.md).",
)
timeout_option = click.option(
    "--timeout",
    default="5s",
    show_default=True,
    help="How long to wait for one cluster's answer before listing it as missing.",
)


@click.group()
def cli() -> None:
    """The global layer: one read API over every cluster's health service (docs/fleet.md). Reads only;
    each answer names the clusters that did not answer.

    \b
    Examples:
      fleetsight fleet check --clusters-file /etc/fleetsight/fleet/clusters.yml
      fleetsight fleet serve --clusters-file /etc/fleetsight/fleet/clusters.yml --listen 0.0.0.0:9450 \\
          --thanos-url http://thanos-query:10902
    """


def _clusters(path: Path) -> list[Cluster]:
    try:
        return load_clusters(path)
    except ClustersFileError as exc:
        raise click.BadParameter(str(exc), param_hint="--clusters-file") from None


def _seconds(value: str, option: str) -> float:
    try:
        parsed = seconds(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None
    if parsed <= 0:
        raise click.BadParameter(f"{value!r}: must be more than 0", param_hint=option)
    return parsed


@cli.command("serve")
@clusters_file_option
@click.option("--listen", default="127.0.0.1:9450", show_default=True, help="HOST:PORT to serve on.")
@timeout_option
@click.option(
    "--poll-interval",
    default="15s",
    show_default=True,
    help="How often each cluster's status is asked, so that fleetsight_fleet_cluster_up stays true.",
)
@click.option(
    "--thanos-url",
    envvar="FLEETSIGHT_FLEET_THANOS_URL",
    default=None,
    help="The global Thanos Query over every cluster's stores: /v1/clusters then says, per cluster, "
    "whether its metrics can be read (by each store's `cluster` external label).",
)
@click.option(
    "--open-reads/--token-reads",
    default=True,
    show_default=True,
    help="Answer without a token (the operators' network), or only to a token with scope `read` "
    f"({TOKENS_PREFIX}_TOKENS='token=read' or {TOKENS_PREFIX}_TOKENS_FILE).",
)
@web_config_option
def serve(
    clusters_file: Path,
    listen: str,
    timeout: str,
    poll_interval: str,
    thanos_url: str | None,
    open_reads: bool,
    web_config_file: str | None = None,
) -> None:
    """Serve /v1/clusters, /v1/nodes, /v1/nodes/<node> and /v1/jobs/<job>/faults over every cluster of
    the clusters file, each answer listing the clusters that did not answer under `missing`. Reads only:
    drains and resumes stay with each cluster's health service.

    \b
    Examples:
      fleetsight fleet serve --clusters-file /etc/fleetsight/fleet/clusters.yml --listen 0.0.0.0:9450
      curl -s http://127.0.0.1:9450/v1/nodes/gpu-a017       # which cluster has it, and its state
    """
    setup_logging()
    clusters = _clusters(clusters_file)
    timeout_s, poll_s = _seconds(timeout, "--timeout"), _seconds(poll_interval, "--poll-interval")
    try:
        tokens = auth.load_tokens(TOKENS_PREFIX, (auth.READ,))
    except auth.TokenError as exc:
        raise click.ClickException(str(exc)) from None
    if not open_reads and not tokens:
        raise click.UsageError(
            f"--token-reads needs at least one token with scope `read` ({TOKENS_PREFIX}_TOKENS)"
        )
    host, port = listen_address(listen)
    tls = uvicorn_tls(web_config_file)
    from .api import create_app  # late: FastAPI only for the service, not for `fleet check`

    if thanos_url is not None and not thanos_url.startswith(("http://", "https://")):
        raise click.BadParameter(
            f"{thanos_url!r}: want Thanos Query's http(s) URL", param_hint="--thanos-url"
        )
    app = create_app(FanOut(clusters, timeout_s), auth.TokenGuard(tokens, open_reads), poll_s, thanos_url)
    log.info("event=listening address=%s:%d clusters=%s", host, port, ",".join(c.name for c in clusters))
    run_server(app, host, port, tls, limit_concurrency=MAX_CONCURRENT_REQUESTS)


@cli.command("check")
@clusters_file_option
@timeout_option
def check(clusters_file: Path, timeout: str) -> None:
    """Read the clusters file and ask each cluster's health service for its status: one line per
    cluster (answers, in how long, its name as the service says it). Exits 1 if any cluster is missing.

    \b
    Example:
      fleetsight fleet check --clusters-file /etc/fleetsight/fleet/clusters.yml
    """
    clusters = _clusters(clusters_file)
    fanout = FanOut(clusters, _seconds(timeout, "--timeout"))

    async def ask() -> list:
        try:
            return await fanout.get("/v1/status")
        finally:
            await fanout.close()

    replies = asyncio.run(ask())
    for reply in replies:
        verdict = (
            "missing: " + reply.why_missing()
            if reply.missing
            else f"answers as {reply.body.get('cluster')!r}"
        )
        click.echo(f"{reply.cluster:<24} {reply.seconds * 1000:7.0f} ms  {verdict}")
    sys.exit(1 if any(r.missing for r in replies) else 0)
