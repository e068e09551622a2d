"""A component slow to get ready on a busy machine: the supervisor waits its own time to get ready times
FLEETSIGHT_READY_PATIENCE, and gives up (failed, "not ready after") past it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from fleetsight.components import Component
from fleetsight.settings import Settings
from fleetsight.supervisor import Supervisor, read_state

READY_AFTER_S = 2.0  # the slow component answers ready this long after it was spawned


def slow_component(spawned: list[float]) -> Component:
    def ready(_: Settings) -> bool:
        return time.monotonic() - spawned[0] >= READY_AFTER_S

    return Component(
        name="slow",
        description="a process that gets ready late",
        command=lambda _: [sys.executable, "-c", "import time; time.sleep(60)"],
        ready=ready,
        ready_timeout_s=1.0,
    )


def start(tmp_path: Path, patience: float) -> tuple[bool, dict]:
    settings = Settings(run_dir=tmp_path / f"run-{patience}", ready_patience=patience)
    settings.run_dir.mkdir(parents=True)
    spawned: list[float] = []
    component = slow_component(spawned)
    supervisor = Supervisor(settings, [component])
    supervisor.spawn(component)
    spawned.append(time.monotonic())
    try:
        ready = supervisor.wait_ready(component)
    finally:
        supervisor.stop_one(component.name)
    return ready, read_state(settings)["components"][0]


def test_without_patience_a_slow_component_fails_with_its_time(tmp_path: Path) -> None:
    ready, state = start(tmp_path, patience=1.0)
    assert not ready
    assert (state["status"], state["detail"]) == ("failed", "not ready after 1s")


def test_with_patience_the_same_component_gets_ready(tmp_path: Path) -> None:
    ready, state = start(tmp_path, patience=4.0)
    assert ready, state
    assert state["status"] in ("ready", "stopped")


@pytest.mark.parametrize("value", ["0.5", "eleven", "11"])
def test_a_patience_out_of_range_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("FLEETSIGHT_READY_PATIENCE", value)
    with pytest.raises(ValueError, match="FLEETSIGHT_READY_PATIENCE"):
        Settings()


def test_the_tests_own_stacks_are_given_patience() -> None:
    assert Settings().ready_patience == 2.0  # tests/conftest.py
