"""The CLI teaches (every --help has an example) and setup is idempotent."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from fleetsight import registry
from fleetsight import setup as setup_mod
from fleetsight.cli import main
from fleetsight.components import Component, load_components, resolve_order
from fleetsight.procs import kill_group, pid_alive
from fleetsight.settings import REPO_ROOT, Settings
from fleetsight.webconfig import listen_address
from support import FLEETSIGHT, StackEnv, wait_until


def built_commands() -> list[list[str]]:
    """Every command and sub-command of the CLI, as argument lists."""
    found: list[list[str]] = []

    def walk(command: click.Command, path: list[str]) -> None:
        found.append(path)
        if isinstance(command, click.Group):
            context = click.Context(command)
            for name in command.list_commands(context):
                walk(command.get_command(context, name), [*path, name])

    walk(main, [])
    return found


def test_top_level_help_lists_every_sub_command_and_nothing_planned() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for name in ["setup", "up", "down", "status", *registry.cli_entries()]:
        assert f"\n  {name} " in result.output
    assert "not built yet" not in result.output
    commands = result.output.split("Commands:", 1)[1]
    assert "..." not in commands, "a command's one-line help is cut short"


@pytest.mark.parametrize("path", built_commands()[1:], ids=" ".join)
def test_every_help_explains_with_an_example(path: list[str]) -> None:
    result = CliRunner().invoke(main, [*path, "--help"])
    assert result.exit_code == 0
    assert "Example" in result.output and f"fleetsight {' '.join(path)}" in result.output


# What the examples that read the twin of a running `fleetsight up` name: its default port, its output.
TWIN_ADDRESS, TWIN_OUT = "127.0.0.1:19100", "run/data/twin"


def help_examples(path: list[str]) -> list[str]:
    """The example command lines of one --help (continuation lines joined, trailing notes dropped)."""
    text = CliRunner().invoke(main, [*path, "--help"]).output
    if "Example" not in text:  # the top level: a quick start instead
        return []
    block = re.sub(r"\\\n\s*", " ", text.split("Example", 1)[1].split("Options:", 1)[0])
    lines = [line.strip() for line in block.splitlines() if line.strip().startswith("fleetsight ")]
    return [re.split(r"\s{3,}", line)[0] for line in lines]


def test_examples_that_read_a_running_twin_run_as_written(stack_env: StackEnv) -> None:
    """The `--once` examples that read the twin of a running `fleetsight up` run as written against one;
    only this test's port base and run folder stand in for the defaults."""
    examples = sorted(
        {
            example
            for path in built_commands()
            for example in help_examples(path)
            if "--once" in example and (TWIN_ADDRESS in example or TWIN_OUT in example)
        }
    )
    assert len(examples) >= 2, examples  # the node agent's and the fabric exporter's
    stack_env.cli("up", "twin")
    for example in examples:
        line = example.replace(TWIN_ADDRESS, f"127.0.0.1:{stack_env.port('twin')}")
        line = line.replace(TWIN_OUT, str(stack_env.run_dir / "data" / "twin"))
        result = subprocess.run(
            [*FLEETSIGHT, *shlex.split(line)[1:]], env=stack_env.env, cwd=REPO_ROOT,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, (example, result.stderr[-2000:])
        successes = re.findall(r"^fleetsight_collector_success\{.*\} (\S+)$", result.stdout, re.MULTILINE)
        assert successes and all(float(v) == 1 for v in successes), (example, result.stdout[-3000:])


def test_setup_rejects_an_unknown_step() -> None:
    result = CliRunner().invoke(main, ["setup", "--only", "no-such-step"])
    assert result.exit_code != 0
    assert "unknown step(s) no-such-step" in result.output


def test_second_setup_does_nothing_and_says_so() -> None:
    """The README's test command ran `fleetsight setup` before the tests: this is the second run. If a
    step is missing it would start installing; the test then fails and stops that install whole."""
    process = subprocess.Popen(
        [*FLEETSIGHT, "setup"], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        kill_group(process.pid)
        output, _ = process.communicate()
        pytest.fail(f"a second `fleetsight setup` was still installing after 60 s:\n{output}")
    assert process.returncode == 0, output
    assert "nothing to do" in output
    assert "installing" not in output


def test_dependencies_come_first_and_cycles_are_refused() -> None:
    components = load_components()
    order = [c.name for c in resolve_order(components, ["prometheus"])]
    assert order.index("alertmanager") < order.index("prometheus")
    assert order.index("slack-sink") < order.index("alertmanager")

    cyclic = {
        name: Component(
            name=name, description="", command=lambda s: [], ready=lambda s: True, depends_on=(other,)
        )
        for name, other in [("a", "b"), ("b", "a")]
    }
    with pytest.raises(ValueError, match="dependency cycle"):
        resolve_order(cyclic, ["a"])


def test_an_interrupted_install_stops_the_command_it_was_running(tmp_path: Path) -> None:
    """Ctrl-C during a step must not leave its build running on its own."""
    pid_file, log = tmp_path / "child.pid", tmp_path / "step.log"
    script = (
        "from pathlib import Path; from fleetsight.setup import run_logged; "
        f"run_logged(['sh', '-c', 'echo $$ > {pid_file}; exec sleep 600'], Path('{log}'))"
    )
    # SIGINT at its default in the child: a suite started in the background (`pytest &`) inherits
    # SIGINT ignored, and Python then never raises KeyboardInterrupt.
    setup_process = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    child = int(
        wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the step's command")
    )
    assert pid_alive(child)
    setup_process.send_signal(signal.SIGINT)
    assert setup_process.wait(timeout=30) != 0
    wait_until(lambda: not pid_alive(child), timeout=10, what="the step's command to be stopped")


def test_every_setup_step_is_declared_by_the_component_that_needs_it() -> None:
    """The core installs nothing of its own: the Debian packages of Alertmanager, rsyslog and Prometheus
    come with their components' declarations, like every other step."""
    owners = {
        step.name: module.__name__.split(".")[0].removeprefix("fleetsight_")
        for module in registry.component_modules()
        for step in getattr(module, "INSTALL_STEPS", [])
    }
    assert [step.name for step in setup_mod.load_steps()] == list(owners)
    assert (owners["alertmanager"], owners["rsyslog"], owners["prometheus"]) == (
        "alerting",
        "pipelines",
        "metrics",
    )


def test_apt_steps_refresh_the_package_lists_once_per_setup(tmp_path: Path) -> None:
    """Two components' apt steps in one run: one `apt-get update`, then one install each. apt-get and sudo
    are stand-ins on PATH that record their arguments (a test must not install system packages)."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    for name, body in [("apt-get", f'echo "$*" >> {calls}'), ("sudo", 'shift; exec "$@"')]:
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "setup.log"
    script = (
        "from pathlib import Path; from fleetsight.setup import apt_installer; "
        f"[apt_installer({{p: None}})(None, Path('{log}')) for p in ('pkg-a', 'pkg-b')]"
    )
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, env=env, check=True, timeout=60)
    lines = calls.read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["update", "install", "install"], lines
    assert lines[1].endswith("pkg-a") and lines[2].endswith("pkg-b"), lines


def lane_step(name: str, lane: str, install: Callable[[Settings, Path], None]) -> setup_mod.InstallStep:
    """A step that is never present, so that it always installs."""
    return setup_mod.InstallStep(name, name, "the test", check=lambda s: False, install=install, lane=lane)


def test_the_go_lane_runs_beside_the_other_steps_and_each_lane_keeps_its_order(tmp_path: Path) -> None:
    """A Go build and a download at once; within a lane, the declared order. The Go step waits for the
    other lane's step to be running: run one after the other, it would wait in vain and fail."""
    events: list[str] = []
    download_running = threading.Event()

    def download(_settings: object, _log: Path) -> None:
        events.append("download")
        download_running.set()

    def go_build(_settings: object, _log: Path) -> None:
        if not download_running.wait(timeout=30):
            raise setup_mod.InstallError("the other lane never ran while this build did")
        events.append("go build")

    def then(name: str) -> Callable[[Settings, Path], None]:
        return lambda _settings, _log: events.append(name)

    steps = [
        lane_step("go-1", setup_mod.GO_LANE, go_build),
        lane_step("go-2", setup_mod.GO_LANE, then("go 2")),
        lane_step("download", "main", download),
        lane_step("after-download", "main", then("after download")),
    ]
    settings = Settings(cache_dir=tmp_path)
    results = setup_mod.run_steps(settings, steps)
    assert [(r.step.name, r.outcome) for r in results] == [(s.name, "failed") for s in steps]
    # "failed" only because the check stays false after installing; the lanes ran:
    assert all("check still fails" in r.detail for r in results), [r.detail for r in results]
    assert events.index("go build") < events.index("go 2")
    assert events.index("download") < events.index("after download")


def test_an_interrupted_setup_stops_the_commands_of_every_lane(tmp_path: Path) -> None:
    """Ctrl-C while a Go build and a download both run: neither command is left running."""
    pid_files = {lane: tmp_path / f"{lane}.pid" for lane in ("go", "main")}
    script = "\n".join(
        [
            "from pathlib import Path",
            "from fleetsight import setup as s",
            "def sleeper(pid_file):",
            "    return lambda settings, log: s.run_logged(",
            "        ['sh', '-c', f'echo $$ > {pid_file}; exec sleep 600'], log)",
            "steps = [s.InstallStep(lane, lane, 'test', check=lambda _: False,",
            f"         install=sleeper(Path('{tmp_path}') / f'{{lane}}.pid'), lane=lane)",
            "         for lane in ('go', 'main')]",
            f"s.run_steps(s.Settings(cache_dir=Path('{tmp_path}')), steps)",
        ]
    )
    setup_process = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    children = [
        int(wait_until(lambda f=f: f.exists() and f.read_text().strip(), what=f"{f.stem} lane's command"))
        for f in pid_files.values()
    ]
    assert all(pid_alive(child) for child in children)
    setup_process.send_signal(signal.SIGINT)
    assert setup_process.wait(timeout=30) != 0
    for child in children:
        wait_until(lambda c=child: not pid_alive(c), timeout=10, what="every lane's command to be stopped")


def test_a_bad_listen_address_is_a_usage_error_naming_the_option() -> None:
    """Every service parses --listen with one function (fleetsight.webconfig.listen_address)."""
    for bad in ["nope", "127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:0", "host:port"]:
        with pytest.raises(click.BadParameter, match="HOST:PORT"):
            listen_address(bad)
    assert listen_address(":9140") == ("127.0.0.1", 9140)
    assert listen_address("0.0.0.0:8080") == ("0.0.0.0", 8080)
    result = CliRunner().invoke(main, ["dashboards", "serve", "--listen", "nope"])
    assert result.exit_code == 2 and "--listen" in result.output and "nope" in result.output, result.output


def test_a_bad_cluster_name_is_a_usage_error_before_anything_starts(tmp_path: Path) -> None:
    env = {"FLEETSIGHT_CLUSTER": "prod a", "FLEETSIGHT_RUN_DIR": str(tmp_path / "run")}
    result = CliRunner().invoke(main, ["up", "twin"], env=env)
    assert result.exit_code == 2 and "FLEETSIGHT_CLUSTER" in result.output, result.output
    assert not (tmp_path / "run").exists()
    assert Settings(cluster="vela-2.site_a").cluster == "vela-2.site_a"
    with pytest.raises(ValueError, match="FLEETSIGHT_CLUSTER"):
        Settings(cluster="")
