"""`fleetsight health kubernetes-sync`: the health state onto the Nodes API (see health/kubernetes.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import click

from .cli_common import CONTEXT, default_url
from .kubernetes import KubePolicy, connect, load_kube_policy, sync_kubernetes
from .policy import DEFAULT_POLICY
from .sync import SyncError


def _round(url: str, policy: KubePolicy, kubeconfig: Path | None, dry_run: bool, as_json: bool) -> None:
    api = connect(kubeconfig)
    try:
        changes = sync_kubernetes(url, api, policy, dry_run, token=os.environ.get("FLEETSIGHT_HEALTH_TOKEN"))
    finally:
        api.close()
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, "changes": [c.as_dict() for c in changes]}))
        return
    prefix = "would " if dry_run else ""
    for change in changes:
        click.echo(f"{change.node}: {prefix}{', '.join(change.actions)}")
    if not changes:
        click.echo("nothing to change")


@click.command("kubernetes-sync", context_settings=CONTEXT)
@click.option("--url", default=None, help="Health service URL (default: the stack's).")
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=DEFAULT_POLICY,
    show_default=True,
    help="Policy YAML; its `kubernetes:` block (cordon, taint, no_execute_for) decides cordons and taints.",
)
@click.option(
    "--kubeconfig",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="kubeconfig with a token user (default: $KUBECONFIG, else the pod's ServiceAccount).",
)
@click.option("--dry-run", is_flag=True, help="Print what it would do; change nothing.")
@click.option("--interval", type=float, default=0, help="Repeat every N seconds (0: once).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per round.")
def kubernetes_sync(
    url: str | None, policy_path: Path, kubeconfig: Path | None, dry_run: bool, interval: float, as_json: bool
) -> None:
    """Apply the health state to Kubernetes nodes: condition FleetSightGPUHealthy, label
    fleetsight.io/health, and for drained nodes a cordon and the taint fleetsight.io/unhealthy (NoSchedule;
    NoExecute only where the policy's kubernetes.no_execute_for names the effect of one of the node's
    reasons, e.g. repair). Only what FleetSight set (annotations fleetsight.io/cordoned,
    fleetsight.io/taints) is ever undone: an operator's cordon stays.

    \b
    Examples:
      fleetsight health kubernetes-sync --dry-run
      fleetsight health kubernetes-sync --url http://fleetsight-health:9441 --interval 15
      KUBECONFIG=~/.kube/config fleetsight health kubernetes-sync --json
    """
    try:
        policy = load_kube_policy(policy_path)
    except (ValueError, OSError) as exc:
        raise click.ClickException(f"{policy_path}: {exc}") from exc
    while True:
        try:
            _round(url or default_url(), policy, kubeconfig, dry_run, as_json)
        except SyncError as exc:
            if not interval:
                raise click.ClickException(str(exc)) from exc
            click.echo(f"error: {exc}", err=True)
        if not interval:
            return
        time.sleep(interval)
