"""Scenario resolution for every evaluation command: a file, or a name found in the twin's shipped
scenarios or the evaluation sets here (one resolver: twin.scenario.resolve)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import yaml

from twin.scenario import SHIPPED_DIR, Scenario, ScenarioError, load
from twin.scenario import resolve as resolve_in

F = TypeVar("F", bound=Callable[..., Any])
HERE = Path(__file__).resolve().parent
# Where a scenario name is looked up, first match wins.
SEARCH = (
    SHIPPED_DIR,
    HERE / "scenarios" / "alerts",
    HERE / "scenarios" / "anomaly",
    HERE / "scenarios" / "precursors",
)


def resolve(value: str | Path) -> Path:
    """The scenario file for a path or a name; ScenarioError (a ValueError) names what was searched."""
    return resolve_in(value, SEARCH)


def resolve_or_fail(value: str) -> Path:
    try:
        return resolve(value)
    except ScenarioError as exc:
        raise click.BadParameter(str(exc), param_hint="--scenario") from None


def load_or_fail(value: str) -> Scenario:
    """The scenario, or one line naming the file, key and reason."""
    try:
        return load(resolve_or_fail(value))
    except ScenarioError as exc:
        raise click.ClickException(f"{value}: {exc}") from exc


def write_drawn(folder: Path, prefix: str, seeds: range, draw: Callable[[int], dict], width: int) -> None:
    """Write ``<prefix>_<seed>.yaml`` for each seed from ``draw(seed)`` (bench/anomaly_scenarios.py,
    bench/benign_days.py), printing each path."""
    folder.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        path = folder / f"{prefix}_{seed}.yaml"
        path.write_text(yaml.safe_dump(draw(seed), sort_keys=False, width=width))
        print(path)


# The options every evaluation command shares, declared once (same names, meanings and defaults).
SCENARIO_HELP = "Scenario file, or a name in twin/scenarios or evaluation/scenarios/*"


def scenarios_option(dest: str = "scenarios") -> Callable[[F], F]:
    """--scenario, repeatable and required: the scenarios to score."""
    return click.option(
        "--scenario", dest, multiple=True, required=True, help=f"{SCENARIO_HELP} (repeatable)."
    )


def scenario_option(default: str | None = None, dest: str = "scenario") -> Callable[[F], F]:
    """--scenario, one: required unless it has a default."""
    return click.option(
        "--scenario", dest, default=default, required=default is None, show_default=True, help=SCENARIO_HELP
    )


def duration_option(default: str | None = None) -> Callable[[F], F]:
    return click.option(
        "--duration",
        default=default,
        show_default=True,
        help="Only the scenario's first part (90s, 30m, 2h)" + ("." if default else "; default: all of it."),
    )


def agent_step_option() -> Callable[[F], F]:
    return click.option(
        "--agent-step",
        default="30s",
        show_default=True,
        help="Scrape interval of the node agents and the fabric exporter in the history (a tick multiple; "
        "coarser: faster).",
    )
