"""``fleetsight up``, ``status`` and ``down``: start the supervisor, read its state, stop it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from fleetsight.components import Component, load_components, resolve_order
from fleetsight.procs import kill_group, pid_alive
from fleetsight.settings import SCHEDULER_ENV, TWIN_SCENARIO_ENV, Settings
from fleetsight.supervisor import pid_path, read_state, state_path


class StackError(RuntimeError):
    """Something the user can act on: the message says what."""


@dataclass
class Row:
    name: str
    status: str
    pid: int | None
    restarts: int
    urls: dict[str, str]
    detail: str


def supervisor_pid(settings: Settings) -> int | None:
    try:
        pid = int(pid_path(settings).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if pid_alive(pid) else None


def choose(settings: Settings, names: list[str]) -> list[Component]:
    components = load_components()
    wanted = names or [c.name for c in components.values() if c.default]
    try:
        return resolve_order(components, wanted)
    except (KeyError, ValueError) as exc:
        raise StackError(str(exc.args[0])) from exc


def preflight(settings: Settings, components: list[Component]) -> None:
    """Each component's own configuration check (``extra["validate"]``: raises ValueError naming the file
    and the problem), run for all of them before anything starts, so that a broken rule file or
    receiver stops `up` with every problem listed and no component running half-configured."""
    problems: dict[str, list[str]] = {}
    for component in components:
        check = component.extra.get("validate")
        if check is None or component.missing(settings):
            continue  # a component that cannot run is reported as skipped anyway
        try:
            check(settings)
        except ValueError as exc:
            problems.setdefault(str(exc), []).append(component.name)
    if problems:
        lines = [f"{', '.join(names)}: {problem}" for problem, names in problems.items()]
        raise StackError("configuration errors, nothing was started:\n  " + "\n  ".join(lines))


def up(
    settings: Settings,
    names: list[str],
    timeout_s: float,
    on_progress=None,
    env: dict[str, str] | None = None,
) -> list[Row]:
    """Start the supervisor for the chosen components and wait until each is ready or failed."""
    launched = start(settings, names, env)
    show = (lambda rows: on_progress(rows[0])) if on_progress else None
    return wait([launched], timeout_s, show)[0]


@dataclass
class Launched:
    """A supervisor started by :func:`start`, and how many components it runs."""

    settings: Settings
    process: subprocess.Popen
    components: int


def start(settings: Settings, names: list[str], env: dict[str, str] | None = None) -> Launched:
    """Check the chosen components' configuration and start their supervisor (in the background). The
    supervisor gets the settings' run folder, ports, cluster name, twin scenario and scheduler through the
    environment; ``env`` adds to it (another stack's Slack stand-in, say)."""
    if supervisor_pid(settings):
        raise StackError(
            f"a stack is already running from {settings.run_dir} "
            "(see `fleetsight status`; stop it with `fleetsight down`)"
        )
    components = choose(settings, names)
    preflight(settings, components)
    for sub in ("logs", "data", "config"):
        (settings.run_dir / sub).mkdir(parents=True, exist_ok=True)
    state_path(settings).unlink(missing_ok=True)
    log = open(settings.log_file("supervisor"), "ab")  # noqa: SIM115 - handed to the child
    process = subprocess.Popen(
        [sys.executable, "-m", "fleetsight.supervisor", "--components", ",".join(c.name for c in components)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=settings.repo_root,
        env={
            **os.environ,
            **(env or {}),
            "FLEETSIGHT_RUN_DIR": str(settings.run_dir),
            "FLEETSIGHT_CACHE_DIR": str(settings.cache_dir),
            "FLEETSIGHT_PORT_BASE": str(settings.port_base),
            "FLEETSIGHT_CLUSTER": settings.cluster,
            TWIN_SCENARIO_ENV: settings.twin_scenario,
            SCHEDULER_ENV: settings.scheduler,
        },
        start_new_session=True,  # outlives this command
    )
    log.close()
    return Launched(settings, process, len(components))


def wait(launched: list[Launched], timeout_s: float, on_progress=None) -> list[list[Row]]:
    """Each started supervisor's rows once every component of each is ready, failed or skipped (or the
    timeout is up); ``on_progress`` gets the rows of all of them, in order, as they change."""
    deadline = time.monotonic() + timeout_s
    settled = {"ready", "failed", "skipped"}
    while True:
        rows = [rows_from_state(item.settings) for item in launched]
        if on_progress:
            on_progress(rows)
        if all(
            len(got) == item.components and all(r.status in settled for r in got)
            for got, item in zip(rows, launched, strict=True)
        ):
            return rows
        for item in launched:
            if item.process.poll() is not None:
                log = item.settings.log_file("supervisor")
                raise StackError(f"the supervisor exited (code {item.process.returncode}); see {log}")
        if time.monotonic() > deadline:
            return rows
        time.sleep(0.3)


def rows_from_state(settings: Settings) -> list[Row]:
    state = read_state(settings)
    return [
        Row(c["name"], c["status"], c["pid"], c["restarts"], c["urls"], c["detail"])
        for c in state.get("components", [])
    ]


def status(settings: Settings) -> tuple[bool, list[Row]]:
    """Whether the supervisor runs, and each component with a live readiness check."""
    running = supervisor_pid(settings) is not None
    components = load_components()
    rows = rows_from_state(settings)
    for row in rows:
        if row.status == "ready":
            alive = pid_alive(row.pid)
            component = components.get(row.name)
            if not alive:
                row.status, row.detail = "down", "process is gone"
            elif component is not None and not component.ready(settings):
                row.status, row.detail = "unhealthy", "readiness check fails"
        if not running and row.status not in ("stopped", "skipped"):
            row.detail = (row.detail + "; supervisor not running").strip("; ")
    return running, rows


def down_timeout(settings: Settings) -> float:
    """How long the supervisor may take to stop: it stops the components one after another, each
    within its own stop timeout, so the worst case is their sum (plus a margin for itself)."""
    components = load_components()
    names = [row.name for row in rows_from_state(settings)] or list(components)
    return 15.0 + sum(components[n].stop_timeout_s for n in names if n in components)


def down(settings: Settings, timeout_s: float | None = None) -> list[str]:
    """Stop the supervisor and every component; returns what was stopped the hard way."""
    notes: list[str] = []
    if timeout_s is None:
        timeout_s = down_timeout(settings)
    pid = supervisor_pid(settings)
    if pid:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
            notes.append(f"supervisor {pid} did not stop in {timeout_s:.0f}s: killed")
    # Whatever the state file still lists as running (the supervisor was killed, say) goes too.
    for row in rows_from_state(settings):
        if row.pid and pid_alive(row.pid):
            kill_group(row.pid)
            notes.append(f"{row.name} (pid {row.pid}) was still running: killed")
    pid_path(settings).unlink(missing_ok=True)
    return notes
