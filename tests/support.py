"""Helpers every test may import (``from support import ...``): polling with a deadline (never sleeps
as synchronisation), free loopback ports, the CLI as a subprocess, and real servers started for a test
(a supervised :class:`Process`, Alertmanager, Prometheus) that are stopped when it is done."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from fleetsight.procs import free_loopback_port as free_port
from fleetsight.procs import stop_process
from fleetsight.registry import port_offsets
from fleetsight.settings import REPO_ROOT, Settings

T = TypeVar("T")
FLEETSIGHT = [sys.executable, "-m", "fleetsight.cli"]


# Deadlines in tests are written for an idle machine; each wait allows PATIENCE times as long. A wait
# should fail only when the thing never happens, not when a 2-core CI machine is busy with the servers of
# other tests (CI once needed more than 20 s for a health service to list Slurm's nodes, and more than
# 60 s for kwok's DaemonSet to be ready). Only a failing wait pays for it; tests assert behaviour, and
# speed is measured in bench/.
# The extra time is capped at PATIENCE_CAP_S, so that a long wait still fails by its own message before
# pytest-timeout's 600 s cuts the test off.
PATIENCE = float(os.environ.get("FLEETSIGHT_TEST_PATIENCE", "3"))
PATIENCE_CAP_S = 120.0


def wait_until(predicate: Callable[[], T], timeout: float = 60.0, interval: float = 0.2, what: str = "") -> T:
    """Poll predicate until it returns something truthy; fail the test with `what` after timeout (times
    PATIENCE: see above)."""
    allowed = timeout + min(timeout * (PATIENCE - 1), PATIENCE_CAP_S)
    started = time.monotonic()
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() - started > allowed:
            pytest.fail(
                f"timed out after {allowed:.0f}s ({timeout:.0f}s, with patience for a busy machine) "
                f"waiting for {what or predicate}"
            )
        time.sleep(interval)


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


def free_port_base(blocks: int = 1, stride: int = 1000) -> int:
    """A port base whose component ports (base + each offset) are all free on loopback, and below the
    ephemeral range: a port free when checked there can be taken by any client's outgoing connection
    before the component binds it (alertmanager-b lost base+96 so once: "address already in use").
    ``blocks``: as many stacks at ``stride`` apart (`fleetsight up --clusters N`: the global layer on the
    base, cluster k on base + k * 1000), all free."""
    offsets = [stride * block + offset for block in range(blocks) for offset in port_offsets().values()]
    top = ephemeral_port_floor() - max(offsets) - 1
    for _ in range(200):
        base = random.randrange(20000, max(top, 20100), 100)
        if all(port_is_free(base + offset) for offset in offsets):
            return base
    raise RuntimeError("no free port range found")


def quiet_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports, free now and below the ephemeral range (see free_port_base):
    for servers started one after another, where a port picked by binding port 0 could meanwhile be
    taken by an outgoing connection or handed out twice before its server binds it."""
    base = free_port_base()
    found = [port for port in range(base + 1, base + 100) if port_is_free(port)][:count]
    if len(found) < count:
        raise RuntimeError(f"fewer than {count} free ports above {base}")
    return found


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


class Process:
    """A server started for the tests; its log is shown when it dies or fails to become ready."""

    def __init__(self, name: str, command: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.name, self.log = name, log
        self.handle = log.open("wb")
        self.popen = subprocess.Popen(
            command, stdout=self.handle, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=env or dict(os.environ)
        )

    def wait_ready(self, url: str, timeout: float = 30) -> None:
        def ready() -> bool:
            try:
                return httpx.get(url, timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        self.wait_for(ready, what=f"{self.name} at {url}", timeout=timeout)

    def wait_for(self, predicate: Callable[[], T], what: str, timeout: float = 60) -> T:
        """Poll predicate until it holds, failing at once (with the log) if the process has died."""

        def alive_and_ready() -> T:
            if self.popen.poll() is not None:
                pytest.fail(f"{self.name} exited {self.popen.returncode}:\n{self.log.read_text()[-3000:]}")
            return predicate()

        return wait_until(alive_and_ready, timeout=timeout, what=what)

    def stop(self) -> None:
        if self.popen.poll() is None:
            stop_process(self.popen, timeout_s=15)
        self.handle.close()


@contextlib.contextmanager
def stopping(process: Process) -> Iterator[Process]:
    """The process, stopped on leaving (a fixture's teardown, whatever the test did)."""
    try:
        yield process
    finally:
        process.stop()


@contextlib.contextmanager
def served(process: Process, ready_url: str) -> Iterator[Process]:
    """The process once ready_url answers 200; stopped on leaving, ready or not."""
    with stopping(process):
        process.wait_ready(ready_url)
        yield process


@contextlib.contextmanager
def served_on_a_free_port(
    name: str, command_on: Callable[[int], list[str]], log: Path, ready_path: str, attempts: int = 3
) -> Iterator[str]:
    """The server that ``command_on(port)`` starts, on a free loopback port, once ``ready_path`` answers;
    its URL. A port free when picked can be taken before the server binds it (an outgoing connection's
    ephemeral port: "address already in use" in CI, stop 54), so such a start is retried on a new port."""
    for attempt in range(1, attempts + 1):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        process = Process(name, command_on(port), log)
        with stopping(process):
            try:
                process.wait_ready(f"{url}{ready_path}")
            except pytest.fail.Exception:
                if attempt < attempts and died_of_a_taken_port(process):
                    continue
                raise
            yield url
            return


def died_of_a_taken_port(process: Process) -> bool:
    """Whether the process died at start because its port was taken."""
    return process.popen.poll() is not None and "address already in use" in process.log.read_text()


def installed(binary: str) -> str:
    """The path of a server binary that `fleetsight setup` installs; fails the test without it."""
    path = shutil.which(binary)
    if path is None:
        pytest.fail(f"{binary} is not installed: run `fleetsight setup`")
    return path


@contextlib.contextmanager
def alertmanager_server(
    folder: Path, config: dict[str, Any] | None = None, name: str = "alertmanager"
) -> Iterator[str]:
    """A real Alertmanager (Debian's) on a free loopback port, alone in its cluster, with this
    configuration (default: every alert routed nowhere); its URL. name: the process's, in failures."""
    binary = installed("prometheus-alertmanager")
    config = config or {"route": {"receiver": "null", "group_wait": "1s"}, "receivers": [{"name": "null"}]}
    (folder / "alertmanager.yml").write_text(yaml.safe_dump(config))

    def command_on(port: int) -> list[str]:
        return [
            binary,
            f"--config.file={folder / 'alertmanager.yml'}",
            f"--storage.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ]

    with served_on_a_free_port(name, command_on, folder / "alertmanager.log", "/-/ready") as url:
        yield url


@contextlib.contextmanager
def prometheus_server(folder: Path, config: dict[str, Any], port: int | None = None) -> Iterator[str]:
    """A real Prometheus (Debian's) with this configuration on port (default: a free one); its URL."""
    binary = installed("prometheus")
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))

    def command_on(port: int) -> list[str]:
        return [
            binary,
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]

    if port is not None:  # the caller's own port: no retry elsewhere
        url = f"http://127.0.0.1:{port}"
        with served(Process("prometheus", command_on(port), folder / "prometheus.log"), f"{url}/-/ready"):
            yield url
        return
    with served_on_a_free_port("prometheus", command_on, folder / "prometheus.log", "/-/ready") as url:
        yield url


def prometheus_process(
    folder: Path, port: int, config: dict[str, Any], log: Path | None = None
) -> subprocess.Popen[bytes]:
    """A real Prometheus (the one on PATH) with this configuration on this port, a bare process for the
    caller to stop; its output goes to log (default: discarded)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    return subprocess.Popen(
        [
            "prometheus",
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log.open("w") if log else subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )


def thanos_binary() -> str:
    """The Thanos binary setup builds; fails the test without it."""
    from metrics.install import THANOS_BUILD

    binary = THANOS_BUILD.binary(Settings())
    if not binary.exists():
        pytest.fail(f"{binary} is not built: run `fleetsight setup`")
    return str(binary)


def prometheus_with_sidecar(
    name: str, folder: Path, prometheus_port: int, grpc_port: int, http_port: int
) -> tuple[Process, Process]:
    """A real Prometheus on ``folder/prometheus.yml`` (the caller's, with its external labels), ready, and
    its Thanos sidecar on the gRPC and HTTP ports given (2-hour blocks, as a sidecar needs)."""
    prometheus = Process(
        f"prometheus-{name}",
        [
            installed("prometheus"), f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{prometheus_port}",
            "--storage.tsdb.min-block-duration=2h", "--storage.tsdb.max-block-duration=2h",
        ],
        folder / "prometheus.log",
    )  # fmt: skip
    prometheus.wait_ready(f"http://127.0.0.1:{prometheus_port}/-/ready")
    sidecar = Process(
        f"sidecar-{name}",
        [
            thanos_binary(), "sidecar", f"--tsdb.path={folder / 'data'}",
            f"--prometheus.url=http://127.0.0.1:{prometheus_port}",
            f"--grpc-address=127.0.0.1:{grpc_port}", f"--http-address=127.0.0.1:{http_port}",
        ],
        folder / "sidecar.log",
    )  # fmt: skip
    return prometheus, sidecar
