"""The supervisor: a detached process that starts the stack's components, restarts those that
crash, and stops them all on SIGTERM.

``fleetsight up`` starts it and reads its progress from ``<run>/state.json``; ``fleetsight down``
sends it SIGTERM. Every child runs in its own process group so that stopping a component also stops
whatever it spawned. Events go to ``<run>/logs/supervisor.log``, one ``key=value`` line each.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fleetsight.components import Component, load_components, resolve_order
from fleetsight.procs import kill_group, terminate_group
from fleetsight.settings import Settings

RESTART_BACKOFF_MAX_S = 30.0
POLL_S = 0.5


@dataclass
class ComponentState:
    name: str
    status: str = "pending"  # pending, starting, ready, failed, restarting, skipped, stopped
    pid: int | None = None
    restarts: int = 0
    urls: dict[str, str] = field(default_factory=dict)
    detail: str = ""
    started_at: float | None = None
    log: str = ""


def state_path(settings: Settings) -> Path:
    return settings.run_dir / "state.json"


def pid_path(settings: Settings) -> Path:
    return settings.run_dir / "supervisor.pid"


def read_state(settings: Settings) -> dict:
    try:
        return json.loads(state_path(settings).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def runs_here(settings: Settings, name: str) -> bool:
    """Whether the supervisor in this process runs component ``name`` (its state file lists the stack it
    runs, written before any component starts): how one component's configuration adapts to another
    being part of the same stack (the health pair's second replica). Never true outside a supervisor."""
    state = read_state(settings)
    names = {c.get("name") for c in state.get("components", [])}
    return state.get("supervisor_pid") == os.getpid() and name in names


def log_event(event: str, **fields: object) -> None:
    parts = [f"ts={time.strftime('%Y-%m-%dT%H:%M:%S')}", f"event={event}"]
    parts += [f"{k}={json.dumps(v) if isinstance(v, str) and ' ' in v else v}" for k, v in fields.items()]
    print(" ".join(parts), flush=True)


class Supervisor:
    def __init__(self, settings: Settings, components: list[Component]) -> None:
        self.settings = settings
        self.components = components
        self.by_name = {c.name: c for c in components}
        self.states = {c.name: ComponentState(c.name) for c in components}
        self.processes: dict[str, subprocess.Popen] = {}
        self.next_restart: dict[str, float] = {}
        self.stopping = False

    # -- state file -----------------------------------------------------------------------------
    def save(self) -> None:
        payload = {
            "supervisor_pid": os.getpid(),
            "updated_at": time.time(),
            "stopping": self.stopping,
            "components": [asdict(self.states[c.name]) for c in self.components],
        }
        tmp = state_path(self.settings).with_suffix(".tmp")
        tmp.write_text(json.dumps(payload, indent=1))
        tmp.replace(state_path(self.settings))

    def set(self, name: str, **changes: object) -> None:
        for key, value in changes.items():
            setattr(self.states[name], key, value)
        self.save()

    # -- one component --------------------------------------------------------------------------
    def spawn(self, component: Component) -> subprocess.Popen:
        component.prepare(self.settings)
        log_file = self.settings.log_file(component.name)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **component.env(self.settings)}
        command = component.command(self.settings)
        with open(log_file, "ab") as out:
            process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.settings.repo_root,
                env=env,
                start_new_session=True,  # its own process group: stopping it stops its children too
            )
        log_event("spawn", component=component.name, pid=process.pid, command=" ".join(command))
        self.processes[component.name] = process
        # A retry of a component that has not been ready since it failed stays failed until it is
        # ready: `up` and `status` report it failed, not a status that flickers with each attempt.
        still_failed = self.states[component.name].status == "failed"
        self.set(
            component.name,
            pid=process.pid,
            status="failed" if still_failed else "starting",
            started_at=time.time(),
            urls=component.urls(self.settings),
            log=str(log_file),
        )
        return process

    def wait_ready(self, component: Component) -> bool:
        process = self.processes[component.name]
        timeout_s = component.ready_timeout_s * self.settings.ready_patience
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.stopping:
            if process.poll() is not None:
                self.set(component.name, status="failed", detail=f"exited with code {process.returncode}")
                log_event("exited_before_ready", component=component.name, code=process.returncode)
                return False
            if component.ready(self.settings):
                self.set(component.name, status="ready", detail="")
                log_event("ready", component=component.name)
                return True
            time.sleep(POLL_S)
        if self.stopping:
            return False
        self.set(component.name, status="failed", detail=f"not ready after {timeout_s:.0f}s")
        log_event("not_ready", component=component.name, timeout_s=timeout_s)
        self.stop_one(component.name)
        return False

    def stop_one(self, name: str) -> None:
        process = self.processes.pop(name, None)
        if process is None or process.poll() is not None:
            return
        terminate_group(process.pid)
        timeout_s = self.by_name[name].stop_timeout_s
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log_event("kill", component=name, pid=process.pid, after_s=timeout_s)
            kill_group(process.pid)
            process.wait(timeout=5)
        # Anything left in its group (a child that ignored SIGTERM) goes too.
        kill_group(process.pid)
        log_event("stopped", component=name, code=process.returncode)

    # -- the whole stack ------------------------------------------------------------------------
    def start_all(self) -> None:
        self.save()  # the stack's list, before any component prepares (runs_here reads it)
        failed: set[str] = set()
        for component in self.components:
            if self.stopping:
                return
            blocked = [d for d in component.depends_on if d in failed]
            reason = component.missing(self.settings)
            if blocked or reason:
                detail = reason or f"dependency failed: {', '.join(blocked)}"
                self.set(component.name, status="skipped", detail=detail)
                log_event("skipped", component=component.name, reason=detail)
                failed.add(component.name)
                continue
            try:
                self.spawn(component)
            except (OSError, ValueError) as exc:
                self.set(component.name, status="failed", detail=f"could not start: {exc}")
                log_event("spawn_failed", component=component.name, error=str(exc))
                failed.add(component.name)
                continue
            if not self.wait_ready(component):
                failed.add(component.name)

    def watch(self, until: Callable[[], bool] = lambda: False) -> None:
        """Restart components that exit, with a growing back-off, until asked to stop (or until
        ``until()``: the game day stops restarting before it stops the twin)."""
        backoff: dict[str, float] = {}
        while not self.stopping and not until():
            now = time.monotonic()
            for component in self.components:
                name = component.name
                process = self.processes.get(name)
                if process is not None and process.poll() is not None:
                    del self.processes[name]
                    delay = min(RESTART_BACKOFF_MAX_S, backoff.get(name, 0.5) * 2)
                    backoff[name] = delay
                    self.next_restart[name] = now + delay
                    never_ready = self.states[name].status == "failed"
                    self.set(
                        name,
                        status="failed" if never_ready else "restarting",
                        detail=f"exited with code {process.returncode}; retry in {delay:.0f} s",
                    )
                    log_event("crashed", component=name, code=process.returncode, restart_in_s=delay)
                elif name in self.next_restart and now >= self.next_restart[name]:
                    del self.next_restart[name]
                    self.states[name].restarts += 1
                    log_event("restart", component=name, restarts=self.states[name].restarts)
                    try:
                        self.spawn(component)
                    except (OSError, ValueError) as exc:
                        log_event("spawn_failed", component=name, error=str(exc))
                        self.next_restart[name] = now + backoff.get(name, 1.0)
                        continue
                    if self.wait_ready(component):
                        backoff[name] = 0.5
                    elif name not in self.processes and not self.stopping:
                        self.next_restart[name] = time.monotonic() + backoff.get(name, 1.0)
            time.sleep(POLL_S)

    def stop_all(self) -> None:
        self.stopping = True
        self.save()
        for component in reversed(self.components):
            if component.name in self.processes:
                self.stop_one(component.name)
                self.set(component.name, status="stopped", pid=None)

    def run(self) -> None:
        def on_signal(signum: int, _frame: object) -> None:
            log_event("signal", signum=signum)
            self.stopping = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        log_event("supervisor_start", pid=os.getpid(), components=",".join(c.name for c in self.components))
        self.save()
        try:
            self.start_all()
            self.watch()
        finally:
            self.stop_all()
            pid_path(self.settings).unlink(missing_ok=True)
            log_event("supervisor_exit")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="FleetSight stack supervisor (started by `fleetsight up`).")
    parser.add_argument("--components", required=True, help="comma-separated component names")
    args = parser.parse_args(argv)
    settings = Settings()
    components = resolve_order(load_components(), args.components.split(","))
    pid_path(settings).write_text(str(os.getpid()))
    Supervisor(settings, components).run()


if __name__ == "__main__":
    sys.exit(main())
