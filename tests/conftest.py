"""Fixtures shared by all tests: an isolated stack (own run folder and port range) per test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from _pytest.nodeid import coerce_node_id

from support import StackEnv, free_port_base

# Every stack the tests start (and every `fleetsight` they run) gives each component twice its time to get
# ready: two stacks starting at once on 2 cores made a Python service's imports take 58 s (9 s idle), and the
# anomaly service's 60 s ran out (suite of 2026-11-29, fleetsight/settings.py).
os.environ.setdefault("FLEETSIGHT_READY_PATIENCE", "2")


@pytest.fixture
def stack_env(tmp_path: Path) -> Iterator[StackEnv]:
    """An isolated stack (own run folder and ports); whatever it started is stopped afterwards."""
    yield from isolated_stack(tmp_path)


@pytest.fixture(scope="module")
def stack_env_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackEnv]:
    """The same, shared by the tests of one module (a stack costs seconds to start)."""
    yield from isolated_stack(tmp_path_factory.mktemp("stack"))


def isolated_stack(tmp_path: Path) -> Iterator[StackEnv]:
    run_dir = tmp_path / "run"
    base = free_port_base()
    env = {
        **os.environ,
        "FLEETSIGHT_RUN_DIR": str(run_dir),
        "FLEETSIGHT_PORT_BASE": str(base),
        "COLUMNS": "80",  # a narrow terminal: URLs must still come out whole
    }
    stack = StackEnv(run_dir, base, env)
    yield stack
    stack.cli("down", "--timeout", "20", check=False)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`make test` runs two workers, `--dist loadgroup`), keep together the tests
    that share a server: a module whose tests use a session fixture of a folder's conftest runs on the
    worker that started it, with every other such module of that folder; any other module is a group of
    its own, so that its module fixtures start once and its tests keep their order. Without xdist the
    groups change nothing."""
    groups: dict[str, str] = {}
    for item in items:
        module = module_of(item)
        groups[module] = min([groups.get(module, module), *shared_server_folders(item)])
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[module_of(item)]))
        if config.getoption("loadgroup", default=False) and "@" not in item.nodeid:
            # xdist 3.8 names the group in the test id (``id@group``, which its scheduler splits) by
            # setting ``item._nodeid``; pytest 9 keeps the id in ``item._id`` and ignores that, so every
            # test would be a group of its own. tests/test_parallel.py fails if grouping breaks again.
            item._id = coerce_node_id(f"{item.nodeid}@{groups[module_of(item)]}")


def module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def shared_server_folders(item: pytest.Item) -> list[str]:
    """Where the session fixtures that the test uses are defined (a conftest's folder, or a module)."""
    info = getattr(item, "_fixtureinfo", None)
    return [
        definitions[-1].baseid
        for definitions in (info.name2fixturedefs.values() if info else ())
        if definitions and definitions[-1].scope == "session" and definitions[-1].baseid
    ]
