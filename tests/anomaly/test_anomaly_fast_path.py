"""The fast path for large slowdowns (issue 42), on the detector alone with constructed windows: a node
30 % slower than its peers, which wait for it, is flagged in the first window that shows it and says so
(``path: fast``); a 10 % one is left to the slower paths; a job-wide slowdown, a node whose own samples
jump for one window while its peers carry on, and (with the fast path asking for two windows) a
one-window slowdown raise nothing. The slow path asks the same of its peers over its windows: a node
busier than peers who do not wait for it (busier than their usual themselves) is not flagged.

The windows follow a synchronous job's physics: a step is compute plus waiting; a node that computes
x f longer keeps its tensor pipes busy for its whole step, while every peer finishes early and waits,
so the peers' activity falls by the job's slowdown and the slow node's stays."""

from __future__ import annotations

import numpy as np

from anomaly.detector import Detector, DetectorConfig, Event
from anomaly.window import Window

NODES = [f"n{i:04d}" for i in range(1, 9)]
GPUS = 8
T0 = 1_800_000_000.0
SLOW = 4  # the straggler's row
COMPUTE = 0.4  # a healthy step's compute share: tensor activity ~0.40
CALM = 30  # windows before anything happens: the job's warm-up and learnt offsets


def _window(
    i: int,
    rng: np.random.Generator,
    factors: np.ndarray,
    blip: float = 1.0,
    idle: np.ndarray | None = None,
    blip_row: int = SLOW,
    noise: float = 0.01,
    lift: float = 1.0,
) -> Window:
    """One 30 s window of job "42": node n computes ``factors[n]`` times its usual time per step (the
    step lasts as long as the slowest node's compute plus the collective; waiting peers spin in NCCL,
    GPU utilisation 100 %); ``blip`` multiplies row ``blip_row``'s samples alone (its sampler landing in
    another phase: no one waits); ``idle[n]``: the share of node n's samples taken idle (a checkpoint);
    ``noise``: each GPU's relative noise; ``lift`` multiplies every node's activity (the job got busier)."""
    window = Window.empty(T0 + 30.0 * i, NODES, GPUS)
    shape = (len(NODES), GPUS)
    step = COMPUTE * factors.max() + (1.0 - COMPUTE)
    running = 1.0 - (idle if idle is not None else np.zeros(len(NODES)))
    busy = COMPUTE * factors / step * running
    tensor = lift * busy[:, None] * (1.0 + rng.normal(0.0, noise, shape)) + 0.005
    tensor[blip_row] *= blip
    window.tensor = tensor
    window.power = 100.0 + 850.0 * tensor + rng.normal(0.0, 3.0, shape)
    window.sm_clock = np.full(shape, 1980.0)
    window.util = np.repeat(100.0 * running[:, None], GPUS, axis=1)
    window.jobs = {"42": list(range(len(NODES)))}
    window.gpu_model = dict.fromkeys(range(len(NODES)), "H100")
    return window


def _run(
    straggler: list[float],
    job_wide: list[float] | None = None,
    blips: list[float] | None = None,
    idle: dict[int, np.ndarray] | None = None,
    blip_row: int = SLOW,
    noise: float = 0.01,
    lift: float = 1.0,
    **config: float | None,
) -> list[Event]:
    """CALM windows, then one per entry of ``straggler`` (the slow node's factor; ``job_wide``: every
    node's; ``blips``: the slow row's own jump; ``idle``: the nodes' idle shares, by window from the
    first of these; ``noise``, ``lift``: as for every window from the first); the detector's flag events."""
    rng = np.random.default_rng(11)
    # fast_windows 1 whatever the default: these tests are about the path itself
    detector = Detector(DetectorConfig(**{"fast_windows": 1, **config}))  # type: ignore[arg-type]
    events: list[Event] = []
    count = len(straggler)
    wide = job_wide or [1.0] * count
    jumps = blips or [1.0] * count
    for i, (slow, everyone, jump) in enumerate(
        zip([1.0] * CALM + straggler, [1.0] * CALM + wide, [1.0] * CALM + jumps, strict=True)
    ):
        factors = np.full(len(NODES), everyone)
        factors[SLOW] *= slow
        shares = (idle or {}).get(i - CALM)
        late = i >= CALM
        window = _window(i, rng, factors, jump, shares, blip_row, noise, lift if late else 1.0)
        events += detector.step(window).events
    return [e for e in events if e.kind == "flag"]


def _windows_to_flag(flag: Event) -> int:
    """Counted from the first window of the slowdown (window CALM ends at T0 + 30 * CALM)."""
    return round((flag.time - T0) / 30.0) - CALM + 1


def test_a_30_percent_straggler_is_flagged_by_the_fast_path_in_its_first_window() -> None:
    flags = _run([1.3] * 10)
    assert [(f.straggler.job, f.straggler.node) for f in flags] == [("42", NODES[SLOW])]
    flag = flags[0]
    assert _windows_to_flag(flag) <= 2, flag.time
    evidence = flag.straggler.evidence
    assert evidence["path"] == "fast"
    # Its peers wait for it: their activity fell by about the job's slowdown (x1.12 here).
    assert 0.08 <= evidence["peers_wait"] <= 0.15, evidence
    assert evidence["tensor_active"] > evidence["tensor_active_peers_median"]
    assert flag.straggler.cause == "unknown"


def test_a_10_percent_straggler_is_left_to_the_slower_paths() -> None:
    flags = _run([1.1] * 20)
    assert [f.straggler.node for f in flags] == [NODES[SLOW]]
    flag = flags[0]
    assert flag.straggler.evidence["path"] != "fast", flag.straggler.evidence
    assert _windows_to_flag(flag) >= 3, flag.time


def test_a_job_wide_slowdown_raises_nothing() -> None:
    """Every node 30 % slower (a slow collective, a throttled fabric): no node against its peers."""
    assert _run([1.0] * 10, job_wide=[1.3] * 10) == []


def test_a_node_whose_own_samples_jump_for_one_window_is_not_flagged() -> None:
    """One window where the node reads 30 % above its usual activity while its peers carry on as
    before: no one waited for it, so it is no large slowdown; one window is no persistence either."""
    assert _run([1.0] * 10, blips=[1.35] + [1.0] * 9) == []


def test_the_fast_path_can_ask_for_more_windows() -> None:
    """With ``fast_windows=2`` a one-window slowdown is not flagged, and a lasting one a window later."""
    assert _run([1.3] + [1.0] * 9, fast_windows=2) == []
    (flag,) = _run([1.3] * 10, fast_windows=2)
    assert flag.straggler.evidence["path"] == "fast"
    assert _windows_to_flag(flag) == 2


def test_a_checkpoint_edge_caught_in_some_nodes_samples_is_not_flagged() -> None:
    """Live, each node's samples come from its own scrape times: in the window where a checkpoint
    starts, most nodes were sampled idle half the time while a few were still computing in every
    sample. Those few look 2x busier than their peers, which look as if they waited; but the peers
    were idle, not waiting in NCCL (utilisation 50 %, not ~100 %). Then the checkpoint (everyone idle),
    and the edge where it ends, the other way round."""
    start = np.full(len(NODES), 0.5)
    start[[1, SLOW]] = 0.0
    end = np.full(len(NODES), 0.5)
    end[[2, 6]] = 0.0
    idle = {0: start, 1: np.ones(len(NODES)), 2: np.ones(len(NODES)), 3: end}
    assert _run([1.0] * 10, idle=idle) == []
    # Without the utilisation test the start edge's busiest node would be flagged at once.
    flags = _run([1.0] * 10, idle=idle, fast_util=0.0)
    assert [(f.straggler.evidence["path"], _windows_to_flag(f)) for f in flags] == [("fast", 1)]


def test_a_waiting_peer_that_tops_the_job_once_beside_a_flagged_straggler_is_not_flagged() -> None:
    """While a straggler is flagged its peers wait, and waiting activity scatters: one peer's window can
    read above the straggler's (mixed_day, job 5001: two peers at z 24-25 beside a flagged gray node).
    Its peers did wait, but for the flagged node: in a job with a flagged node the fast path is off."""
    blips = [1.0] * 5 + [1.6] + [1.0] * 4
    flags = _run([1.5] * 10, blips=blips, blip_row=2)
    assert [(f.straggler.node, f.straggler.evidence["path"]) for f in flags] == [(NODES[SLOW], "fast")]


def test_the_first_window_after_a_job_wide_pause_is_not_judged_fast() -> None:
    """Ranks come back from a checkpoint or an evaluation pass at staggered moments: the last one back
    computes while the others already wait, a straggler's look for one window. After a window where the
    whole job idled, a one-window slowdown raises nothing; the same window in steady training does."""
    pause = {0: np.ones(len(NODES))}
    assert _run([1.0, 1.3, 1.0, 1.0, 1.0], idle=pause) == []
    steady = _run([1.0, 1.3, 1.0, 1.0, 1.0])
    assert [f.straggler.evidence["path"] for f in steady] == ["fast"]


def test_the_fast_path_is_on_by_default_where_samples_average_5_s_and_off_under() -> None:
    """On by default where each sample averages dcgm-exporter's shipped 5 s (DetectorConfig.sample_average_s,
    the service's --dcgm-interval); off under fast_min_sample_s (1-s samples over-read a step's waits:
    docs/anomaly.md, "Sampling cadence"), where a 30 % straggler is flagged by the strong path, two
    windows in; off with fast_windows 0 too."""
    defaults = DetectorConfig()
    assert defaults.fast_windows == 1 and defaults.sample_average_s == 5.0
    (flag,) = _run([1.3] * 10, fast_windows=defaults.fast_windows)
    assert flag.straggler.evidence["path"] == "fast" and _windows_to_flag(flag) == 1
    for config in ({"sample_average_s": 1.0}, {"fast_windows": 0}):
        (flag,) = _run([1.3] * 10, **config)
        assert flag.straggler.evidence["path"] == "strong" and _windows_to_flag(flag) == 2, config


def test_the_slow_path_flags_a_mild_straggler_its_peers_wait_for() -> None:
    """A 9 % straggler in a noisy job (each GPU's samples 5 % apart: no single window says so) is the slow
    path's, and its peers wait for it: the flag carries the median of their wait over its windows."""
    flags = _run([1.094] * 30, noise=0.05)
    assert [(f.straggler.node, f.straggler.evidence["path"]) for f in flags] == [(NODES[SLOW], "slow")]
    assert 0.0 < flags[0].straggler.evidence["peers_wait"] <= 0.06, flags[0].straggler.evidence


def test_the_slow_path_does_not_flag_a_node_busier_than_peers_who_do_not_wait() -> None:
    """The same node 9 % busier than its peers, while they are 3 % busier than their usual level instead
    of waiting (gen_3025's mixture-of-experts job: one node busier by routing for four minutes): it paces
    no one and is not flagged in seven minutes. Without the peers' test (``slow_wait=None``) the slow path
    flags it. (Held for longer, the long path, which does not ask, flags it from its 16-window mean.)"""
    busier = {"blips": [1.094] * 14, "noise": 0.05, "lift": 1.03}
    assert _run([1.0] * 14, **busier) == []
    flags = _run([1.0] * 14, slow_wait=None, **busier)
    assert [(f.straggler.node, f.straggler.evidence["path"]) for f in flags] == [(NODES[SLOW], "slow")]
