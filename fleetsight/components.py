"""Declarations of the components the local stack runner starts.

A component says how to tell whether it is installed, how to prepare its configuration in the run
folder, the command that starts it, how to tell that it is ready, what it depends on and which URLs
it serves. Each component folder declares its own in its ``component.py`` (``COMPONENTS``), and
:mod:`fleetsight.registry` finds them: a new component joins the stack by its folder alone.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from fleetsight import registry
from fleetsight.settings import Settings


@dataclass(frozen=True)
class Component:
    """One supervised process of the local stack."""

    name: str
    description: str
    command: Callable[[Settings], list[str]]
    ready: Callable[[Settings], bool]
    urls: Callable[[Settings], dict[str, str]] = lambda s: {}
    missing: Callable[[Settings], str | None] = lambda s: None
    """Returns why the component cannot run (e.g. a binary is not installed), or None."""
    prepare: Callable[[Settings], None] = lambda s: None
    """Writes configuration into the run folder before each start."""
    depends_on: tuple[str, ...] = ()
    env: Callable[[Settings], dict[str, str]] = lambda s: {}
    scrape_configs: Callable[[Settings], list[dict[str, Any]]] = lambda s: []
    """Prometheus scrape_configs this component wants; Prometheus gathers them from every component."""
    ready_timeout_s: float = 60.0
    stop_timeout_s: float = 10.0
    """Seconds between SIGTERM and SIGKILL (of its process group) when it is stopped: longer for a
    component whose clean shutdown can take longer (a kill can lose what it had not yet saved)."""
    default: bool = True
    """Whether ``fleetsight up`` starts it when no component is named."""
    extra: dict[str, Any] = field(default_factory=dict)


def fleetsight_command(*args: str) -> list[str]:
    """The command line of a `fleetsight ...` sub-command run by this Python (the stack's processes,
    the evaluation's stacks): the same interpreter and environment as the caller, no PATH lookup."""
    return [sys.executable, "-m", "fleetsight.cli", *args]


def load_components() -> dict[str, Component]:
    """All declared components, by name, in start order (see :mod:`fleetsight.registry`)."""
    found: dict[str, Component] = {}
    for component in registry.declared("COMPONENTS"):
        if component.name in found:
            raise ValueError(f"component {component.name!r} is declared twice")
        found[component.name] = component
    return found


def resolve_order(components: dict[str, Component], wanted: list[str]) -> list[Component]:
    """The wanted components and everything they depend on, dependencies first."""
    order: list[Component] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if any(c.name == name for c in order):
            return
        if name not in components:
            known = ", ".join(components)
            skipped = "".join(f"; skipped, {folder}: {why}" for folder, why in registry.broken().items())
            raise KeyError(f"unknown component {name!r} (known: {known}{skipped})")
        if name in visiting:
            raise ValueError(f"dependency cycle through {name!r}")
        visiting.add(name)
        for dependency in components[name].depends_on:
            visit(dependency)
        visiting.discard(name)
        order.append(components[name])

    for name in wanted:
        visit(name)
    return order


# Helpers that declarations share.


def scrape_own_port(
    job_name: str, port_name: str, interval: str = "15s"
) -> Callable[[Settings], list[dict[str, Any]]]:
    """The scrape_configs of a service that serves its own /metrics on its declared port."""

    def scrape_configs(settings: Settings) -> list[dict[str, Any]]:
        targets = [f"{settings.host}:{settings.port(port_name)}"]
        return [{"job_name": job_name, "scrape_interval": interval, "static_configs": [{"targets": targets}]}]

    return scrape_configs


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """True when GET url answers 2xx."""
    try:
        return httpx.get(url, timeout=timeout).is_success
    except httpx.HTTPError:
        return False


def missing_binary(*names: str) -> str | None:
    """Why a component cannot run when one of its binaries is not on PATH, else None."""
    absent = [n for n in names if shutil.which(n) is None]
    if absent:
        return f"not installed: {', '.join(absent)} (run `fleetsight setup`)"
    return None
