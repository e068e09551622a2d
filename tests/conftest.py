"""Fixtures shared by all tests: an isolated stack (own run folder and port range) per test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import StackEnv, free_port_base


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
