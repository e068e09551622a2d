"""Helpers every test may import (``from support import ...``): polling with a deadline (never sleeps
as synchronisation), free loopback ports, the CLI as a subprocess."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from fleetsight.registry import port_offsets
from fleetsight.settings import REPO_ROOT

T = TypeVar("T")
FLEETSIGHT = [sys.executable, "-m", "fleetsight.cli"]


def wait_until(predicate: Callable[[], T], timeout: float = 60.0, interval: float = 0.2, what: str = "") -> T:
    """Poll predicate until it returns something truthy; fail the test with `what` after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what or predicate}")
        time.sleep(interval)


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_base() -> int:
    """A port base whose component ports (base + each offset) are all free on loopback."""
    for _ in range(200):
        base = random.randrange(20000, 58000, 100)
        if all(port_is_free(base + offset) for offset in port_offsets().values()):
            return base
    raise RuntimeError("no free port range found")


@dataclass
class StackEnv:
    run_dir: Path
    port_base: int
    env: dict[str, str]

    def port(self, name: str) -> int:
        return self.port_base + port_offsets()[name]

    def url(self, name: str, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port(name)}{path}"

    def cli(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [*FLEETSIGHT, *args], env=self.env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout
        )
        if check and result.returncode != 0:
            pytest.fail(
                f"fleetsight {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
            )
        return result
