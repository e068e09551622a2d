"""`fleetsight health ...`: the health service, its scheduler integrations and a loopback Slurm."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import click
import httpx

from fleetsight.logs import setup_logging
from fleetsight.secrets import read_secret_file
from fleetsight.settings import Settings
from fleetsight.webconfig import uvicorn_tls, web_config_option

from . import prolog, statelock, sync
from .policy import DEFAULT_POLICY, PolicyError, load

CONTEXT = {"help_option_names": ["-h", "--help"]}


def default_url() -> str:
    return Settings().url("health")


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


@cli.command(context_settings=CONTEXT)
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_POLICY,
    show_default=True,
    help="Policy YAML file.",
)
@click.option("--listen", default=None, help="HOST:PORT (default: the stack's `health` port).")
@click.option(
    "--alertmanager-url",
    envvar="FLEETSIGHT_ALERTMANAGER_URL",
    help="Alertmanager (API v2); an HA pair comma-separated: alerts are read from each (once each), and "
    "the health state holds while one of them answers.",
)
@click.option(
    "--prometheus-url", envvar="FLEETSIGHT_PROMETHEUS_URL", help="Prometheus (up, stragglers, ALERTS)."
)
@click.option("--anomaly-url", envvar="FLEETSIGHT_ANOMALY_URL", help="Anomaly service (GET /v1/stragglers).")
@click.option(
    "--scheduler-url",
    envvar="FLEETSIGHT_SCHEDULER_URL",
    help="slurmrestd base URL (http://slurmrestd:6820: the newest API version it offers, found in its "
    "OpenAPI document) or a versioned one to pin it (http://slurmrestd:6820/slurm/v0.0.38).",
)
@click.option(
    "--scheduler-socket", type=click.Path(dir_okay=False), help="slurmrestd UNIX socket (rest_auth/local)."
)
@click.option(
    "--nodes-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Extra node names, one per line (nodes no source lists yet).",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where overrides, drains and failure history persist (default: run/data/health).",
)
@click.option("--cluster", default="", help="Cluster name for metrics and the breaker alert.")
@click.option(
    "--events-token-file",
    envvar="FLEETSIGHT_HEALTH_EVENTS_TOKEN_FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A file holding one bearer token with scope `events` (POST /v1/events/...): the same secret "
    "Alertmanager's webhook http_config.authorization.credentials_file names.",
)
@click.option(
    "--kubernetes-nodes",
    is_flag=True,
    help="Take the inventory from the Kubernetes Nodes API too ($KUBECONFIG or the pod's ServiceAccount).",
)
@click.option(
    "--leader-election-namespace",
    envvar="FLEETSIGHT_HEALTH_LEADER_NAMESPACE",
    help="With --leader-election-name: two replicas, one writer, on a coordination.k8s.io Lease in this "
    "namespace ($KUBECONFIG or the pod's ServiceAccount). Off by default (bare metal: docs/health.md).",
)
@click.option("--leader-election-name", envvar="FLEETSIGHT_HEALTH_LEADER_NAME", help="The Lease's name.")
@click.option(
    "--leader-election-identity",
    envvar="POD_NAME",
    help="holderIdentity (default: $POD_NAME, else the host name).",
)
@click.option(
    "--leader-election-url",
    envvar="FLEETSIGHT_HEALTH_ADVERTISE_URL",
    help="Where the other replica reaches this one (default: http://$POD_IP:PORT).",
)
@click.option(
    "--breaker-alert/--no-breaker-alert",
    default=True,
    show_default=True,
    help="Post HealthCircuitBreakerOpen to the Alertmanager when the breaker holds.",
)
@click.option(
    "--discovery-port",
    "discovery_ports",
    multiple=True,
    metavar="JOB=PORT",
    help="Serve GET /v1/targets/JOB (Prometheus http_sd, one target per scheduler node) on PORT; "
    "repeatable, over the defaults dcgm=9400 fleetsight-node=9401 node=9100.",
)
@web_config_option
def serve(
    policy_path: Path,
    listen: str | None,
    alertmanager_url: str | None,
    prometheus_url: str | None,
    anomaly_url: str | None,
    scheduler_url: str | None,
    scheduler_socket: str | None,
    nodes_file: Path | None,
    state_dir: Path | None,
    cluster: str,
    events_token_file: Path | None,
    breaker_alert: bool,
    discovery_ports: tuple[str, ...],
    kubernetes_nodes: bool = False,
    web_config_file: str | None = None,
    leader_election_namespace: str | None = None,
    leader_election_name: str | None = None,
    leader_election_identity: str | None = None,
    leader_election_url: str | None = None,
) -> None:
    """Run the health service: refresh from the sources in the background, answer the REST API.

    Tokens for writes: FLEETSIGHT_HEALTH_TOKENS="token=read,drain;other=read" or a file named by
    FLEETSIGHT_HEALTH_TOKENS_FILE (one "token scope,scope" per line). OpenAPI docs at /docs.

    \b
    Examples:
      fleetsight health serve --prometheus-url http://127.0.0.1:19090 --alertmanager-url http://127.0.0.1:19093
      fleetsight health serve --listen 0.0.0.0:8080 --scheduler-url http://slurm:6820
      FLEETSIGHT_HEALTH_TOKENS="s3cret=read,drain" fleetsight health serve --policy my-policy.yml
      fleetsight health serve --scheduler-url http://slurm:6820/slurm/v0.0.38 --discovery-port dcgm=9500
          (then Prometheus: http_sd_configs: [{url: http://HOST:9441/v1/targets/dcgm}])
      fleetsight health serve --listen 0.0.0.0:9441 --web.config.file /etc/fleetsight/web-config.yml
    """
    from .discovery import parse_ports
    from .service import HealthService, create_app, load_tokens, nodes_from_file, serve_app
    from .sources import Sources

    setup_logging()
    try:
        policy = load(policy_path)
        tokens = load_tokens(events_token_file=events_token_file)
        ports = parse_ports(discovery_ports)
    except (PolicyError, OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    tls = uvicorn_tls(web_config_file)
    settings = Settings()
    host, _, port = (listen or f"127.0.0.1:{settings.port('health')}").rpartition(":")
    source_class, source_extra = Sources, {}
    if kubernetes_nodes:
        from .kubernetes import KubernetesError, KubernetesSources, connect

        try:
            source_class, source_extra = KubernetesSources, {"api": connect(None)}
        except KubernetesError as exc:
            raise click.ClickException(str(exc)) from exc
    sources = source_class(
        policy,
        alertmanager_url,
        prometheus_url,
        anomaly_url,
        scheduler_url,
        scheduler_token=os.environ.get("SLURM_JWT"),  # slurmrestd's rest_auth/jwt over TCP
        scheduler_socket=scheduler_socket,
        static_nodes=nodes_from_file(nodes_file),
        **source_extra,
    )
    state_dir = state_dir or settings.data_dir("health")
    try:
        writer_lock = statelock.hold(state_dir)  # noqa: F841 (held open for the process's life)
    except (statelock.StateLocked, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    service = HealthService(
        policy,
        sources,
        state_dir,
        tokens,
        cluster,
        breaker_alert_url=alertmanager_url if breaker_alert else None,
        discovery_ports=ports,
    )
    if leader_election_namespace or leader_election_name:
        lease = LeaseOptions(leader_election_namespace, leader_election_name, leader_election_identity)
        elect(service, lease, leader_election_url or f"http://{os.environ.get('POD_IP', host)}:{port}")
        # load_tokens read it already: a file that cannot serve has stopped the start-up there.
        service.peer_token = (
            read_secret_file(events_token_file, "--events-token-file") if events_token_file else None
        )
    service.start()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    logging.getLogger("health").info(
        "event=listening address=%s:%s tokens=%d tls=%s", host, port, len(tokens), bool(tls)
    )
    try:
        serve_app(create_app(service), host or "127.0.0.1", int(port), tls)
    finally:
        service.stop()


@dataclasses.dataclass
class LeaseOptions:
    namespace: str | None
    name: str | None
    identity: str | None


def elect(service: Any, lease: LeaseOptions, url: str) -> None:
    """Join the Lease (health/leader.py): the service writes only while it holds it."""
    from .kubernetes import KubernetesError, connect
    from .leader import LeaderElector, LeaseConfig

    if not (lease.namespace and lease.name):
        raise click.UsageError("--leader-election-namespace and --leader-election-name go together")
    try:
        api = connect(None)
    except KubernetesError as exc:
        raise click.ClickException(str(exc)) from exc
    identity = lease.identity or socket.gethostname()
    service.elector = LeaderElector(api, LeaseConfig(lease.namespace, lease.name, identity, url))
    service.elector.start()


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


from . import kubernetes_cli  # noqa: E402,F401  (registers `kubernetes-sync` on this group)
