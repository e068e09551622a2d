"""The PromQL of one anomaly cycle (Queries): the raw reductions of a window over the DCGM and node-agent
series, the recording rules rules/anomaly.yml holds for the default window, and what a cycle reads in
either mode. Its own module: PromQL text changes with the metrics and the rules, not with how the service
talks to Prometheus (anomaly/source.py) or builds its arrays (anomaly/vectors.py); the dashboards' tests
and the benches import it alone.

Each cycle runs a handful of instant queries that reduce the last window on the server side (medians
with ``quantile_over_time``, throttle-bit shares through a subquery, counter increases), so the
service transfers one value per GPU and field whatever the scrape interval.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetsight.dcgm import names_of

from .declared import ROUTING_POD_LABEL
from .jobs import DEFAULT_POD_LABEL_KEYS, sanitize_label_name
from .window import CLOCK_EVENTS, THROTTLE_HW_POWER_BRAKE, THROTTLE_HW_THERMAL, THROTTLE_SW_THERMAL

# The InfiniBand counters whose increase says a node's link is in trouble (the node agent's names).
IB_ERROR_COUNTERS = ("symbol_error", "link_downed", "link_error_recovery")


# The window and step rules/anomaly.yml records (the service's defaults): another --window or --step reads
# the raw reductions, since the recorded ones summarise a different window.
RECORDED_WINDOW = ("30s", "5s")
# How old a recorded value may be: the group's interval (30 s: one evaluation per cycle) plus the time an
# evaluation takes (the group's timestamp is its start; at 50,000 GPUs a shard on 2 cores took ~15 s).
RECORDED_FRESH, RECORDED_FRESH_S = "1m", 60
# Recorded only where above 0 (Queries.recording_rules): absent means 0.
SPARSE_RECORDS = frozenset({"brake", "thermal", "pcie_downgraded", "ib_errors"})
# The labels a node's jobs, GPU model and cluster are read from (anomaly/jobs.py: hpc_job, else the first
# listed pod label, with its namespace, else the pod's owners); the recorded per-GPU values carry only
# cluster, node and gpu.
JOB_LABELS = (
    "cluster",
    "node",
    "modelName",
    "hpc_job",
    "namespace",
    "pod",
    *map(sanitize_label_name, DEFAULT_POD_LABEL_KEYS),
    sanitize_label_name(ROUTING_POD_LABEL),  # a job that says it routes experts (anomaly/declared.py)
)


@dataclass(frozen=True)
class Queries:
    """The PromQL of one cycle; ``window`` and ``step`` are PromQL durations."""

    window: str = "30s"
    step: str = "5s"

    def gpu_fields(self, matchers: str = "") -> dict[str, str]:
        """Field -> the raw reduction of one window; ``matchers`` (e.g. ``node=~"a|b"``) narrows every
        selector to some nodes (a flag's evidence)."""
        w, m = self.window, f"{{{matchers}}}" if matchers else ""
        downgraded = f'fleetsight_pcie_link_downgraded{{kind="gpu"{", " + matchers if matchers else ""}}}'
        h2d = f"fleetsight_pcie_host_to_device_bandwidth_bytes_per_second{m}"
        return {
            "tensor": f"quantile_over_time(0.5, DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{m}[{w}])",
            "power": f"quantile_over_time(0.5, DCGM_FI_DEV_POWER_USAGE{m}[{w}])",
            "sm_clock": f"quantile_over_time(0.5, DCGM_FI_DEV_SM_CLOCK{m}[{w}])",
            "util": f"quantile_over_time(0.5, DCGM_FI_DEV_GPU_UTIL{m}[{w}])",
            **self.throttle_shares("max without ()", matchers),
            "pcie_downgraded": f"max by (node, gpu) ({downgraded})",
            "h2d_bandwidth": f"max by (node, gpu) ({h2d})",
        }

    def throttle_shares(self, aggregate: str, matchers: str = "") -> dict[str, str]:
        """The window's share of samples with the power-brake bit, and with a thermal bit (SW or HW),
        of the clock-event reasons, one series per GPU (``aggregate``: e.g. ``max by (cluster, node,
        gpu)``, applied once to the shares).

        A bit test is a remainder and one comparison: x % 256 >= 128 is bit 0x80; the two thermal bits
        are adjacent (0x20, 0x40), so x % 128 >= 32 is either of them. Each name of the field (the
        counters file decides which is published) has its own subquery, joined with ``or``: a GPU seen
        under both names counts once, the bits are never counted twice, and no aggregation runs at every
        step of the subquery (at 50,000 GPUs a shard spent 17 s on a sum of two bit tests, and the
        per-step ``max by`` and floor arithmetic were most of what is left)."""
        assert THROTTLE_HW_THERMAL == 2 * THROTTLE_SW_THERMAL  # the adjacency the thermal test uses
        w, s = self.window, self.step
        tests = {
            "brake": f"% {2 * THROTTLE_HW_POWER_BRAKE} >= bool {THROTTLE_HW_POWER_BRAKE}",
            "thermal": f"% {4 * THROTTLE_SW_THERMAL} >= bool {THROTTLE_SW_THERMAL}",
        }
        selector = f"{{{matchers}}}" if matchers else ""
        names = names_of(CLOCK_EVENTS)
        return {
            key: f"{aggregate} ("
            + " or ".join(f"avg_over_time(({name}{selector} {test})[{w}:{s}])" for name in names)
            + ")"
            for key, test in tests.items()
        }

    def node_fields(self, matchers: str = "") -> dict[str, str]:
        """Field -> the raw reduction of one window, per node; ``matchers`` narrows them to some nodes
        (the bytes received, read on demand for a flag's job: NODE_EVIDENCE_FIELDS)."""
        w, m = self.window, f"{{{matchers}}}" if matchers else ""
        # One sum per counter, then added: increase() over a {__name__=~...} selector drops the names,
        # and a port's three counters then share one label set, which Prometheus 2.x refuses
        # ("vector cannot contain metrics with the same labelset") for the whole query.
        errors = " + ".join(
            f"sum by (node) (increase(fleetsight_infiniband_port_{counter}_total{m}[{w}]))"
            for counter in IB_ERROR_COUNTERS
        )
        return {
            "ib_errors": errors,
            "ib_xmit_wait": f"sum by (node) (rate(fleetsight_infiniband_port_xmit_wait_total{m}[{w}]))",
            "ib_rcv_rate": f"sum by (node) (rate(fleetsight_infiniband_port_rcv_data_bytes_total{m}[{w}]))",
        }

    # ------------------------------------------------------------------ the recorded window
    @property
    def recordable(self) -> bool:
        """Whether rules/anomaly.yml records this window (its names say 30s; the step is in the rule)."""
        return (self.window, self.step) == RECORDED_WINDOW

    def record_names(self) -> dict[str, str]:
        """Window field -> the recorded series that holds it (``job_labels``: the nodes' job labels).
        The evidence-only fields (EVIDENCE_FIELDS, NODE_EVIDENCE_FIELDS) are not recorded: a flag reads
        them raw, for its nodes only."""
        w = self.window
        return {
            "tensor": f"gpu:dcgm_tensor_active:median{w}",
            "power": f"gpu:dcgm_power_usage_watts:median{w}",
            "sm_clock": f"gpu:dcgm_sm_clock_mhz:median{w}",
            "brake": f"gpu:dcgm_power_brake:share{w}",
            "thermal": f"gpu:dcgm_thermal_throttle:share{w}",
            "pcie_downgraded": "gpu:fleetsight_pcie_link_downgraded:max",
            "ib_errors": f"node:fleetsight_infiniband_port_errors:increase{w}",
            "ib_xmit_wait": f"node:fleetsight_infiniband_port_xmit_wait:rate{w}",
            "job_labels": f"node_job:dcgm_gpus:group{w}",
        }

    def recording_rules(self) -> dict[str, str]:
        """Record name -> expression: the raw reductions above, one series per GPU (or node) with only
        the labels the window reads. rules/anomaly.yml is this (tests/anomaly/test_anomaly_recorded.py).

        The fields that are 0 on nearly every GPU or node (SPARSE_RECORDS: throttle shares, PCIe
        downgrades, link errors) are recorded only where they are not (``> 0``): Thanos Query fetches
        every series a selector matches from the shards before it filters, so a filter at read time
        saves only the answer, a filter in the rule saves the fetch (at 100,000 GPUs, three of the
        cycle's eight per-GPU vectors)."""
        names, gpu, w = self.record_names(), self.gpu_fields(), self.window
        per_gpu = "max by (cluster, node, gpu)"
        by = f"group by ({', '.join(JOB_LABELS)})"
        # First in the group (its timestamp is the group's start, each rule's samples are written as
        # it ends): the series the raw window takes its jobs from, tensor activity and power of the
        # window. `or`, not one {__name__=~...} selector: the two would share one label set once counted.
        exprs = {
            names["job_labels"]: " or ".join(
                f"{by} (count_over_time({metric}[{w}]))"
                for metric in ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_DEV_POWER_USAGE")
            )
        }
        exprs |= {names[k]: f"{per_gpu} ({gpu[k]})" for k in ("tensor", "power", "sm_clock")}
        exprs[names["pcie_downgraded"]] = f'{per_gpu} (fleetsight_pcie_link_downgraded{{kind="gpu"}}) > 0'
        errors = " + ".join(
            f"sum by (cluster, node) (increase(fleetsight_infiniband_port_{counter}_total[{w}]))"
            for counter in IB_ERROR_COUNTERS
        )
        exprs[names["ib_errors"]] = f"({errors}) > 0"
        exprs[names["ib_xmit_wait"]] = (
            f"sum by (cluster, node) (rate(fleetsight_infiniband_port_xmit_wait_total[{w}]))"
        )
        # Last, the costliest (subqueries).
        exprs |= {names[k]: f"{v} > 0" for k, v in self.throttle_shares(per_gpu).items()}
        return exprs

    def recorded_reads(self) -> dict[str, str]:
        """Field -> what a cycle asks for in the recorded mode, the values with node (and gpu) only
        (Thanos adds shard and cluster). Dense records: ``last_over_time`` over RECORDED_FRESH, so that
        a rule group that stopped (or a shard without the rules) reads as absent after it rather than
        after Prometheus's 5-minute lookback. Sparse records (SPARSE_RECORDS, written only where > 0):
        an instant selector, which honours the staleness marker Prometheus writes when a GPU's share
        falls back to 0 and drops out of the rule's output (``last_over_time`` would still see the
        previous value), kept only when written within RECORDED_FRESH. Where the window starts at 0,
        only the values above 0 are sent."""
        node_keys = set(self.node_fields())
        out = {}
        for key, name in self.record_names().items():
            by = f"max by ({'node' if key in node_keys else 'node, gpu'})"
            if key == "job_labels":
                out[key] = f"last_over_time({name}[{RECORDED_FRESH}])"
            elif key in SPARSE_RECORDS:
                out[key] = f"{by} ({name} and (time() - timestamp({name}) < {RECORDED_FRESH_S}))"
            elif key == "ib_xmit_wait":
                out[key] = f"{by} (last_over_time({name}[{RECORDED_FRESH}])) > 0"
            else:
                out[key] = f"{by} (last_over_time({name}[{RECORDED_FRESH}]))"
        return out
