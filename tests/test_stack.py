"""The local stack runner: up, status, restart on crash, down with nothing left behind."""

from __future__ import annotations

import json
import os
import signal
import textwrap
from pathlib import Path

import httpx
import pytest

from fleetsight.procs import pid_alive
from support import StackEnv, wait_until

pytestmark = pytest.mark.stack


def component_state(stack: StackEnv) -> dict[str, dict]:
    state = json.loads((stack.run_dir / "state.json").read_text())
    return {c["name"]: c for c in state["components"]}


def processes_mentioning(text: str) -> list[int]:
    """Pids of live processes whose command line mentions text (our run folder is unique per test)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and pid_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def test_up_prints_urls_of_ready_prometheus_and_alertmanager_and_down_leaves_nothing(
    stack_env: StackEnv,
) -> None:
    result = stack_env.cli("up", "prometheus")  # 80 columns (conftest), output to a pipe, not a terminal
    prometheus_url = stack_env.url("prometheus")
    alertmanager_url = stack_env.url("alertmanager")
    assert prometheus_url in result.stdout
    assert alertmanager_url in result.stdout
    assert "…" not in result.stdout, result.stdout
    assert httpx.get(prometheus_url + "/-/ready").status_code == 200
    assert httpx.get(alertmanager_url + "/-/ready").status_code == 200
    # Prometheus really sends to this Alertmanager.
    wait_until(
        lambda: httpx.get(prometheus_url + "/api/v1/alertmanagers").json()["data"]["activeAlertmanagers"],
        what="Prometheus to discover the Alertmanager",
    )
    pids = [c["pid"] for c in component_state(stack_env).values()]
    assert all(pid_alive(pid) for pid in pids)
    assert processes_mentioning(str(stack_env.run_dir))

    status = stack_env.cli("status")
    assert "running" in status.stdout and "ready" in status.stdout
    assert prometheus_url in status.stdout and "…" not in status.stdout, status.stdout

    stack_env.cli("down")
    assert not any(pid_alive(pid) for pid in pids)
    assert processes_mentioning(str(stack_env.run_dir)) == []
    assert stack_env.cli("status", check=False).returncode == 1


def test_crashed_component_is_restarted_and_the_restart_logged(stack_env: StackEnv) -> None:
    stack_env.cli("up", "alertmanager")
    old_pid = component_state(stack_env)["alertmanager"]["pid"]
    os.kill(old_pid, signal.SIGKILL)

    def restarted() -> bool:
        state = component_state(stack_env)["alertmanager"]
        return state["restarts"] == 1 and state["status"] == "ready" and state["pid"] != old_pid

    wait_until(restarted, timeout=60, what="alertmanager to be restarted")
    assert httpx.get(stack_env.url("alertmanager", "/-/ready")).status_code == 200
    log = (stack_env.run_dir / "logs" / "supervisor.log").read_text()
    assert "event=crashed component=alertmanager code=-9" in log
    assert "event=restart component=alertmanager restarts=1" in log


def test_second_up_is_refused_while_a_stack_runs(stack_env: StackEnv) -> None:
    stack_env.cli("up", "slack-sink")
    again = stack_env.cli("up", "slack-sink", check=False)
    assert again.returncode != 0
    assert "already running" in again.stderr


def test_down_stops_components_even_when_the_supervisor_was_killed(stack_env: StackEnv) -> None:
    stack_env.cli("up", "alertmanager")
    supervisor = int((stack_env.run_dir / "supervisor.pid").read_text())
    children = [c["pid"] for c in component_state(stack_env).values()]
    os.kill(supervisor, signal.SIGKILL)
    wait_until(lambda: not pid_alive(supervisor), what="the supervisor to die")
    assert all(pid_alive(pid) for pid in children)

    result = stack_env.cli("down")
    assert "was still running: killed" in result.stdout
    assert not any(pid_alive(pid) for pid in children)


def test_unknown_component_is_a_clear_error(stack_env: StackEnv) -> None:
    result = stack_env.cli("up", "no-such-thing", check=False)
    assert result.returncode != 0
    assert "unknown component 'no-such-thing'" in result.stderr
    assert "prometheus" in result.stderr  # the message lists the known ones


BROKEN_COMPONENTS = textwrap.dedent(
    """
    import sys
    from fleetsight.components import Component

    COMPONENTS = [
        Component(
            name="crashes-at-start",
            description="exits at once",
            command=lambda s: [sys.executable, "-c", "import sys; sys.exit(3)"],
            ready=lambda s: False,
            default=False,
        ),
        Component(
            name="needs-the-broken-one",
            description="depends on a component that fails",
            command=lambda s: [sys.executable, "-c", "import time; time.sleep(600)"],
            ready=lambda s: True,
            depends_on=("crashes-at-start",),
            default=False,
        ),
        Component(
            name="not-installed",
            description="its binary is missing",
            command=lambda s: ["definitely-not-installed-binary"],
            ready=lambda s: True,
            missing=lambda s: "not installed: definitely-not-installed-binary",
            default=False,
        ),
    ]
    """
)


def statuses_in_table(printed: str) -> dict[str, str]:
    """Component name to status from the table `up` prints (a folded detail continues on rows whose
    first cell is empty)."""
    found = {}
    for line in printed.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if len(cells) >= 2 and cells[0] and cells[0] != "component":
            found[cells[0]] = cells[1]
    return found


def test_failures_are_reported_per_component_and_the_rest_still_runs(
    stack_env: StackEnv, tmp_path: Path
) -> None:
    (tmp_path / "broken_components").mkdir()
    (tmp_path / "broken_components" / "component.py").write_text(BROKEN_COMPONENTS)
    stack_env.env["FLEETSIGHT_COMPONENT_PATH"] = str(tmp_path)

    result = stack_env.cli("up", "needs-the-broken-one", "not-installed", "slack-sink", check=False)
    assert result.returncode == 1
    # What `up` printed once every component had settled.
    reported = statuses_in_table(result.stdout)
    assert reported == {
        "crashes-at-start": "failed",
        "needs-the-broken-one": "skipped",
        "not-installed": "skipped",
        "slack-sink": "ready",
    }, result.stdout
    # The supervisor retries it with its back-off; it stays failed (never a flickering status) while
    # no attempt gets ready.
    wait_until(
        lambda: component_state(stack_env)["crashes-at-start"]["restarts"] >= 2,
        timeout=30,
        what="the supervisor to retry the component that crashed at start twice",
    )
    states = component_state(stack_env)
    assert states["crashes-at-start"]["status"] == "failed"
    assert "exited with code 3" in states["crashes-at-start"]["detail"]
    assert states["needs-the-broken-one"]["status"] == "skipped"
    assert "dependency failed: crashes-at-start" in states["needs-the-broken-one"]["detail"]
    assert states["not-installed"]["status"] == "skipped"
    assert states["slack-sink"]["status"] == "ready"
    assert httpx.get(stack_env.url("slack_sink", "/")).status_code == 200


SLOW_STOPPING_COMPONENTS = textwrap.dedent(
    """
    import sys
    from fleetsight.components import Component

    # Takes 13 s to exit on SIGTERM (as rsyslogd can, waiting for librdkafka), then notes that it did.
    CHILD = '''
    import pathlib, signal, sys, time
    folder, name = pathlib.Path(sys.argv[1]), sys.argv[2]
    def on_term(signum, frame):
        time.sleep(13)  # the slow shutdown under test, not a synchronisation
        (folder / f"{name}.clean").write_text("exited after SIGTERM")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    (folder / f"{name}.ready").write_text("handler installed")
    while True:
        time.sleep(1)
    '''

    def slow(name, **options):
        return Component(
            name=name,
            description="takes 13 s to exit on SIGTERM",
            command=lambda s: [sys.executable, "-c", CHILD, str(s.run_dir), name],
            ready=lambda s: (s.run_dir / f"{name}.ready").exists(),
            default=False,
            **options,
        )

    COMPONENTS = [slow("slow-with-time", stop_timeout_s=25.0), slow("slow-default")]
    """
)


def test_a_component_gets_its_own_stop_timeout_before_sigkill(stack_env: StackEnv, tmp_path: Path) -> None:
    (tmp_path / "slow_components").mkdir()
    (tmp_path / "slow_components" / "component.py").write_text(SLOW_STOPPING_COMPONENTS)
    stack_env.env["FLEETSIGHT_COMPONENT_PATH"] = str(tmp_path)
    stack_env.cli("up", "slow-with-time", "slow-default")

    stack_env.cli("down")
    log = (stack_env.run_dir / "logs" / "supervisor.log").read_text()
    # Given 25 s, it finishes its 13-s shutdown; the other keeps the default 10 s and is killed.
    assert (stack_env.run_dir / "slow-with-time.clean").exists(), log
    assert "event=kill component=slow-with-time" not in log
    assert "event=stopped component=slow-with-time code=0" in log
    assert not (stack_env.run_dir / "slow-default.clean").exists()
    assert "event=kill component=slow-default" in log and "after_s=10.0" in log
