"""Blind nodes (issue 41, docs/anomaly.md "Blind nodes"), on the detector alone with constructed windows: a
node whose profiling fields read 0 while its power says it computes (DCGM's profiling module held by
another client), one that publishes power but no profiling field, and one with no sample at all (its
dcgm-exporter silent) is neither flagged nor lets its peers look like stragglers; it is reported blind
with its reason, and a real straggler beside it is still flagged."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from anomaly.detector import Blind, Detector, DetectorConfig, Event
from anomaly.service import blind_family
from anomaly.window import Window

NODES = [f"n{i:04d}" for i in range(1, 7)]
GPUS = 8
T0 = 1_800_000_000.0
Z = DetectorConfig().z_threshold


def _window(
    i: int,
    rng: np.random.Generator,
    names: list[str] = NODES,
    *,
    slow: Iterable[str] = (),
    dropped: Iterable[str] = (),
    silent: Iterable[str] = (),
    nan_rows: Iterable[str] = (),
    checkpoint: bool = False,
) -> Window:
    """One 30 s window of job "42" on ``names``: every GPU at ~0.40 tensor activity and ~500 W; ``slow``
    nodes are stragglers (busier: x1.4, more power); ``dropped`` nodes' profiling reads 0 while their
    power stays; ``silent`` nodes have no sample (the source leaves them out of the window and of the
    job); ``nan_rows`` are rows without a value (the evaluation's window of a silent node); a checkpoint
    idles everyone (tensor ~0.01, ~110 W)."""
    present = [n for n in names if n not in set(silent)]
    window = Window.empty(T0 + 30.0 * i, present, GPUS)
    shape = (len(present), GPUS)
    tensor = 0.40 * (1.0 + rng.normal(0.0, 0.01, shape))
    power = 500.0 + 300.0 * (tensor - 0.40) + rng.normal(0.0, 3.0, shape)
    for row, name in enumerate(present):
        if name in set(slow):
            tensor[row] *= 1.4
            power[row] += 40.0
    if checkpoint:
        tensor = np.full(shape, 0.01)
        power = 110.0 + rng.normal(0.0, 3.0, shape)
    for row, name in enumerate(present):
        if name in set(dropped):
            tensor[row] = 0.0
        if name in set(nan_rows):
            tensor[row] = power[row] = np.nan
    window.tensor, window.power = tensor, power
    window.sm_clock = np.full(shape, 1980.0)
    window.util = np.full(shape, 100.0)
    window.jobs = {"42": list(range(len(present)))}
    window.gpu_model = dict.fromkeys(range(len(present)), "H100")
    return window


def _flags(events: list[Event]) -> list[tuple[str, str]]:
    return [(e.straggler.job, e.straggler.node) for e in events if e.kind == "flag"]


def _blind(blind: list[Blind]) -> list[tuple[str, str, str, list[int]]]:
    return [(b.job, b.node, b.reason, b.gpus) for b in blind]


def test_a_node_reading_zero_at_full_power_is_blind_not_a_straggler_nor_its_peers_drag() -> None:
    """A 3-node job, where one node at 0 pulled each peer's leave-one-out median halfway down: both
    healthy peers were flagged (z ~10 on the twin's profiling_dropout). Now the node is taken out before
    the medians: no flag, no score for it, the peers' scores stay low, and it is reported blind."""
    names = NODES[:3]
    rng = np.random.default_rng(1)
    detector = Detector()
    events: list[Event] = []
    for i in range(40):
        result = detector.step(_window(i, rng, names, dropped=["n0002"] if i >= 8 else []))
        events += result.events
        if i < 8:
            assert result.blind == []
            continue
        assert _blind(result.blind) == [("42", "n0002", "profiling_dropout", list(range(GPUS)))]
        assert result.blind[0].since == T0 + 30.0 * 8
        assert not [s for s in result.scores if s[1] == "n0002"], "a blind node is not scored"
        assert max(score for *_, score in result.scores) < Z, result.scores
    assert _flags(events) == []


def test_a_straggler_beside_a_blind_node_is_still_flagged() -> None:
    rng = np.random.default_rng(2)
    detector = Detector()
    events: list[Event] = []
    for i in range(30):
        result = detector.step(
            _window(i, rng, dropped=["n0002"] if i >= 8 else [], slow=["n0005"] if i >= 15 else [])
        )
        events += result.events
        if i >= 8:
            assert _blind(result.blind) == [("42", "n0002", "profiling_dropout", list(range(GPUS)))]
    assert _flags(events) == [("42", "n0005")]
    (flag,) = [e for e in events if e.kind == "flag"]
    assert flag.time <= T0 + 30.0 * 18
    assert flag.straggler.evidence["tensor_active_peers_median"] > 0.3, "the blind node is no peer"


def test_a_flag_holds_while_its_node_is_blind() -> None:
    """A flagged straggler whose profiling drops (someone attaches Nsight to see why it is slow) is not
    cleared for reading 0: the flag holds, the node is reported blind, and it clears once the node is
    seen again and no longer slow."""
    rng = np.random.default_rng(3)
    detector = Detector()
    events: list[Event] = []
    for i in range(50):
        slow = ["n0005"] if 10 <= i < 35 else []
        dropped = ["n0005"] if 20 <= i < 30 else []
        result = detector.step(_window(i, rng, slow=slow, dropped=dropped))
        events += result.events
        if 20 <= i < 30:
            assert _blind(result.blind) == [("42", "n0005", "profiling_dropout", list(range(GPUS)))]
            assert [(s.job, s.node) for s in detector.flagged()] == [("42", "n0005")]
    assert [(e.kind, e.straggler.node) for e in events] == [("flag", "n0005"), ("clear", "n0005")]
    (clear,) = [e for e in events if e.kind == "clear"]
    assert clear.time >= T0 + 30.0 * 35


def test_blind_holds_through_a_checkpoint_until_tensor_activity_returns() -> None:
    """In a checkpoint every GPU idles, so power no longer tells the module's silence from an idle GPU:
    the node stays blind (same since) until its tensor activity reads again."""
    rng = np.random.default_rng(4)
    detector = Detector()
    events: list[Event] = []
    for i in range(45):
        dropped = ["n0002"] if 8 <= i < 30 else []
        result = detector.step(_window(i, rng, dropped=dropped, checkpoint=20 <= i < 23))
        events += result.events
        if 8 <= i < 30:
            assert [(b.node, b.reason, b.since) for b in result.blind] == [
                ("n0002", "profiling_dropout", T0 + 30.0 * 8)
            ], i
        else:
            assert result.blind == [], i
    assert _flags(events) == []


def test_what_reads_zero_without_working_is_not_blind_and_absent_profiling_is() -> None:
    """The busy rule: half the median power of the cycle's computing GPUs of the model (here ~500 W, so
    250 W), and at least 250 W. A job hung in NCCL (tensor 0 at ~190 W) or idle is not blind; a GPU that
    publishes power but no tensor activity is (profiling_absent); where no GPU of a model computes, 250 W
    decides; a one-node job is reported too."""
    rng = np.random.default_rng(5)
    names = [f"n{i:04d}" for i in range(1, 15)]
    jobs = {
        "computing": list(range(0, 6)),
        "hung": list(range(6, 9)),
        "no-prof": list(range(9, 11)),
        "other-model": list(range(11, 13)),
        "alone": [13],
    }
    detector = Detector()
    for i in range(12):
        window = Window.empty(T0 + 30.0 * i, names, GPUS)
        tensor = 0.40 * (1.0 + rng.normal(0.0, 0.01, (len(names), GPUS)))
        power = 500.0 + rng.normal(0.0, 3.0, tensor.shape)
        tensor[6:9], power[6:9] = 0.0, 190.0  # waiting in NCCL for a peer that hangs
        tensor[9, 3] = np.nan  # GPU 3 of n0010: power, no profiling field
        tensor[11:13], power[11], power[12] = 0.0, 300.0, 120.0  # no computing GPU of this model
        tensor[13] = 0.0  # a one-node job
        window.tensor, window.power = tensor, power
        window.sm_clock = np.full(tensor.shape, 1980.0)
        window.jobs = jobs
        window.gpu_model = {row: "L40S" if row in (11, 12) else "H100" for row in range(len(names))}
        result = detector.step(window)
        assert _flags(result.events) == []
    assert sorted(_blind(result.blind)) == [
        ("alone", "n0014", "profiling_dropout", list(range(GPUS))),
        ("no-prof", "n0010", "profiling_absent", [3]),
        ("other-model", "n0012", "profiling_dropout", list(range(GPUS))),
    ]


def test_gpus_waiting_at_zero_stay_seen_where_the_computing_ones_draw_little() -> None:
    """A pipeline job full of bubbles: its computing GPUs' median is ~350 W, half of which (175 W) is
    under a GPU that waits in NCCL a whole window at tensor 0 (~190-210 W). The 250 W floor keeps such
    waits seen (psu_cap150_16n on the twin reported most of its 70B job blind without it); a GPU at 0
    that draws what computing ones do is still blind."""
    rng = np.random.default_rng(9)
    detector = Detector()
    for i in range(10):
        window = _window(i, rng)
        window.power = 350.0 + rng.normal(0.0, 3.0, window.power.shape)
        window.tensor[1, :4], window.power[1, :4] = 0.0, 210.0  # n0002: four GPUs wait all window
        window.tensor[3], window.power[3] = 0.0, 340.0  # n0004: its profiling reads 0
        result = detector.step(window)
    assert _blind(result.blind) == [("42", "n0004", "profiling_dropout", list(range(GPUS)))]


def test_a_silent_node_is_reported_and_its_job_keeps_its_state_and_flags() -> None:
    """n0003's dcgm-exporter stops answering: the source's window then has no row for it and the job
    lists only the others. Before, the job's new node list started it afresh (its straggler's flag
    vanished without a clear, its history with it). Now n0003 is reported no_samples, the job keeps its
    state, and the straggler stays flagged. The evaluation's window of a silent node (a row of NaN)
    reads the same."""
    for how in ("left_out", "nan_row"):
        rng = np.random.default_rng(6)
        detector = Detector()
        events: list[Event] = []
        state = None
        for i in range(45):
            gone = ["n0003"] if 20 <= i < 30 else []
            window = _window(
                i,
                rng,
                slow=["n0005"] if i >= 10 else [],
                silent=gone if how == "left_out" else [],
                nan_rows=gone if how == "nan_row" else [],
            )
            result = detector.step(window)
            events += result.events
            if i == 19:
                state = detector.jobs["42"]
            if 20 <= i < 30:
                assert _blind(result.blind) == [("42", "n0003", "no_samples", [])], (how, i)
                assert detector.jobs["42"] is state, how
            elif i >= 30:
                assert result.blind == [], (how, i)
        assert detector.jobs["42"] is state, how
        assert [(e.kind, e.straggler.node) for e in events] == [("flag", "n0005")], how
        assert [s.node for s in detector.flagged()] == ["n0005"]


def test_a_node_that_left_the_job_is_no_silent_member() -> None:
    """A node that answers but is no longer in the job (it left, idles or runs another job) is a new
    layout, as before: not reported."""
    rng = np.random.default_rng(7)
    detector = Detector()
    for i in range(12):
        window = _window(i, rng)
        if i >= 8:
            window.jobs = {"42": [0, 1, 3, 4, 5], "43": [2]}
        result = detector.step(window)
    assert result.blind == []
    assert detector.jobs["42"].nodes == ("n0001", "n0002", "n0004", "n0005", "n0006")


def test_the_blind_metric_names_cluster_node_job_and_reason() -> None:
    rng = np.random.default_rng(8)
    detector = Detector()
    for i in range(10):
        window = _window(i, rng, dropped=["n0002"] if i >= 5 else [], silent=["n0004"] if i >= 7 else [])
        window.node_cluster = dict.fromkeys(range(len(window.nodes)), "east")
        result = detector.step(window)
    samples = blind_family(result.blind, cluster="default").samples
    assert [(s.name, s.labels, s.value) for s in samples] == [
        (
            "fleetsight_anomaly_node_blind",
            {"cluster": "east", "node": "n0002", "hpc_job": "42", "reason": "profiling_dropout"},
            1.0,
        ),
        (
            "fleetsight_anomaly_node_blind",
            {"cluster": "east", "node": "n0004", "hpc_job": "42", "reason": "no_samples"},
            1.0,
        ),
    ]
    assert result.blind[0].as_dict() == {
        "hpc_job": "42",
        "node": "n0002",
        "reason": "profiling_dropout",
        "gpus": list(range(GPUS)),
        "since": T0 + 30.0 * 5,
    }
