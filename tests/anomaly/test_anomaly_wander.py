"""Whether a job wanders by itself (expert routing) is remembered: the drift gauge reads a lull in the
routing as calm (a drawn benign day's 3-node MoE job dipped below ``wander_drift`` for minutes after
nine hours at 0.08-0.20, and its busiest node was flagged on the long path then), so a job counts as
wandering for ``wander_memory`` counted windows after its gauge last read above, and then no longer;
``wander_memory = 0`` is the gauge alone (docs/anomaly.md, "Routing that moves at once")."""

from __future__ import annotations

import numpy as np

from anomaly.detector import DetectorConfig
from anomaly.job_model import new_job_state
from anomaly.paths import note_wander, wanders
from anomaly.state import JobState

NODES = ["n0001", "n0002", "n0003"]


def _job(cfg: DetectorConfig, level: float) -> JobState:
    """A 3-node job whose last slow-path means all sit ``level`` (log) from their usual: its gauge."""
    state = new_job_state(cfg, NODES, 8)
    for _ in range(cfg.noise_windows):
        state.drift.append(np.full((len(NODES), 8), level))
    return state


def _windows_wandering_after_the_gauge_falls(cfg: DetectorConfig, windows: int) -> list[bool]:
    """The gauge reads routing (0.1) for a window, then calm (0.01) for ``windows`` counted windows."""
    state = _job(cfg, 0.1)
    assert note_wander(cfg, state, 0.1) and wanders(cfg, state)
    state.drift.clear()
    state.drift.extend(np.full((len(NODES), 8), 0.01) for _ in range(cfg.noise_windows))
    return [note_wander(cfg, state, 0.01) and wanders(cfg, state) for _ in range(windows)]


def test_a_job_that_wandered_still_wanders_for_wander_memory_counted_windows() -> None:
    cfg = DetectorConfig()
    assert cfg.wander_memory == 40
    seen = _windows_wandering_after_the_gauge_falls(cfg, 60)
    assert seen == [True] * (cfg.wander_memory - 1) + [False] * (60 - cfg.wander_memory + 1)


def test_a_new_reading_above_the_gauge_starts_the_memory_again() -> None:
    cfg = DetectorConfig(wander_memory=10)
    state = _job(cfg, 0.01)
    assert not wanders(cfg, state)  # a dense job: its gauge under wander_drift and nothing remembered
    note_wander(cfg, state, 0.1)
    for _ in range(5):
        note_wander(cfg, state, 0.01)
    note_wander(cfg, state, 0.1)  # routing moves again
    assert [note_wander(cfg, state, 0.01) for _ in range(10)] == [True] * 9 + [False]


def test_without_memory_the_gauge_alone_decides() -> None:
    cfg = DetectorConfig(wander_memory=0)
    assert _windows_wandering_after_the_gauge_falls(cfg, 3) == [False, False, False]
    assert wanders(cfg, _job(cfg, 0.1)) and not wanders(cfg, _job(cfg, 0.01))
