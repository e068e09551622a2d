"""`fleetsight gameday`: break FleetSight's own processes while the twin cluster has faults, then judge
what was lost or wrongly done (evaluation/gameday.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from fleetsight.settings import Settings
from health.policy import DEFAULT_POLICY, PolicyError, parse_duration
from health.policy import load as load_policy
from twin.scenario import ScenarioError
from twin.scenario import load as load_scenario

from . import gameday_chaos as chaos
from .gameday import GameDayOptions, run_gameday
from .gameday_verdict import ALERT_ALLOWANCE_S, markdown

SCENARIOS = Path(__file__).parent / "scenarios" / "gameday"
DEFAULT_SCENARIO = SCENARIOS / "gameday_hour.yaml"
PORT_OFFSET = 3000  # away from `make up`'s stack, which may be running beside it


def _seconds(text: str, option: str) -> float:
    try:
        return parse_duration(text, option)
    except PolicyError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from exc


def _kinds(text: str | None) -> tuple[str, ...]:
    if not text:
        return tuple(chaos.KINDS)
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in chaos.KINDS]
    if unknown:
        raise click.BadParameter(
            f"unknown component kind(s) {', '.join(unknown)}; known: {', '.join(chaos.KINDS)}",
            param_hint="--kinds",
        )
    return kinds


@click.command("gameday")
@click.option(
    "--scenario",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=DEFAULT_SCENARIO,
    show_default=True,
    help="Twin scenario with hardware faults, played in real time; it must last the game day and its settle.",
)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Folder for the run directory, history.jsonl, report.json and report.md.")  # fmt: skip
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the disruption schedule.")
@click.option("--duration", default="1h", show_default=True, help="How long the disruptions go on.")
@click.option("--mean-gap", default="90s", show_default=True, help="Mean time between two disruptions.")
@click.option(
    "--settle", default="5m", show_default=True, help="Watch on this long after the last disruption."
)
@click.option(
    "--alert-allowance",
    default=f"{ALERT_ALLOWANCE_S:.0f}s",
    show_default=True,
    help="A fault's alert is due when its onset is at least this long before the end of the watch.",
)
@click.option(
    "--kinds", default=None, help=f"Component kinds to disrupt (default all: {', '.join(chaos.KINDS)})."
)
@click.option("--policy", "policy_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=DEFAULT_POLICY, show_default=True, help="The health service's policy.")  # fmt: skip
@click.option("--port-base", type=int, default=None,
              help=f"The stack's port base (default: the environment's + {PORT_OFFSET}).")  # fmt: skip
@click.option("--plan-only", is_flag=True, help="Print the disruption schedule and exit; start nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON instead of tables.")
def cli(
    scenario: Path,
    out: Path,
    seed: int,
    duration: str,
    mean_gap: str,
    settle: str,
    alert_allowance: str,
    kinds: str | None,
    policy_path: Path,
    port_base: int | None,
    plan_only: bool,
    as_json: bool,
) -> None:
    """Run a game day on a stack of its own: the twin plays SCENARIO's hardware faults while each
    Prometheus, Alertmanager, Thanos sidecar and Query, Kafka, OpenSearch, the rsyslog node side and
    shipper, the node agents, the fabric exporter, the health leader or follower and their Lease server,
    the anomaly and checks services are killed (SIGKILL), restarted (SIGTERM) or paused (SIGSTOP, then
    SIGCONT), and health-a's links to Prometheus and Alertmanager cut or slowed, on a seeded
    schedule; the stack's supervisor restarts what exits, as under `fleetsight up`.

    Then it judges the history and prints the invariants (alerts delivered, log lines lost and
    duplicated, nodes drained without a fault, faults never acted on, components that never came back),
    each fault's journey (rule, Slack, health) and the recovery time per component kind. Exits 1 when an
    invariant is broken.

    \b
    Examples:
      fleetsight gameday --out /tmp/gd --plan-only
      fleetsight gameday --out /tmp/gd                       # one hour, seed 1
      fleetsight gameday --out /tmp/gd2 --seed 7 --duration 10m --mean-gap 30s --settle 3m
    """
    options = GameDayOptions(
        scenario=scenario,
        folder=out,
        seed=seed,
        duration_s=_seconds(duration, "--duration"),
        mean_gap_s=_seconds(mean_gap, "--mean-gap"),
        settle_s=_seconds(settle, "--settle"),
        policy=policy_path,
        port_base=port_base if port_base is not None else Settings().port_base + PORT_OFFSET,
        alert_allowance_s=_seconds(alert_allowance, "--alert-allowance"),
        kinds=_kinds(kinds),
    )
    _check_inputs(options)
    plan = chaos.plan(
        options.seed, options.duration_s, options.mean_gap_s, {k: chaos.KINDS[k] for k in options.kinds}
    )
    if plan_only:
        for disruption in plan:
            click.echo(disruption.describe())
        click.echo(f"{len(plan)} disruptions across {len({d.kind for d in plan})} component kinds")
        return
    result = run_gameday(options, progress=lambda message: click.echo(message, err=True))
    report = result.to_json()
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    table = markdown(result.verdict, result.ledger)
    (out / "report.md").write_text(table + "\n")
    click.echo(json.dumps(report, indent=1) if as_json else table)
    if not result.verdict.holds:
        sys.exit(1)


def _check_inputs(options: GameDayOptions) -> None:
    """Refuse, before anything starts, a policy that does not load or a scenario too short to last."""
    try:
        load_policy(options.policy)
    except PolicyError as exc:
        raise click.BadParameter(str(exc), param_hint="--policy") from exc
    try:
        scenario = load_scenario(options.scenario)
    except ScenarioError as exc:
        raise click.BadParameter(str(exc), param_hint="--scenario") from exc
    needed = options.duration_s + options.settle_s
    if scenario.duration < needed:
        raise click.BadParameter(
            f"{options.scenario} lasts {scenario.duration:.0f} s, less than the game day and its settle "
            f"({needed:.0f} s): the twin would stop before the watch ends",
            param_hint="--scenario",
        )
