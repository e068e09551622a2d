"""``fleetsight setup``: install what the stack and the tests need, idempotently.

Each thing to install is an :class:`InstallStep` with a fast check ("is it there already?") and an
install action. Every step is declared by the component that needs it (``INSTALL_STEPS`` in its
``component.py``, found by :mod:`fleetsight.registry`), Debian packages included (:func:`apt_step`); the
core declares none. A step that fails is reported with its reason and the tail of its log, and the others
still run.

Steps run in lanes (:attr:`InstallStep.lane`): the Go builds in one, everything else in the other, both at
once. A cold Go build keeps both cores busy for minutes, while the other steps mostly wait on downloads
(apt, PyPI, Maven Central, npm), so on a fresh machine the downloads cost no wall time. Within a lane the
declared order holds (kube-controller-manager reuses what kube-apiserver compiled).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from fleetsight.procs import kill_group, pid_alive
from fleetsight.settings import Settings


class InstallError(RuntimeError):
    """A step could not install; the message says why."""


@dataclass(frozen=True)
class InstallStep:
    name: str
    description: str
    needed_by: str
    check: Callable[[Settings], bool]
    """True when already installed; must be fast (no network, no build)."""
    install: Callable[[Settings, Path], None]
    """Installs, logging command output to the given file; raises InstallError or CalledProcessError."""
    eta: str = ""
    """How long a first install takes, shown while it runs."""
    lane: str = "main"
    """Steps of different lanes run at the same time; GO_LANE for builds that keep the CPUs busy."""


GO_LANE = "go"


class Installable(Protocol):
    """What installs one thing and checks it (a Go module build, a private venv)."""

    def present(self, settings: Settings) -> bool: ...

    def install(self, settings: Settings, log: Path) -> None: ...


def step_of(
    thing: Installable, name: str, description: str, needed_by: str, eta: str, lane: str = "main"
) -> InstallStep:
    """The `fleetsight setup` step that installs thing when it is missing or not the pinned one."""
    return InstallStep(
        name, description, needed_by, check=thing.present, install=thing.install, eta=eta, lane=lane
    )


@dataclass
class StepResult:
    step: InstallStep
    outcome: str  # "present", "installed", "failed"
    seconds: float
    detail: str = ""
    log: Path | None = None


# process groups of the commands that steps run now, in any lane: an interrupted setup kills them all
_running_groups: set[int] = set()
_running_lock = threading.Lock()


def stop_running_commands() -> None:
    """Kill every command a step is running (their lanes then see them fail and stop)."""
    with _running_lock:
        groups = list(_running_groups)
    for group in groups:
        kill_group(group)


def run_logged(command: Sequence[str | os.PathLike], log: Path, **kwargs: object) -> None:
    """Run a command, appending its output to log; raise InstallError naming the command on failure.

    The command runs in its own process group, and if setup is interrupted (Ctrl-C, SIGTERM) the whole
    group is killed: an abandoned `go build` or `mvn` would otherwise go on for minutes on its own. In a
    lane's thread the interrupt reaches the main thread, which kills the group (stop_running_commands)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        out.write(f"$ {' '.join(map(str, command))}\n")
        out.flush()
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            **kwargs,
        )  # type: ignore[call-overload]  # fmt: skip
        with _running_lock:
            _running_groups.add(process.pid)
        try:
            returncode = process.wait()
        except BaseException:
            kill_group(process.pid)
            process.wait()
            raise
        finally:
            with _running_lock:
                _running_groups.discard(process.pid)
    if returncode != 0:
        raise InstallError(f"`{' '.join(map(str, command[:4]))} ...` exited with code {returncode}")


def remove_leftovers(folder: Path, prefix: str) -> None:
    """Remove what an interrupted install left in folder (``<prefix><pid>-...``) unless that process
    still runs: two setups may run at once."""
    for path in folder.glob(prefix + "*"):
        pid = path.name.removeprefix(prefix).split("-")[0]
        if pid.isdigit() and pid_alive(int(pid)):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def tail(path: Path | None, lines: int = 12) -> str:
    if path is None or not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def stamp_matches(stamp: Path, expected: str) -> bool:
    """An install's stamp file names the pinned install: written last, so a partial one has none."""
    return stamp.is_file() and stamp.read_text().strip() == expected


def write_stamp(stamp: Path, text: str) -> None:
    stamp.write_text(text + "\n")


# -- Binaries built from Go modules (fleetsight/gobuild.py) ----------------------------------------


def go_env() -> dict[str, str]:
    """The environment for `go`: keep the machine's GOFLAGS and add -mod=mod (the module copy's go.sum may
    change), never fetch another toolchain (none can be fetched), no cgo, no checksum database by
    default (only the module proxy answers here), and no go.work from a parent folder."""
    goflags = " ".join(filter(None, [os.environ.get("GOFLAGS", ""), "-mod=mod"]))
    return {
        **os.environ,
        "GOFLAGS": goflags,
        "GOTOOLCHAIN": "local",
        "CGO_ENABLED": "0",
        "GOSUMDB": os.environ.get("GOSUMDB", "off"),
        "GOWORK": "off",
    }


# -- Debian packages (each component declares its own with apt_step) -------------------------------


def dpkg_installed(package: str) -> bool:
    result = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True, check=False
    )
    return result.returncode == 0 and "install ok installed" in result.stdout


def apt_present_check(packages: dict[str, str | None]) -> Callable[[Settings], bool]:
    """A fast check: every package is installed and every named binary is on PATH (or in /usr/sbin)."""

    def check(_settings: Settings) -> bool:
        if shutil.which("dpkg-query") is None:
            return False
        return all(dpkg_installed(p) for p in packages) and all(
            shutil.which(b) or Path("/usr/sbin", b).exists() for b in packages.values() if b
        )

    return check


_apt_lists_refreshed = False


def refresh_apt_lists(prefix: list[str], log: Path, env: dict[str, str]) -> None:
    """`apt-get update` once per setup run, not once per apt step: it takes 10-30 s, and every
    component's apt step installs from the same fresh lists."""
    global _apt_lists_refreshed
    if not _apt_lists_refreshed:
        run_logged([*prefix, "apt-get", "update", "-q"], log, env=env)
        _apt_lists_refreshed = True


def apt_installer(packages: dict[str, str | None]) -> Callable[[Settings, Path], None]:
    def install(_settings: Settings, log: Path) -> None:
        if shutil.which("apt-get") is None:
            raise InstallError("apt-get is not available: this needs a Debian-based machine")
        prefix: list[str] = []
        if os.geteuid() != 0:
            if shutil.which("sudo") is None:
                raise InstallError(
                    "not root and no sudo: run `apt-get install " + " ".join(packages) + "` as root"
                )
            prefix = ["sudo", "-n"]
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        refresh_apt_lists(prefix, log, env)
        run_logged(
            [*prefix, "apt-get", "install", "-y", "-q", "--no-install-recommends", *packages], log, env=env
        )
        # Debian's packages start their services under systemd where it runs; the local stack runs its own.

    return install


def apt_step(
    name: str, description: str, needed_by: str, packages: dict[str, str | None], eta: str = "~30 s"
) -> InstallStep:
    """A step that installs Debian packages (package name -> a binary it provides, or None)."""
    return InstallStep(
        name=name,
        description=description,
        needed_by=needed_by,
        check=apt_present_check(packages),
        install=apt_installer(packages),
        eta=eta,
    )


def load_steps() -> list[InstallStep]:
    """Every component's steps, in start order (the core has none of its own)."""
    from fleetsight.registry import declared  # late: component modules import this one

    steps: list[InstallStep] = list(declared("INSTALL_STEPS"))
    names = [s.name for s in steps]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ValueError(f"install step(s) declared twice: {', '.join(duplicated)}")
    return steps


def run_steps(
    settings: Settings,
    steps: list[InstallStep],
    on_start: Callable[[InstallStep, int, int], None] = lambda s, i, n: None,
    on_done: Callable[[StepResult, int, int], None] = lambda r, i, n: None,
) -> list[StepResult]:
    """Run the steps, each lane in a thread of its own; the results in the steps' order. The callbacks
    are called one at a time (never from two lanes at once). Ctrl-C stops every lane: the running
    commands are killed, no further step starts, and KeyboardInterrupt goes on to the caller."""
    lanes: dict[str, list[tuple[int, InstallStep]]] = {}
    for index, step in enumerate(steps, 1):
        lanes.setdefault(step.lane, []).append((index, step))
    results: dict[int, StepResult] = {}
    one_at_a_time = threading.Lock()
    stopping = threading.Event()

    def run_lane(lane: list[tuple[int, InstallStep]]) -> None:
        for index, step in lane:
            if stopping.is_set():
                return

            def started(step: InstallStep = step, index: int = index) -> None:
                with one_at_a_time:
                    on_start(step, index, len(steps))

            result = run_step(settings, step, started)
            if stopping.is_set():
                return
            results[index] = result
            with one_at_a_time:
                on_done(result, index, len(steps))

    with ThreadPoolExecutor(max_workers=max(1, len(lanes)), thread_name_prefix="setup-lane") as pool:
        futures = [pool.submit(run_lane, lane) for lane in lanes.values()]
        try:
            for future in futures:
                future.result()
        except BaseException:
            stopping.set()
            stop_running_commands()
            raise
    return [results[index] for index in sorted(results)]


def run_step(settings: Settings, step: InstallStep, started: Callable[[], None]) -> StepResult:
    """Check one step and install it when missing; started() is called before an install begins."""
    began = time.monotonic()
    if step.check(settings):
        return StepResult(step, "present", time.monotonic() - began)
    started()
    log = settings.cache_dir / "logs" / f"setup-{step.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    try:
        step.install(settings, log)
        if not step.check(settings):
            raise InstallError("the install finished but the check still fails")
        return StepResult(step, "installed", time.monotonic() - began, log=log)
    except (InstallError, subprocess.CalledProcessError, OSError) as exc:
        return StepResult(step, "failed", time.monotonic() - began, detail=str(exc), log=log)
