"""The health service in the local stack: it reads the stack's Alertmanager pair and Prometheus (and the
twin's slurmrestd-style jobs endpoint), and Prometheus scrapes its ``fleetsight_node_health_state``.

Off by default, its two-replica form (docs/health.md, "The pair on the local stack"): `health-lease`
serves the Lease, `health` joins the election as health-a and `health-b` beside it; ``election_args`` is
the one place a replica's election options are built (this stack and the game day's)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from fleetsight.components import Component, fleetsight_command, http_ok, scrape_own_port
from fleetsight.settings import Settings
from fleetsight.setup import apt_step
from fleetsight.supervisor import runs_here

from . import lease_server


def serve_command(
    listen: str,
    state_dir: Path,
    *,
    policy: Path | None = None,
    cluster: str | None = None,
    alertmanagers: list[str] | None = None,
    prometheus: str | None = None,
    scheduler: str | None = None,
    events_token_file: Path | None = None,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """`fleetsight health serve` with the given sources: the one place its command line is built (the
    local stack, the evaluation's twin check, tests and benches)."""
    options = {
        "--policy": str(policy) if policy else None,
        "--listen": listen,
        "--alertmanager-url": ",".join(alertmanagers) if alertmanagers else None,
        "--prometheus-url": prometheus,
        "--scheduler-url": scheduler,
        "--state-dir": str(state_dir),
        "--cluster": cluster,
        "--events-token-file": str(events_token_file) if events_token_file else None,
    }
    flags = [item for key, value in options.items() if value for item in (key, value)]
    return fleetsight_command("health", "serve", *flags, *extra)


def command(settings: Settings) -> list[str]:
    """The stack's health service; inside a supervisor that also runs `health-b`, it joins the election
    as `health-a` (`fleetsight up health-b`), else it is the only writer, as it always was."""
    extra = election_args(settings, "health-a") if pair_wanted(settings) else ()
    return stack_command(settings, "health", "health", extra)


def stack_command(settings: Settings, port: str, state: str, extra: tuple[str, ...] = ()) -> list[str]:
    """A health replica on the stack's sources: port (a PORTS name) and state (its data dir) its own."""
    return serve_command(
        f"127.0.0.1:{settings.port(port)}",
        settings.data_dir(state),
        cluster=settings.cluster,
        alertmanagers=[settings.url("alertmanager"), settings.url("alertmanager_b")],
        prometheus=settings.url("prometheus"),
        scheduler=settings.url("twin", "/slurm/v0.0.40"),
        events_token_file=events_token_file(settings),
        extra=extra,
    )


def events_token_file(settings: Settings) -> Path:
    """The Alertmanager pair's webhook token (alerting/component.py writes it before either replica
    starts; FLEETSIGHT_ALERTMANAGER_SECRETS_DIR moves it as it moves every Alertmanager secret)."""
    folder = os.environ.get("FLEETSIGHT_ALERTMANAGER_SECRETS_DIR")
    return (
        Path(folder).expanduser() if folder else settings.config_dir("alertmanager")
    ) / "health_events_token"


# ---------------------------------------------------------------------------------- the pair
# Two replicas, one writer, on the local stack (docs/health.md, "The pair on the local stack"): the
# Lease served by `health-lease`, `health` as health-a and `health-b` beside it. Off by default.
PAIR = ("health-lease", "health", "health-b")


def lease_layout(settings: Settings) -> lease_server.Layout:
    return lease_server.Layout(settings.data_dir("health-lease"))


def lease_server_url(settings: Settings) -> str:
    return f"https://{settings.host}:{settings.port('health_lease')}"


def election_args(settings: Settings, identity: str, port: str | None = None) -> tuple[str, ...]:
    """The `fleetsight health serve` options that make a replica join the election on health-lease's
    Lease as ``identity``, advertising the URL its peer reaches it at: the port named ``port``, by
    default `health_b` for identity "health-b" and `health` for any other. For
    ``serve_command(..., extra=election_args(settings, "health-a"))``."""
    port = port or ("health_b" if identity == "health-b" else "health")
    return (
        "--leader-election-namespace", lease_server.NAMESPACE,
        "--leader-election-name", lease_server.LEASE,
        "--leader-election-identity", identity,
        "--leader-election-url", settings.url(port),
        "--leader-election-kubeconfig", str(lease_layout(settings).kubeconfig),
    )  # fmt: skip


def pair_wanted(settings: Settings) -> bool:
    """Whether the supervisor calling this runs `health-b` too (its state file lists the stack it runs,
    written before any component starts); never true outside a supervisor, nor where health-lease
    cannot run (the supervisor skips it and health-b: `health` then runs alone, as without the pair)."""
    return runs_here(settings, "health-b") and lease_server.missing(settings) is None


def paired_health(component: Component) -> Component:
    """The `health` component as health-a of the pair whatever stack runs it: its command with
    election_args(settings, "health-a"), started after health-lease."""
    base = component.command

    def paired(settings: Settings) -> list[str]:
        command = base(settings)
        return (
            command
            if "--leader-election-name" in command
            else [*command, *election_args(settings, "health-a")]
        )

    depends = tuple(dict.fromkeys([*component.depends_on, "health-lease"]))
    return dataclasses.replace(component, command=paired, depends_on=depends)


def lease_command(settings: Settings) -> list[str]:
    return fleetsight_command(
        "health-lease",
        "--folder", str(lease_layout(settings).folder),
        "--port", str(settings.port("health_lease")),
        "--etcd-port", str(settings.port("health_lease_etcd")),
        "--etcd-peer-port", str(settings.port("health_lease_etcd_peer")),
    )  # fmt: skip


def replica_b_command(settings: Settings) -> list[str]:
    return stack_command(settings, "health_b", "health-b", election_args(settings, "health-b"))


COMPONENTS = [
    Component(
        name="health",
        description="Health service: one state per node with reasons, REST API for Slurm/LSF",
        command=command,
        ready=lambda s: http_ok(s.url("health", "/-/ready")),
        urls=lambda s: {"api": s.url("health", "/v1/nodes"), "docs": s.url("health", "/docs")},
        scrape_configs=scrape_own_port("fleetsight-health", "health"),
        depends_on=("alertmanager", "alertmanager-b"),
        ready_timeout_s=30.0,
    ),
    Component(
        name="health-lease",
        description="The health pair's Lease: etcd and kube-apiserver on loopback (one process group)",
        command=lease_command,
        ready=lambda s: lease_server.ready(lease_layout(s), lease_server_url(s)),
        urls=lambda s: {"api": lease_server_url(s), "kubeconfig": str(lease_layout(s).kubeconfig)},
        missing=lease_server.missing,
        ready_timeout_s=180.0,  # kube-apiserver's start-up hooks on a loaded 2-core machine
        stop_timeout_s=30.0,  # it stops the API server, then etcd, each within 10 s
        default=False,
    ),
    Component(
        name="health-b",
        description="The health service's second replica: follows health-a, takes over when it dies",
        command=replica_b_command,
        ready=lambda s: http_ok(s.url("health_b", "/-/ready")),
        urls=lambda s: {"api": s.url("health_b", "/v1/nodes"), "status": s.url("health_b", "/v1/status")},
        scrape_configs=scrape_own_port("fleetsight-health", "health_b"),
        depends_on=("alertmanager", "alertmanager-b", "health-lease", "health"),
        ready_timeout_s=60.0,  # ready once it holds a copy of the leader's state
        default=False,
    ),
]

# health 141, the pair's second replica 145, its Lease's kube-apiserver 146 and etcd 147 (peer 148);
# `fleetsight health slurm-local`: slurmctld 160 (its slurmd take free ports; 161-169 are kept for more
# Slurm daemons).
PORTS = {
    "health": 141,
    "health_b": 145,
    "health_lease": 146,
    "health_lease_etcd": 147,
    "health_lease_etcd_peer": 148,
    "slurmctld": 160,
}
CLI = {
    "health": (".cli", "the node health service, Slurm/LSF sync and the prolog check"),
    "health-lease": (".lease_server", "the health pair's Lease on loopback: etcd and kube-apiserver"),
}
INSTALL_STEPS = [
    apt_step(
        "slurm",
        "Slurm 22.05 (slurmctld, slurmd, slurmrestd, client) and munge: the health tests run a real Slurm",
        "health",
        {
            "slurmctld": "slurmctld",
            "slurmd": "slurmd",
            "slurmrestd": "slurmrestd",
            "slurm-client": "scontrol",
            "munge": "munged",
        },
        eta="~40 s",
    )
]
START_PRIORITY = 60
