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
    run_dir = tmp_path / "run"
    base = free_port_base()
    env = {
        **os.environ,
        "FLEETSIGHT_RUN_DIR": str(run_dir),
        "FLEETSIGHT_PORT_BASE": str(base),
        "COLUMNS": "200",  # rich tables: keep URLs on one line
    }
    stack = StackEnv(run_dir, base, env)
    yield stack
    stack.cli("down", "--timeout", "20", check=False)
