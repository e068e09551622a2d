"""`fleetsight checks scan-plan`: the scan plans as the checks service sees them (GET /v1/scans), one
line per node: last scan, due date, state and why it waits."""

from __future__ import annotations

import json
import time
from typing import Any

import click
import httpx

from . import runner

LIGHT_ENV = "FLEETSIGHT_CHECKS_URL"


def _when(stamp: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(stamp)) if stamp else "never"


def table(view: dict[str, Any], now: float, overdue_only: bool = False) -> str:
    """One scan's plan as text: a heading with its coverage, then the nodes, overdue first."""
    heading = (
        f"scan {view['scan']}: {view['check']} every {view['every_days']:g} days "
        f"(offered again after {view['rescan_after_days']:g}, {view['budget']} at once); "
        f"coverage {100 * view['coverage_ratio']:.1f} % ({view['covered']} of {view['nodes']} nodes), "
        f"{len(view['overdue'])} overdue"
    )
    rows = sorted(view["rows"], key=lambda r: (not r["overdue"], r["due"], r["node"]))
    columns = f"{'node':<16} {'last scan (UTC)':<17} {'outcome':<8} {'due (UTC)':<25} {'state':<12} why"
    lines = [heading, columns]
    for row in rows:
        if overdue_only and not row["overdue"]:
            continue
        due = _when(row["due"]) + (" OVERDUE" if row["overdue"] else "")
        lines.append(
            f"{row['node']:<16} {_when(row['last_completed']):<17} {row['outcome'] or '-':<8} {due:<25} "
            f"{row['state']:<12} {row['why']}"
        )
    return "\n".join(lines)


# the cycles' switch (slurm-cycle, kube-cycle)
scans_option = click.option(
    "--scans/--no-scans",
    default=True,
    show_default=True,
    help="Also run the scan plans of the checks service's policy (`scans:`; `fleetsight checks scan-plan`).",
)


@click.command("scan-plan")
@click.option("--checks-url", envvar=LIGHT_ENV, required=True, help="The checks service.")
@click.option("--scan", "only", default=None, help="One scan of checks/policy.yml `scans:` (default: all).")
@click.option("--overdue", is_flag=True, default=False, help="Only the nodes past their due date.")
@click.option("--json", "as_json", is_flag=True, default=False, help="GET /v1/scans's answer as it is.")
def scan_plan_command(checks_url: str, only: str | None, overdue: bool, as_json: bool) -> None:
    """Show each scan plan's coverage and, per node, its last completed scan, when it is due, and what
    it waits for (not_idle, leaf_busy, budget, scan_budget, drained, not_due, running, started, or a
    blind reason such as tool_missing: the last try could not run the tool, which counts neither as a
    scan nor against the node).

    The plan itself runs in `fleetsight checks slurm-cycle` / `kube-cycle` (each pass offers the
    longest-unscanned idle nodes after any validation work); the settings are in checks/policy.yml
    (`scans:`). Reads send FLEETSIGHT_CHECKS_TOKEN[_FILE] when set (`checks serve --token-reads`).

    \b
    Examples:
      fleetsight checks scan-plan --checks-url http://checks:9443
      fleetsight checks scan-plan --checks-url http://checks:9443 --scan memory --overdue
      FLEETSIGHT_CHECKS_URL=http://checks:9443 fleetsight checks scan-plan --json | jq '.scans[0].overdue'
    """
    try:
        token = runner.client_token()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.get(f"{checks_url.rstrip('/')}/v1/scans", headers=headers, timeout=10)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot read the scan plans from {checks_url}: {exc}") from None
    body = response.json()
    scans = [s for s in body["scans"] if only is None or s["scan"] == only]
    if only is not None and not scans:
        names = ", ".join(s["scan"] for s in body["scans"]) or "none configured"
        raise click.ClickException(f"no scan {only!r}; scans: {names}")
    if as_json:
        click.echo(json.dumps({**body, "scans": scans}, indent=1))
        return
    click.echo("\n\n".join(table(view, body["now"], overdue) for view in scans) or "no scan configured")
