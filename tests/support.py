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


def ephemeral_port_floor() -> int:
    """The lowest port the kernel hands out to outgoing connections and ``bind(0)``."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port_base() -> int:
    """A port base whose component ports (base + each offset) are all free on loopback, and below the
    ephemeral range: a port free when checked there can be taken by any client's outgoing connection
    before the component binds it (alertmanager-b lost base+96 so once: "address already in use")."""
    offsets = port_offsets().values()
    top = ephemeral_port_floor() - max(offsets) - 1
    for _ in range(200):
        base = random.randrange(20000, max(top, 20100), 100)
        if all(port_is_free(base + offset) for offset in offsets):
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


def self_signed(folder: Path, common_name: str) -> tuple[Path, Path]:
    """A one-day self-signed certificate for 127.0.0.1 (it is its own CA) and its key, made by openssl."""
    cert, key = folder / f"{common_name}.crt", folder / f"{common_name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout", str(key),
         "-out", str(cert), "-subj", f"/CN={common_name}", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key
