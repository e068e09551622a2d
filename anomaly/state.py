"""What the straggler detector is configured with, what it keeps per job and node between cycles, and
what it reports (flags, events, each cycle's result). Data only: the scoring is in detector.py and
job_model.py, the cause of a flag in cause.py."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

CAUSES = ("power_brake", "thermal", "pcie", "clocks", "network", "unknown")
# Why the detector cannot see a node of a job (docs/anomaly.md, "Blind nodes"): its profiling fields read 0
# while its power says it works (DCGM's profiling module held by another client), it publishes power but no
# profiling field, or it has no sample at all (its dcgm-exporter is silent).
BLIND_REASONS = ("profiling_dropout", "profiling_absent", "no_samples")


@dataclass(frozen=True)
class DetectorConfig:
    z_threshold: float = 4.0  # a candidate GPU's robust z of tensor activity above its peers
    z_strong: float = 5.0  # strong enough for two windows in a row (or one with a hardware signal) ...
    strong_effect: float = 0.16  # ... with a residual at least this (log): twice the largest benign
    # effect (OS jitter, up to 8 % for up to 3 minutes, plus a window's noise reaches z 5 at times)
    slow_windows: int = 8  # the slow path: mean residual over this many counted windows ...
    slow_min_effect: float = 0.08  # ... at least this (log, ~8 % slower than its peers) and z >= z_threshold
    own_drop: float = 0.05  # a straggler keeps (log) its own usual activity; waiting peers fall below it
    min_scale: float = 0.02  # floor of the scale: 2 % relative, below a window median's noise
    # The largest systematic offset a healthy GPU may learn: a pipeline's last stage does up to ~10 % more
    # work (its LM head and loss; the benign days draw 3-10 %) and a GPU's silicon adds ~4 % (a part 2.5 %
    # slower that draws 7 % more power and clocks lower). At 0.08 a drawn day's last-stage GPU of a 12-node
    # 70B job (+9 % stage, such a part: +13 %) kept a 5 % residual for 16 hours and was flagged 27 times
    # on the long path (benign_day_4412).
    max_offset: float = 0.14
    # A GPU's first windows teach nothing where they lie more than offset_first_limit from its peers (a
    # restart's uneven start-up: the demo's +27 %, +26 %, -69 %); later, one window moves an offset by at
    # most alpha x offset_step (a checkpoint's first window catching one node idle). Both as they were
    # when the cap was 0.08: raised with it, a hand-written 10 % straggler was found 45 s later (p95).
    offset_first_limit: float = 0.16
    offset_step: float = 0.08
    history_alpha: float = 0.03  # weight of a new window in a GPU's history (~30 windows of memory;
    # the first windows average with equal weights so that layout offsets are learnt at once)
    min_history: int = 6  # windows before a GPU's own spread counts in its scale
    k: int = 6  # a mild candidate (z_threshold..z_strong) must hold in k ...
    n: int = 7  # ... of the last n counted windows (longer than benign jitter lasts)
    slow_k: int = 2  # slow-path candidates in a row (on top of its 8-window average)
    # The long path (issue 42: 5 % stragglers within 15 minutes): the mean residual over long_windows
    # counted windows (8 minutes) at least long_min_effect and z_threshold scales of that mean (a
    # window's scale over sqrt(long_windows), widened by the job's drift), long_k windows in a row.
    # OS jitter (<= 8 % for <= 3 minutes) adds at most 0.03 to a 16-window mean; healthy nodes' means
    # stayed at or under 0.04 on the benign training scenarios (pipeline bubbles); MoE jobs wander
    # further, and there (wander_drift) the long path needs a hardware signal, as the slow path does.
    # Nor while the job's last long_windows windows held a flagged node: waiting peers scatter, and a
    # peer's mean over a straggler's episode plus a minute of OS jitter after it crossed the floor
    # (gray_x15_16n at 5-s samples).
    long_windows: int = 16
    long_min_effect: float = 0.05
    long_k: int = 2
    # The slow path in jobs of fast_min_nodes nodes or more: the node's peers must wait for it, the
    # median over the slow path's windows of their activity below their own usual level (peers_wait)
    # above slow_wait. Physics: every peer of a straggler waits at each step; a node that is busier
    # than its peers while they are as busy as usual, or busier, paces nobody (gen_3025's 21-node
    # mixture-of-experts job, 13 minutes in: one node +9 % by routing for 4 minutes while its peers
    # sat 2-3 % *above* their usual level, flagged before the job's drift gauge had learnt that it
    # wanders). A median, because the window where a checkpoint starts idles some peers at once.
    # Where no peer has a usual level yet, nothing says they wait: no slow-path flag. None: off.
    slow_wait: float | None = 0.0
    short_windows: int = 4  # the slow path's short average: decides when significantly (z_threshold)
    # above slow_min_effect, so that a 15-20 % straggler in a noisy job is not left to the 8-window mean
    clear_after: int = 3  # counted windows without a candidate before a flag clears
    # The fast path (issue 42): a large slowdown is flagged after fast_windows counted windows in a row
    # instead of waiting for the persistence a mild one needs. One window's evidence must say so twice:
    # the node is a strong candidate (z_strong, strong_effect) whose residual is above the largest benign
    # effect (slow_min_effect) by fast_z scales of one window's noise; and its peers wait for it, their
    # own activity at least fast_wait (log) below their usual level (a node whose own samples jump while
    # its peers do not fall is a sampling blip, not a node the job waits for), and they still run kernels
    # (a checkpoint's edge caught in some nodes' samples and not in others' idles them instead).
    fast_z: float = 4.0
    fast_wait: float = 0.08  # the largest benign effect: OS jitter of up to 8 % makes the peers wait less
    # 1: on, where each sample averages at least fast_min_sample_s (sample_average_s: dcgm-exporter's
    # collection interval, 5 s as FleetSight ships it; the service's --dcgm-interval). With 1-s samples
    # the benign training day got 12 one-window flags: windows where the job stood still for one or two
    # of their six samples (a job-wide stall, a peer's data-loader hiccup), whose median is then the lower
    # tail of the 1-s samples of a pipelined step, so the one node that missed every wait tops its
    # falling peers. 5-s samples average most of a step: none (docs/anomaly.md, "Sampling cadence").
    fast_windows: int = 1
    sample_average_s: float = 5.0
    fast_min_sample_s: float = 5.0
    fast_util: float = 75.0  # the peers' median GPU utilisation (%): waiting in NCCL reads ~100, a node
    # idle in half of the window's samples (a checkpoint's edge) 50 or less
    fast_min_nodes: int = 4  # under four nodes the peers' wait is one or two nodes' fall, which expert
    # routing makes too (a 2-node MoE job's busier node: 0.30 above its peer, which fell 0.24, gen_3029)
    min_activity: float = 0.05  # the busiest node's tensor activity below this: nobody computes
    quiet_ratio: float = 0.5  # busiest node below this share of its usual level: the job moves together
    md_quantile: float = 0.999  # robust Mahalanobis distance quantile a candidate must pass
    mcd_rows: int = 1000  # calm rows kept for the covariance model (a reservoir over recent cycles)
    mcd_min_rows: int = 200  # no model (the z-score decides) before this many calm rows
    mcd_refit_every: int = 20  # cycles between refits of the model
    hardware_share: float = 0.5  # share of a window's samples with a throttle bit that counts as a signal
    # Cause "clocks": the GPU's SM clock this far below its peers' median with no throttle reason (the
    # H100's boost clock varies a few percent with temperature and load between healthy GPUs).
    clock_drop: float = 0.10
    few_nodes: int = 8  # jobs under this many nodes take their scale from their own recent windows
    # (a few nodes' cross-section swings by itself) and have the hardware path below
    hw_lower: float = 0.05  # small jobs' hardware path: power or SM clock (log) this far below the
    # peers' while busier than usual against them (slow_min_effect): the node does more with less
    step_after: int = 3  # small jobs' step path: the mean residual of the last few counted windows ...
    step_before: int = 8  # ... against the mean of the windows before them: a sudden, lasting rise
    wander_drift: float = 0.025  # a job whose 8-window means wander more than this (log) by
    # themselves needs a hardware signal on the slow path. Dense jobs' gauge stays at 0.009-0.016;
    # expert routing builds up over a job's first half hour, the gauge reading 0.025-0.035 there and
    # ~0.05 later, and at 0.04 the busiest node of a 38-node (gen_7319) or 3-node MoE job was flagged
    # while it built up
    # Expert routing moves a job's load to another node "every few minutes" (issue 42's moe_imbalance):
    # for those minutes the busiest node paces the job as a straggler of 5-20 % would. In a job whose
    # nodes wander so (wander_drift), a flag without a hardware signal waits until the node has been
    # a candidate for wander_hold windows (6 minutes: longer than the "every few minutes"
    # routing keeps a node busiest, up to 5 on the benign training day; at 5 minutes two of its routing
    # spans were flagged) with no clear_after quiet windows in a row between. Hardware flags are not
    # held (nor, where step_exempt_below says so, a small job's sudden lasting rise). A 40 %
    # straggler in an 8-node MoE job (moe_gray_x14_8n) is flagged 90 s later for it.
    wander_hold: int = 12
    # A mild candidate (the persistent path: z_threshold..z_strong in k of n windows) waits longer,
    # wander_hold_persistent windows (10 minutes). MoE expert load also wanders slowly by itself (the
    # twin: an Ornstein-Uhlenbeck walk with a 10-minute memory) and, added to a routing span, kept a
    # drawn day's 8-node MoE node 19-27 % above its peers for 9.5 minutes while three others took
    # their turns (benign_day_4420 n0015, z 4.1); gen_3008's 32-node MoE job was flagged so too. A
    # strong or fast candidate (a loud gray node) still waits wander_hold: holding every path 20
    # windows found a x1.5 gray node in a declared 4-node MoE job in 1 of 10 seeds instead of 6. Only
    # where the fast path runs (5-s samples): at 1-s samples a loud gray node comes through the mild
    # path, and moe_gray_x14_8n's x1.4 node took 12 windows of its 20-minute fault as it was.
    wander_hold_persistent: int = 20
    # The step path's hits were exempt from the hold (routing was taken to move load slowly), but the
    # twin's routing hands the busiest place to another node from one window to the next, a sudden
    # lasting rise: the benign training day's 4-node job 7205 was flagged twice so at 5-s samples, and
    # the drawn benign days' 2- and 3-node MoE jobs 14 times in 2,304 node-hours (bench/benign_days.py).
    # A step-path hit is exempt only in jobs under step_exempt_below nodes: 0, none (docs/anomaly.md,
    # "Benign days nobody tuned against"). The price: a loud gray node in a small MoE job is flagged
    # after the hold, not within it.
    step_exempt_below: int = 0
    # The drift gauge reads a lull in a job's routing as calm: a drawn benign day's 3-node MoE job
    # (benign_day_4401, gauge 0.08-0.20 for nine hours) dipped to 0.0245 for minutes and its busiest node
    # was flagged on the long path then; a new layout's gauge flickers across wander_drift while its
    # wander builds up (benign_day_4406). Routing is a property of the job, not of the moment: a job
    # counts as wandering for wander_memory counted windows after its gauge last read above
    # wander_drift (40, ~20 minutes: the gauge's own pool, noise_windows). 0: the gauge alone.
    wander_memory: int = 40
    # A job that routes experts still does after it restarts on other nodes (job_resize), but its new
    # layout's gauge starts afresh and reads calm while the wander builds up: two drawn benign days'
    # MoE jobs were flagged 10-25 minutes into a new layout (benign_day_4407, 4408). Where a job's
    # earlier layout wandered, its new one counts as wandering until the new gauge has its full pool
    # (noise_windows means). wander_until_learnt: every layout so, the job's first included.
    wander_carry: bool = True
    wander_until_learnt: bool = False
    wander_carry_s: float = 86_400.0  # how long a job that ended while wandering is remembered
    # Whoever submits a MoE job knows it routes experts, from its first step: a job that says so (a
    # Slurm comment, a pod label: anomaly/declared.py) and has fewer nodes than this counts as
    # wandering for as long as it runs, every layout, from its first window. Small jobs only: there the
    # gauge pools a few nodes' means and reads a wander late or not at all (every false flag on the
    # drawn days was in a 2-6-node MoE job, 10-40 minutes into routing), while holding every declared
    # job cost gray nodes in 8-53-node MoE jobs 5-6 minutes (docs/anomaly.md, "A job that says it
    # routes"). 9, not 8: the days drawn after session 48 had 8-node MoE jobs flagged at every routing
    # turn of their first half hour (benign_day_4429: 5 flags; 4432: 1); the price, moe_gray_x14_8n's
    # x1.4 node flagged after the routing hold (255 s, not 60; docs/anomaly.md, "An 8-node job's
    # first routing"). 13, not 9: a day drawn after session 50 had a 12-node MoE job whose routing turned
    # every 2 minutes, faster than the gauge's 8-window means read (benign_day_4453's 84531: 34 flags);
    # the generator draws MoE jobs of up to 12 nodes. The price, moe_gray_x14_12n's x1.4 node flagged
    # after the routing hold (360 s, not 30; docs/anomaly.md, "Routing that turns every 2 minutes").
    # 0: the declaration is not used.
    declared_routing_below: int = 13
    # A GPU drifting above its offset stops learning (job_model.learn: a mild fault setting in must not
    # become its normal). In a wandering job that froze an offset learnt in a low spell of the routing:
    # benign_day_4433's n0020 learnt -12 %, then ran 7-12 % above it by residual once the routing
    # brought it back, and every routing turn that put it on top flagged it. wander_thaw: there, a
    # drifting GPU still learns while its offset is below 0, and never past 0 (a gray node's offset sits
    # near 0 and rises: it stays frozen). Measured (docs/anomaly.md, "An offset learnt in a low spell"):
    # the shipped days' false flags 4 -> 2, eight days drawn first 3 -> 2, every scored set identical at
    # 5-s and 1-s samples. The price: a gray node whose offset was below 0 when it set in learns up to
    # |offset| of its slowdown (a 2-node MoE job's, old settings: no longer found).
    wander_thaw: bool = True
    # Expert routing gives a node more work because it sends the node more tokens: in an MoE job's
    # all-to-all a node whose experts are busier receives more bytes than its peers (twin/fabric.py),
    # while a slow node receives what it always did. routing_traffic: a candidate without a hardware
    # cause whose node received more than its job's other nodes (log of its InfiniBand bytes per second
    # against their median) by at least this share of the GPU's extra work (the smaller of its residual
    # and its deviation from its peers now) is busier, not slower, and is not flagged while that holds
    # (anomaly/traffic.py). 0.25: half of what a node carries where the all-to-all is half its bytes,
    # the twin's MoE profile. 0: off. Where the bytes are not read it says nothing.
    routing_traffic: float = 0.25
    # And where the bytes were read and do not explain it, the routing hold (wander_hold) is skipped: a
    # wandering job's candidate that receives no more than its peers is not its experts' load. Measured
    # and left off so far (docs/anomaly.md, "Tokens received"): 20 % p95 360 -> 60 s (hand-written) and
    # 73.5 -> 60 s (held out); with "not explained" read as below routing_traffic, 3 false flags on the
    # six MoE flag days where the test alone leaves 0 (an expert-loaded node's bytes +3.5-5 % while a
    # window's tensor noise put its work at +14-16 %); with unrouted_below, 0 there and the same gains.
    traffic_unholds: bool = False
    # What "the bytes do not explain it" means for traffic_unholds: the node received less than this
    # share of its extra work more than its peers (a slow node receives what they do; an expert-loaded
    # node's bytes rise, while a window's tensor noise can put its work further up than they rose).
    unrouted_below: float = 0.1
    noise_windows: int = 40  # counted windows (~20 min) whose residuals (small jobs) and 8-window
    # means give the job's robust noise and drift; flagged nodes' values are left out
    # Blind nodes (docs/anomaly.md, "Blind nodes"): a GPU whose tensor activity reads at most blind_tensor
    # (DCGM writes exactly 0 while another client holds the profiling module) while it draws at least
    # blind_busy_ratio of the median power of the cycle's computing GPUs of its model (tensor activity >=
    # min_activity), and at least blind_busy_w, is running kernels that DCGM cannot see. Half the computing
    # median is 250-350 W on H100s that compute at 500-700 W; 250 W is rules/blindness.yml's fallback for
    # DCGMProfilingBlind (40 % of the 700 W limit is 280 W). Both stay above an H100 waiting in NCCL
    # (~190 W, up to ~210 W on the twin) and a loaded idle one (~100 W). The floor counts where the
    # computing GPUs draw little: a 70B pipeline job's bubbles put their median at ~350 W on the twin
    # (psu_cap150_16n), half of it under its GPUs that wait a whole window at tensor 0; the ratio counts
    # for GPUs that wait above 250 W.
    blind_tensor: float = 0.001
    blind_busy_ratio: float = 0.5
    blind_busy_w: float = 250.0
    seed: int = 0


@dataclass
class Blind:
    """A node of a job the detector cannot see this cycle: never scored, flagged or cleared while so (a
    flag it had is held)."""

    job: str
    node: str
    reason: str  # one of BLIND_REASONS
    gpus: list[int]  # the GPUs that read so; empty for no_samples (the whole node)
    since: float  # window end of the first cycle it was seen blind (without a seen cycle since)
    cluster: str = ""  # the node's series' cluster label where they carry one (or a peer's)

    def as_dict(self) -> dict[str, Any]:
        return {
            "hpc_job": self.job,
            "node": self.node,
            "reason": self.reason,
            "gpus": self.gpus,
            "since": self.since,
        }


@dataclass
class Unseen:
    """What the detector keeps of a node reported blind, for the next cycle."""

    reason: str
    since: float
    held: np.ndarray | None  # profiling_dropout: the GPUs that read 0 while busy (held while they read 0)


@dataclass
class Straggler:
    """A flagged node of a job, with the cause and the evidence at the time of the flag."""

    job: str
    node: str
    cause: str
    gpu: int | None  # None: the whole node is slow (evidence "scope": "node"), not one GPU
    score: float
    since: float
    evidence: dict[str, Any]
    updated: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "hpc_job": self.job,
            "node": self.node,
            "cause": self.cause,
            "gpu": self.gpu,
            "score": round(self.score, 3),
            "since": self.since,
            "updated": self.updated,
            "evidence": self.evidence,
        }


@dataclass
class Event:
    """A flag or a clear, for the structured log and the evaluation."""

    kind: str  # "flag", "clear", or "cause" (a flag's cause became known)
    time: float
    straggler: Straggler


@dataclass
class CycleResult:
    scores: list[tuple[str, str, int, float]]  # (job, node, gpu, score)
    events: list[Event]
    counted_jobs: int
    quiet_jobs: int
    blind: list[Blind] = field(default_factory=list)  # the jobs' blind nodes, by job and node


@dataclass
class NodeState:
    recent: deque[bool]
    strong_run: int = 0
    fast_run: int = 0
    slow_run: int = 0
    long_run: int = 0
    hw_run: int = 0
    quiet_run: int = 0
    candidacy: int = 0  # windows since the node became a candidate (0 after clear_after quiet ones)
    stepped: bool = False  # the step path's hit this window (a sudden lasting rise: not routing)
    flag: Straggler | None = None


@dataclass
class JobState:
    nodes: tuple[str, ...]
    mu: np.ndarray
    var: np.ndarray
    count: np.ndarray
    own: np.ndarray  # per GPU: usual log tensor activity in calm windows (NaN: not learnt yet)
    recent_resid: deque[np.ndarray]  # the last counted windows' residuals (the slow path)
    steps: deque[tuple[np.ndarray, np.ndarray]]  # the same with each GPU's log activity, disturbed
    # windows included (the step path of small jobs) ...
    rises: deque[np.ndarray]  # ... and the rises it measured lately: their spread is its noise
    slow_mean: np.ndarray | None = None  # their mean, per GPU
    # Per node, the last counted windows' peers' wait (NaN in disturbed windows) and its median over
    # the slow path's windows (the slow path's evidence that the peers wait for the node)
    waits: deque[np.ndarray] = field(default_factory=deque)
    slow_wait: np.ndarray | None = None
    wait_now: np.ndarray | None = None  # this window's, where the slow path took it (the fast path reuses it)
    level: float = math.nan  # the busiest node's usual tensor activity
    windows: int = 0  # counted windows so far (the first ``min_history`` are the job's warm-up)
    spread: float = math.nan  # the job's usual cross-sectional spread of residuals (calm windows)
    # The last counted windows' residuals and slow-path means of unflagged nodes: their robust spread
    # is the job's noise, one window at a time and over minutes (it needs no calm window to learn).
    noise: deque[np.ndarray] = field(default_factory=deque)
    drift: deque[np.ndarray] = field(default_factory=deque)
    node_state: dict[str, NodeState] = field(default_factory=dict)
    # The last window was one where the whole job moved together (a checkpoint, an evaluation pass): the
    # next is its first back, where ranks resume at staggered moments and the last one back computes
    # while the others already wait, a straggler's signature for one window. No fast flag there.
    after_pause: bool = False
    since_flag: int = 1_000_000  # counted windows since a node of the job was last flagged
    wander_left: int = 0  # counted windows the job still counts as wandering (DetectorConfig.wander_memory)
    wandered: bool = False  # the gauge read above wander_drift in this layout
    carried_wander: bool = False  # an earlier layout of the job wandered (DetectorConfig.wander_carry)
    declared_routing: bool = False  # the job says it routes experts (DetectorConfig.declared_routing_below)


@dataclass
class Candidate:
    job: str
    z: np.ndarray  # per GPU
    features: np.ndarray  # per GPU rows for the covariance model
    window_nodes: list[int]
    spread: float  # this window's cross-sectional spread of residuals (NaN under four nodes)
    kept_pace: np.ndarray  # per GPU: activity not below its own usual level (NaN history: True)
    resid: np.ndarray  # per GPU: deviation from peers minus the GPU's own usual offset
    scale: np.ndarray  # per GPU: the scale z divides by
    blind: np.ndarray | None = None  # per node: blind this cycle (None: none of the job's nodes is)
