"""What the log benchmarks share: a stack of the log path's components held by the script (so that it
can stop and start each), in its own run folder and port range."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import time

from fleetsight.components import load_components
from fleetsight.registry import port_offsets
from fleetsight.settings import Settings


def free_base() -> int:
    """A port base whose declared ports are all free on loopback."""
    for _ in range(200):
        base = random.randrange(20000, 58000, 100)
        if all(port_free(base + offset) for offset in port_offsets().values()):
            return base
    raise RuntimeError("no free port range")


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Stack:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.components = load_components()
        self.processes: dict[str, subprocess.Popen] = {}

    def start(self, name: str) -> None:
        component = self.components[name]
        component.prepare(self.settings)
        log = self.settings.log_file(name)
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "FLEETSIGHT_RUN_DIR": str(self.settings.run_dir),
            "FLEETSIGHT_PORT_BASE": str(self.settings.port_base),
            **component.env(self.settings),
        }
        with open(log, "ab") as out:
            self.processes[name] = subprocess.Popen(
                component.command(self.settings), stdout=out, stderr=subprocess.STDOUT, env=env,
                cwd=self.settings.repo_root, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + component.ready_timeout_s + 60
        while not component.ready(self.settings):
            if self.processes[name].poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{name} did not start; see {log}")
            time.sleep(0.5)

    def stop_all(self) -> None:
        for process in reversed(list(self.processes.values())):
            try:
                os.killpg(process.pid, 15)
                process.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(process.pid, 9)
