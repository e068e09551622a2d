"""Finds the components of the stack: every top-level folder holding a ``component.py``.

A component joins FleetSight by its folder alone. Its ``component.py`` may declare, at module level:

- ``COMPONENTS``: the supervised processes it adds to ``fleetsight up``
  (:class:`~fleetsight.components.Component`);
- ``PORTS``: port name -> offset from the port base (``FLEETSIGHT_PORT_BASE``), looked up by name through
  :meth:`fleetsight.settings.Settings.port`;
- ``CLI``: command name -> (module, one-line help); the module (absolute, or relative to the component's
  package: ``".cli"``) holds a click command or group named ``cli``;
- ``INSTALL_STEPS``: what ``fleetsight setup`` installs for it (:class:`~fleetsight.setup.InstallStep`);
- ``START_PRIORITY``: lower starts first (default 50); Prometheus starts last so that its first service
  discovery finds the targets of the others.

Folders are found under the repository root and under each directory of ``FLEETSIGHT_COMPONENT_PATH``
(``os.pathsep``-separated; a site's own components, or a test's). Nothing in the core names a component.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PRIORITY = 50
# Offsets owned by the core itself (none today); components declare theirs.
CORE_PORTS: dict[str, int] = {}


class RegistryError(RuntimeError):
    """Two components declare the same name, port or offset, or a declaration is malformed."""


@dataclass(frozen=True)
class CliEntry:
    name: str
    module: str
    help: str
    owner: str


def search_roots() -> list[Path]:
    extra = [
        Path(p).expanduser().resolve()
        for p in os.environ.get("FLEETSIGHT_COMPONENT_PATH", "").split(os.pathsep)
        if p
    ]
    return [REPO_ROOT, *extra]


def _component_folders(root: Path) -> Iterator[Path]:
    if not root.is_dir():
        return
    # In a checkout every folder may be a component; installed (site-packages), only FleetSight's own
    # (the wheel installs each component folder as fleetsight_<folder>).
    installed = root == REPO_ROOT and not (root / "pyproject.toml").exists()
    for folder in sorted(root.iterdir()):
        if folder.name.startswith((".", "_")) or not folder.is_dir():
            continue
        if installed and not folder.name.startswith("fleetsight_"):
            continue
        if (folder / "component.py").is_file() and folder.name.isidentifier():
            yield folder


# Component folders whose component.py failed to import: folder -> why (see :func:`broken`).
_BROKEN: dict[str, str] = {}


@functools.cache
def _modules_for(roots: tuple[Path, ...]) -> tuple[ModuleType, ...]:
    modules = []
    seen: dict[str, Path] = {}
    for root in roots:
        for folder in _component_folders(root):
            if folder.name in seen:
                raise RegistryError(
                    f"component folder {folder.name!r} found twice: {seen[folder.name]} and {folder}"
                )
            seen[folder.name] = folder
            if str(root) not in sys.path:
                sys.path.append(str(root))
            module = _import_declaration(folder)
            if module is not None:
                modules.append(module)
    return tuple(sorted(modules, key=lambda m: (getattr(m, "START_PRIORITY", DEFAULT_PRIORITY), m.__name__)))


def _import_declaration(folder: Path) -> ModuleType | None:
    """The folder's ``component.py``, or None when it does not import: one broken component (a site's
    own, a missing dependency) must not take `fleetsight down` or the other components with it. It is
    said on stderr (once a process), :func:`broken` lists it, and `fleetsight up` names it when asked for
    a component it does not know."""
    try:
        return importlib.import_module(f"{folder.name}.component")
    except Exception as exc:  # any error in someone else's declaration: report it, keep the rest
        _BROKEN[folder.name] = f"{type(exc).__name__}: {exc}"
        print(
            f"fleetsight: component {folder.name!r} skipped: {folder / 'component.py'} does not import "
            f"({_BROKEN[folder.name]})",
            file=sys.stderr,
        )
        return None


def broken() -> dict[str, str]:
    """Component folders skipped because their ``component.py`` does not import: folder -> why."""
    component_modules()
    return dict(_BROKEN)


def component_modules() -> tuple[ModuleType, ...]:
    """Every component declaration module, in start order (priority, then folder name)."""
    return _modules_for(tuple(search_roots()))


def owner(module: ModuleType) -> str:
    return module.__name__.removesuffix(".component")


def port_offsets() -> dict[str, int]:
    """Port name -> offset, from every component's ``PORTS``; names and offsets must be unique."""
    offsets = dict(CORE_PORTS)
    owners = {name: "core" for name in CORE_PORTS}
    for module in component_modules():
        for name, offset in getattr(module, "PORTS", {}).items():
            if name in offsets:
                raise RegistryError(f"port {name!r} declared by both {owners[name]} and {owner(module)}")
            clash = [n for n, o in offsets.items() if o == offset]
            if clash:
                raise RegistryError(
                    f"port offset {offset} of {owner(module)}'s {name!r} "
                    f"is already {owners[clash[0]]}'s {clash[0]!r}"
                )
            offsets[name] = offset
            owners[name] = owner(module)
    return offsets


def cli_entries() -> dict[str, CliEntry]:
    """Command name -> where it lives, from every component's ``CLI``."""
    entries: dict[str, CliEntry] = {}
    for module in component_modules():
        for name, (target, summary) in getattr(module, "CLI", {}).items():
            if target.startswith("."):  # relative to the component's package, whatever it is installed as
                target = f"{module.__package__}{target}"
            if name in entries:
                raise RegistryError(
                    f"command {name!r} declared by both {entries[name].owner} and {owner(module)}"
                )
            entries[name] = CliEntry(name, target, summary, owner(module))
    return entries


def declared(attribute: str) -> list[Any]:
    """The concatenation of one list attribute (``COMPONENTS``, ``INSTALL_STEPS``) over all components."""
    items: list[Any] = []
    for module in component_modules():
        items.extend(getattr(module, attribute, []))
    return items


def reset() -> None:
    """Forget what was found (tests that add a component folder at run time)."""
    _modules_for.cache_clear()
    _BROKEN.clear()
