"""Whether a job wanders by itself (expert routing) is remembered: the drift gauge reads a lull in the
routing as calm (a drawn benign day's 3-node MoE job dipped below ``wander_drift`` for minutes after
nine hours at 0.08-0.20, and its busiest node was flagged on the long path then), so a job counts as
wandering for ``wander_memory`` counted windows after its gauge last read above, and then no longer;
``wander_memory = 0`` is the gauge alone (docs/anomaly.md, "Routing that moves at once"). And a job
that wandered is presumed to wander in its next layout until that layout's gauge has learnt
(``wander_carry``; docs/anomaly.md, "A new layout and a pipeline's last stage"). And in a wandering job a
mild candidate is held longer than a loud one (``wander_hold_persistent``; docs/anomaly.md, "How long a
wander lasts"). And in a wandering job a drifting node's offset learnt below its peers thaws back
up to 0 (``wander_thaw``; docs/anomaly.md, "An offset learnt in a low spell")."""

from __future__ import annotations

import math

import numpy as np
from anomaly_helpers import benign_day_flags

from anomaly.covariance import OutlierModel
from anomaly.detector import Detector, DetectorConfig
from anomaly.job_model import learn, new_job_state
from anomaly.paths import note_wander, wanders
from anomaly.state import Candidate, JobState
from anomaly.window import Window

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


# A job that routes experts still does after it restarts elsewhere (job_resize): the new layout's gauge
# starts afresh and reads calm while the wander builds up (two drawn benign days' MoE jobs were flagged
# 10-25 minutes into a new layout), so a new layout of a job that wandered is presumed to wander until
# its own gauge has its full pool; a job that never wandered is not.

FLEET = [f"n{i:04d}" for i in range(1, 7)]
FIRST, SECOND = [0, 1, 2], [3, 4, 5]


def _routed_window(i: int, rng: np.random.Generator, rows: list[int] | None, routing: bool) -> Window:
    """Window ``i`` of job "7" on ``rows`` (None: the job is between layouts): with ``routing``, one
    node 25 % busier than the others, a different one every six windows (expert routing)."""
    window = Window.empty(1_800_000_000.0 + 30.0 * i, FLEET, 8)
    load = np.ones(len(FLEET))
    if rows is not None and routing:
        load[rows[(i // 6) % len(rows)]] = 1.25
    window.tensor = 0.4 * load[:, None] * (1.0 + rng.normal(0.0, 0.01, (len(FLEET), 8)))
    window.power = 100.0 + 850.0 * window.tensor
    window.sm_clock = np.full((len(FLEET), 8), 1980.0)
    window.util = np.full((len(FLEET), 8), 100.0)
    window.jobs = {} if rows is None else {"7": rows}
    window.gpu_model = dict.fromkeys(range(len(FLEET)), "H100")
    return window


def _second_layout_wandering(routing: bool, carry: bool = True, gap: int = 2) -> list[bool]:
    """80 windows on the first layout (routing or dense), ``gap`` windows without the job, then 80
    calm windows on the second layout: per window there, does the job count as wandering?"""
    cfg = DetectorConfig(wander_carry=carry)
    detector = Detector(cfg)
    rng = np.random.default_rng(5)
    for i in range(80):
        detector.step(_routed_window(i, rng, FIRST, routing))
    assert detector.jobs["7"].wandered == routing  # the routing did read as wander on the first layout
    for i in range(80, 80 + gap):
        detector.step(_routed_window(i, rng, None, False))
    seen = []
    for i in range(80 + gap, 160 + gap):
        detector.step(_routed_window(i, rng, SECOND, False))
        state = detector.jobs["7"]
        seen.append(wanders(cfg, state))
    assert not detector.jobs["7"].wandered  # the second layout's own gauge never read a wander
    return seen


def test_a_new_layout_of_a_job_that_wandered_is_presumed_to_wander_until_its_gauge_has_learnt() -> None:
    seen = _second_layout_wandering(routing=True)
    assert seen[0] and seen[20]  # from the new layout's first window, across the gap
    assert not seen[-1]  # its own full pool read calm: the gauge decides again
    first_calm = seen.index(False)
    assert all(seen[:first_calm]) and not any(seen[first_calm:])


def test_a_new_layout_of_a_job_that_never_wandered_is_not_presumed_to() -> None:
    assert not any(_second_layout_wandering(routing=False))


def test_without_the_carry_a_new_layout_starts_from_its_gauge_alone() -> None:
    assert not _second_layout_wandering(routing=True, carry=False)[0]


# A mild candidate in a wandering job waits wander_hold_persistent windows, a loud one wander_hold:
# MoE expert load also wanders slowly by itself (the twin's ~10-minute memory), and with a routing
# span on top it kept a drawn day's node busiest for 9.5 minutes while three others took their turns.
def test_a_mild_candidate_that_outlasts_the_routing_turns_is_held_for_ten_minutes() -> None:
    """benign_day_4420's 8-node MoE job 84203, its first 140 minutes: n0015 was a candidate for 19
    windows (128-137.5 min, z ~4), three other nodes busiest meanwhile. The 12-window hold flagged it
    on the persistent path; the 20-window hold for mild candidates does not. Shown without the offset
    thaw (``wander_thaw``, session 50) and without the bytes-received test (``routing_traffic``, session
    52), either of which also keeps n0015 unflagged here."""
    frozen = {"wander_thaw": False, "routing_traffic": 0.0}
    flags = benign_day_flags(
        "benign_day_4420", 140, frozen=frozen, hold12={**frozen, "wander_hold_persistent": 12}
    )
    assert flags["shipped"] == [], [f.as_dict() for f in flags["shipped"]]
    assert flags["frozen"] == [], [f.as_dict() for f in flags["frozen"]]
    (flag,) = flags["hold12"]
    assert (flag.job, flag.node, flag.evidence["path"]) == ("84203", "n0015", "persistent"), flag.evidence
    assert 12 <= flag.evidence["wander_windows"] < 20, flag.evidence


def _offset_after(cfg: DetectorConfig, mu: float, wandering: bool, windows: int = 1) -> float:
    """n0001 of a 3-node job, past its first windows, with a learnt offset ``mu`` and a slow-path mean
    at the drift bar (it counts as drifting away, so it no longer learns), runs 10 % above its peers
    for ``windows`` calm windows: its offset afterwards."""
    state = new_job_state(cfg, NODES, 8)
    state.count[:] = cfg.min_history
    state.mu[0] = mu
    state.slow_mean = np.zeros((len(NODES), 8))
    state.slow_mean[0] = cfg.slow_min_effect / 2
    window = Window.empty(0.0, NODES, 8)
    window.tensor[:] = 0.5
    window.tensor[0] = 0.5 * math.exp(0.10)
    shape = (len(NODES), 8)
    zeros = np.zeros(shape)
    candidate = Candidate(
        "1", zeros, np.zeros((len(NODES) * 8, 3)), [0, 1, 2], math.nan, zeros == 0, zeros, zeros
    )
    model = OutlierModel(cfg)
    for _ in range(windows):
        learn(cfg, state, candidate, window, np.zeros(len(NODES), dtype=bool), model, wandering)
    return float(state.mu[0].mean())


def test_a_drifting_node_of_a_wandering_job_learns_back_up_to_its_peers_and_no_further() -> None:
    """benign_day_4433's n0020 learnt -12 % in a low spell of its MoE job's expert load, then ran 7-12 %
    above that by residual once the load came back, frozen as drifting: flagged at routing turns."""
    cfg = DetectorConfig()
    assert cfg.wander_thaw
    once = _offset_after(cfg, -0.12, wandering=True)
    assert -0.12 < once < 0.0, once
    assert _offset_after(cfg, -0.12, wandering=True, windows=200) == 0.0  # it thaws, and stops at 0


def test_a_drifting_node_stays_frozen_where_the_job_is_calm_or_its_offset_is_not_below_0() -> None:
    """A gray node setting in sits near 0 and rises; a calm job's drift is no routing: neither learns."""
    cfg = DetectorConfig()
    assert _offset_after(cfg, -0.12, wandering=False) == -0.12
    assert _offset_after(cfg, 0.02, wandering=True) == 0.02
    assert _offset_after(cfg, 0.0, wandering=True) == 0.0
    frozen = DetectorConfig(wander_thaw=False)
    assert _offset_after(frozen, -0.12, wandering=True) == -0.12


def test_a_node_whose_offset_was_learnt_low_is_not_flagged_when_the_load_comes_back() -> None:
    """benign_day_4435's 8-node MoE job 84351, its first 172 minutes: frozen at the offset it learnt in
    a low spell, n0012 was flagged at 169.5 minutes; thawed (shipped), nothing is. Without the
    bytes-received test (``routing_traffic``), which would withhold that flag by itself."""
    flags = benign_day_flags("benign_day_4435", 172, frozen={"wander_thaw": False, "routing_traffic": 0.0})
    assert flags["shipped"] == [], [f.as_dict() for f in flags["shipped"]]
    assert [(f.job, f.node) for f in flags["frozen"]] == [("84351", "n0012")], flags["frozen"]
