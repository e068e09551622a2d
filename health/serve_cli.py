"""`fleetsight health serve`: the health service's command line, from options to a running service (its
sources, state directory lock, tokens, leader election and the API server).

A module of its own: the serve command is the service's whole start-up and carries most of the
options; the other `fleetsight health` commands are clients of a running service (health/cli.py).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from fleetsight.logs import setup_logging
from fleetsight.secrets import read_secret_file
from fleetsight.settings import Settings
from fleetsight.webconfig import listen_address, run_server, uvicorn_tls, web_config_option

from . import statelock
from .cli_common import CONTEXT
from .policy import DEFAULT_POLICY, PolicyError, load

if TYPE_CHECKING:
    from .service import HealthService


@click.command(context_settings=CONTEXT)
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
@click.option(
    "--cluster",
    envvar="FLEETSIGHT_CLUSTER",
    default="",
    help="The cluster's name (as Prometheus's external label `cluster`): in every answer, metric and the "
    "breaker alert.",
)
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
    "--leader-election-kubeconfig",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The kubeconfig to reach the Lease with (default: $KUBECONFIG, else the pod's ServiceAccount); "
    "the local stack's pair uses health-lease's (health/component.py election_args).",
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
    leader_election_kubeconfig: Path | None = None,
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
    from .api import create_app, load_tokens
    from .discovery import parse_ports
    from .service import HealthService
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
    host, port = listen_address(listen or f"127.0.0.1:{settings.port('health')}")
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
        lease = LeaseOptions(
            leader_election_namespace,
            leader_election_name,
            leader_election_identity,
            leader_election_kubeconfig,
        )
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
        run_server(create_app(service), host, port, tls)  # no limit: the scheduler must not get 503
    finally:
        service.stop()


@dataclasses.dataclass
class LeaseOptions:
    namespace: str | None
    name: str | None
    identity: str | None
    kubeconfig: Path | None = None


def elect(service: HealthService, lease: LeaseOptions, url: str) -> None:
    """Join the Lease (health/leader.py): the service writes only while it holds it."""
    from .kubernetes import KubernetesError, connect
    from .leader import LeaderElector, LeaseConfig

    if not (lease.namespace and lease.name):
        raise click.UsageError("--leader-election-namespace and --leader-election-name go together")
    try:
        api = connect(lease.kubeconfig)
    except (KubernetesError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    identity = lease.identity or socket.gethostname()
    service.elector = LeaderElector(api, LeaseConfig(lease.namespace, lease.name, identity, url))
    service.engine.replica = identity  # every decision names the replica that made it
    service.elector.start()


def nodes_from_file(path: Path | None) -> Iterable[str]:
    if path is None:
        return []
    return [
        line.split("#")[0].strip() for line in path.read_text().splitlines() if line.split("#")[0].strip()
    ]
