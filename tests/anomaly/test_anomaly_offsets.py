"""How far a healthy GPU may sit from its peers and be learnt as normal (``max_offset``): a pipeline's
last stage does several per cent more work than the others (its LM head and loss), and a GPU's silicon
adds a few per cent of its own. A drawn benign day's 12-node 70B job (benign_day_4412: last stage +9 %,
one of its GPUs +4 % more) kept a 5 % residual over the old 8 % cap and was flagged 27 times on the
long path. The cap is what stops a fault present from the job's start from being learnt: a node 25 %
slower from its first window is still flagged."""

from __future__ import annotations

import numpy as np

from anomaly.detector import Detector, DetectorConfig, Event
from anomaly.window import Window

NODES = [f"n{i:04d}" for i in range(1, 13)]
GPUS = 8
COMPUTE = 0.4  # a middle stage's compute share of the step
STAGES = 4


def _window(i: int, rng: np.random.Generator, work: np.ndarray) -> Window:
    """Window ``i`` of a 12-node, 4-stage job: GPU (n, g) computes ``work[n, g]`` times a middle
    stage's work per step; the step lasts as long as the busiest GPU's compute plus the collective.
    Each GPU's window median varies by 3 % (the twin's middle-stage nodes spread so at 5-s samples;
    at 1 % the +13 % GPU reads z 7 in every window, which leaves every window disturbed and learns
    nothing at any cap)."""
    window = Window.empty(1_800_000_000.0 + 30.0 * i, NODES, GPUS)
    step = COMPUTE * work.max() + (1.0 - COMPUTE)
    window.tensor = COMPUTE * work / step * (1.0 + rng.normal(0.0, 0.03, work.shape))
    window.power = 100.0 + 850.0 * window.tensor
    window.sm_clock = np.full(work.shape, 1980.0)
    window.util = np.full(work.shape, 100.0)
    window.jobs = {"70": list(range(len(NODES)))}
    window.gpu_model = dict.fromkeys(range(len(NODES)), "H100")
    return window


def _flags(work: np.ndarray, windows: int, **config: float) -> list[Event]:
    rng = np.random.default_rng(3)
    detector = Detector(DetectorConfig(**config))  # type: ignore[arg-type]
    events: list[Event] = []
    for i in range(windows):
        events += detector.step(_window(i, rng, work)).events
    return [e for e in events if e.kind == "flag"]


def _last_stage_with_a_slow_gpu() -> np.ndarray:
    work = np.ones((len(NODES), GPUS))
    per_stage = len(NODES) // STAGES
    work[-per_stage:] *= 1.09  # the last stage: LM head and loss
    work[-1, 6] *= 1.04  # and one GPU there is a slow part of the silicon lottery
    return work


def test_a_last_stage_gpu_of_slow_silicon_is_learnt_as_normal() -> None:
    assert _flags(_last_stage_with_a_slow_gpu(), 240) == []  # two hours


def test_under_the_old_cap_the_same_gpu_was_flagged() -> None:
    flags = _flags(_last_stage_with_a_slow_gpu(), 240, max_offset=0.08)
    assert {e.straggler.node for e in flags} == {"n0012"}


def test_a_node_slow_from_its_first_window_is_still_flagged() -> None:
    work = np.ones((len(NODES), GPUS))
    work[4] *= 1.25
    flags = _flags(work, 60)
    assert [e.straggler.node for e in flags][:1] == ["n0005"]
