"""`fleetsight health ...`: the health service, its scheduler integrations and a loopback Slurm.

The group and its client commands (the sync programs, preflight, nodes, slurm-local) are here; `serve`
is health/serve_cli.py and `kubernetes-sync` health/kubernetes_cli.py, added to the group below.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import click
import httpx

from fleetsight.settings import Settings

from . import prolog, sync
from .cli_common import CONTEXT, default_url
from .kubernetes_cli import kubernetes_sync
from .serve_cli import serve


@click.group(name="health", context_settings=CONTEXT)
def cli() -> None:
    """The node health service: one state per node for the scheduler, with reasons.

    \b
    Examples:
      fleetsight health serve --prometheus-url http://127.0.0.1:19090 --alertmanager-url http://127.0.0.1:19093
      fleetsight health nodes --state unhealthy
      fleetsight health slurm-sync --dry-run
      fleetsight health preflight n0001 n0002
    """


cli.add_command(serve)
cli.add_command(kubernetes_sync)


def _print_plan(plan: sync.Plan, dry_run: bool, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, **plan.as_dict()}))
        return
    prefix = "would run: " if dry_run else "ran: "
    for command in plan.as_dict()["commands"]:
        click.echo(prefix + command)
    for node, why in plan.skipped:
        click.echo(f"skipped {node}: {why}")
    if not plan.commands:
        click.echo("nothing to change")


def _run_sync(function, url: str | None, ledger: Path, dry_run: bool, interval: float, as_json: bool) -> None:  # type: ignore[no-untyped-def]
    """Once, or every ``interval`` seconds; in a loop an error is printed and the next round retried."""
    url = url or default_url()
    token = os.environ.get("FLEETSIGHT_HEALTH_TOKEN")  # only when reads need one
    while True:
        try:
            _print_plan(function(url, ledger, dry_run, 10.0, token), dry_run, as_json)
        except sync.SyncError as exc:
            if not interval:
                raise click.ClickException(str(exc)) from exc
            click.echo(f"error: {exc}", err=True)
        if not interval:
            return
        time.sleep(interval)


SYNC_OPTIONS = [
    click.option("--url", default=None, help="Health service URL (default: the stack's)."),
    click.option(
        "--ledger",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="File recording what this sync drained (default: run/data/health/).",
    ),
    click.option("--dry-run", is_flag=True, help="Print what it would do; change nothing."),
    click.option("--interval", type=float, default=0, help="Repeat every N seconds (0: once)."),
    click.option("--json", "as_json", is_flag=True, help="One JSON object per round."),
]


def _sync_options(function):  # type: ignore[no-untyped-def]
    for option in reversed(SYNC_OPTIONS):
        function = option(function)
    return function


@cli.command("slurm-sync", context_settings=CONTEXT)
@_sync_options
def slurm_sync(url: str | None, ledger: Path | None, dry_run: bool, interval: float, as_json: bool) -> None:
    """Drain in Slurm what the health service wants drained; resume only what this sync drained.

    Drains with `scontrol update nodename=N state=drain reason="fleetsight: <reason>"`; a node drained
    by an operator (any other reason) is never resumed and never re-labelled.

    \b
    Examples:
      fleetsight health slurm-sync --dry-run
      fleetsight health slurm-sync --url http://health:19141 --interval 30
    """
    ledger = ledger or Settings().data_dir("health") / "slurm-sync-ledger.json"
    _run_sync(sync.sync_slurm, url, ledger, dry_run, interval, as_json)


@cli.command("lsf-sync", context_settings=CONTEXT)
@_sync_options
def lsf_sync(url: str | None, ledger: Path | None, dry_run: bool, interval: float, as_json: bool) -> None:
    """Close in LSF (`badmin hclose -C`) what the health service wants drained; reopen (`badmin hopen`)
    only the hosts this sync closed.

    \b
    Examples:
      fleetsight health lsf-sync --dry-run
      fleetsight health lsf-sync --url http://health:19141 --interval 30
    """
    ledger = ledger or Settings().data_dir("health") / "lsf-sync-ledger.json"
    _run_sync(sync.sync_lsf, url, ledger, dry_run, interval, as_json)


@cli.command(context_settings=CONTEXT)
@click.argument("nodes", nargs=-1)
@click.option("--url", default=None, help="Health service URL (default: the stack's).")
@click.option("--timeout", type=float, default=3.0, show_default=True)
@click.option(
    "--fail",
    type=click.Choice(["open", "closed"]),
    default="open",
    show_default=True,
    help="Exit status when the service does not answer: open 0, closed 2.",
)
def preflight(nodes: tuple[str, ...], url: str | None, timeout: float, fail: str) -> None:
    """Ask whether nodes are fit for a job now (what the prolog script does); exit 1 if any is not.

    The script itself, for slurm.conf Prolog/HealthCheckProgram or LSF pre-exec, is health/prolog.py
    (standard library only).

    \b
    Examples:
      fleetsight health preflight n0001 n0002
      fleetsight health preflight --fail closed --timeout 1 n0007
    """
    args = ["--url", url or default_url(), "--timeout", str(timeout), "--fail", fail, *nodes]
    sys.exit(prolog.main(args))


@cli.command(context_settings=CONTEXT)
@click.option("--url", default=None, help="Health service URL (default: the stack's).")
@click.option("--state", "states", multiple=True, help="Only nodes in this state (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="The API's JSON answer.")
def nodes(url: str | None, states: tuple[str, ...], as_json: bool) -> None:
    """List nodes with their state and first reason.

    \b
    Examples:
      fleetsight health nodes
      fleetsight health nodes --state unhealthy --state drained
    """
    try:
        response = httpx.get(f"{url or default_url()}/v1/nodes", params={"state": list(states)}, timeout=10)
    except httpx.HTTPError as exc:
        raise click.ClickException(f"health service unreachable: {exc}") from exc
    if response.status_code != 200:
        raise click.ClickException(f"{response.status_code}: {response.text}")
    body = response.json()
    if as_json:
        click.echo(json.dumps(body, indent=1))
        return
    for item in body["nodes"]:
        first = item["reasons"][0] if item["reasons"] else None
        why = f"{first['signal']} ({first['source']}, since {first['since']})" if first else ""
        click.echo(f"{item['node']:<16} {item['state']:<10} {why}")


@cli.command("slurm-local", context_settings=CONTEXT)
@click.option(
    "--dir",
    "folder",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Folder for the configuration, munge key, state and logs.",
)
@click.option(
    "--nodes", "node_list", required=True, help="Node names, comma-separated or a hostlist (n[0001-0016])."
)
@click.option(
    "--port", type=int, default=None, help="slurmctld port; slurmd ports follow (default: the stack's)."
)
def slurm_local(folder: Path, node_list: str, port: int | None) -> None:
    """Run a real Slurm on loopback (munged, slurmctld, one slurmd per node, slurmrestd) until Ctrl-C.

    Needs root (the daemons) and the Debian packages (`fleetsight setup`). Prints SLURM_CONF to export.

    \b
    Examples:
      fleetsight health slurm-local --dir /tmp/slurm --nodes 'n[0001-0016]'
      SLURM_CONF=/tmp/slurm/slurm.conf sinfo -R
    """
    from .slurm_local import LocalSlurm, missing
    from .sources import expand_hostlist

    why = missing()
    if why:
        raise click.ClickException(why)
    slurm = LocalSlurm(folder, expand_hostlist(node_list), port or Settings().port("slurmctld"))
    try:
        slurm.start()
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"export SLURM_CONF={slurm.conf}")
    click.echo(f"slurmrestd: --scheduler-url http://slurmrestd --scheduler-socket {slurm.rest_socket}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        slurm.stop()
