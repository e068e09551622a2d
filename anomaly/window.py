"""One detection window: what every GPU of every node did over the last cycle, as arrays.

The live service fills it from PromQL (window medians and throttle-bit fractions); the offline
evaluation fills it from the twin's simulated samples. The detector sees nothing else, so both paths
exercise the same code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .jobs import JobRef

# The clock-event reasons field (id 112) as FleetSight's counters file names it; the legacy name
# DCGM_FI_DEV_CLOCK_THROTTLE_REASONS is read too (fleetsight.dcgm.names_of). Its bits (NVML
# clocksEventReasons, formerly clocksThrottleReasons):
CLOCK_EVENTS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
THROTTLE_SW_POWER_CAP = 0x4
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80
# Window fields the detector never scores, only quotes (and the cause's PCIe test compares): utilisation
# and the host-to-device probe.
EVIDENCE_FIELDS = ("util", "h2d_bandwidth")
# And per node: the InfiniBand bytes received, which only a flag that is due asks for (anomaly/traffic.py):
# read every cycle, a 100,000-GPU cycle took 2.34 CPU-s against 2.05 without and 2.20 so (one run each;
# docs/anomaly.md, "Tokens received").
NODE_EVIDENCE_FIELDS = ("ib_rcv_rate",)


@dataclass
class Window:
    """Per-GPU arrays are shaped (nodes, gpus); NaN where a GPU reported nothing."""

    end: float  # unix seconds at the end of the window
    nodes: list[str]
    gpus: int
    tensor: np.ndarray  # median DCGM_FI_PROF_PIPE_TENSOR_ACTIVE (ratio)
    power: np.ndarray  # median DCGM_FI_DEV_POWER_USAGE (W)
    sm_clock: np.ndarray  # median DCGM_FI_DEV_SM_CLOCK (MHz)
    util: np.ndarray  # median DCGM_FI_DEV_GPU_UTIL (%)
    brake: np.ndarray  # share of samples with the HW power brake bit
    thermal: np.ndarray  # share of samples with a thermal bit (SW or HW)
    pcie_downgraded: np.ndarray  # 1 when the GPU's link runs below its max speed or width
    h2d_bandwidth: np.ndarray  # host-to-device probe, bytes/s (NaN when no probe)
    ib_errors: np.ndarray  # per node: symbol errors + link downed + link recoveries in the window
    ib_xmit_wait: np.ndarray  # per node: port_xmit_wait ticks per second, summed over ports
    # Per node: bytes received per second, summed over ports (NaN: not read; an evidence field, read on
    # demand). In an MoE job a node whose experts are busier receives more of the token all-to-all: the
    # detector's routing test.
    ib_rcv_rate: np.ndarray = field(default_factory=lambda: np.zeros(0))
    jobs: dict[str, list[int]] = field(default_factory=dict)  # job id -> node indices
    gpu_model: dict[int, str] = field(default_factory=dict)  # node index -> GPU model name
    # What each job id of ``jobs`` is (scheduler, namespace: anomaly/jobs.py) and the ``cluster`` label
    # of each node's series where they carry one (a Thanos query adds it), for the job-node series.
    job_refs: dict[str, JobRef] = field(default_factory=dict)
    node_cluster: dict[int, str] = field(default_factory=dict)
    # Evidence-only fields (EVIDENCE_FIELDS, NODE_EVIDENCE_FIELDS: read for a flag, never to score) may be
    # left NaN by the source and filled on demand for the nodes a flag names: at 100,000 GPUs reading
    # them every cycle was two of the cycle's five dense vectors (docs/anomaly.md, "Recorded window").
    evidence_loader: Callable[[Window, list[int]], None] | None = field(default=None, repr=False)
    evidence_loaded: set[int] = field(default_factory=set, repr=False)

    def load_evidence(self, node_idx: list[int]) -> None:
        """Make the evidence-only fields of ``node_idx`` present (a no-op where the source read them)."""
        missing = sorted(set(node_idx) - self.evidence_loaded)
        if self.evidence_loader is not None and missing:
            self.evidence_loader(self, missing)
        self.evidence_loaded.update(missing)

    @classmethod
    def empty(cls, end: float, nodes: list[str], gpus: int) -> Window:
        shape = (len(nodes), gpus)
        nan = np.full(shape, np.nan)
        return cls(
            end=end,
            nodes=list(nodes),
            gpus=gpus,
            tensor=nan.copy(),
            power=nan.copy(),
            sm_clock=nan.copy(),
            util=nan.copy(),
            brake=np.zeros(shape),
            thermal=np.zeros(shape),
            pcie_downgraded=np.zeros(shape),
            h2d_bandwidth=nan.copy(),
            ib_errors=np.zeros(len(nodes)),
            ib_xmit_wait=np.zeros(len(nodes)),
            ib_rcv_rate=np.full(len(nodes), np.nan),
        )
