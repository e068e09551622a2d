"""Names and shapes shared by the simulation's domains: GPUs and ports per node, the IB and Lustre
counters a node exposes, DCGM's throttle-reason bits, and Lustre-style statistics."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import hardware as hw

G = len(hw.GPU_BDFS)
P = len(hw.IB_DEVICES)
STARTUP_S = 90.0
IB_COUNTERS = (
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
    "VL15_dropped",
)
IB_HW_COUNTERS = (
    "duplicate_request",
    "implied_nak_seq_err",
    "lifespan",
    "local_ack_timeout_err",
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "req_cqe_error",
    "req_cqe_flush_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "resp_cqe_error",
    "resp_cqe_flush_error",
    "resp_local_length_error",
    "resp_remote_access_errors",
    "rnr_nak_retry_err",
    "rx_atomic_requests",
    "rx_read_requests",
    "rx_write_requests",
)
LLITE_STATS = ("read_bytes", "write_bytes", "read", "write", "open", "close", "getattr", "statfs", "fsync")
LLITE_UNITS = ("bytes", "bytes", "usecs", "usecs", "usecs", "usecs", "usecs", "usecs", "usecs")
OSC_STATS = ("req_waittime", "req_active", "read_bytes", "write_bytes", "ost_read", "ost_write", "obd_ping")
OSC_UNITS = ("usecs", "reqs", "bytes", "bytes", "usecs", "usecs", "usecs")
MDC_STATS = ("req_waittime", "req_active", "mds_getattr", "mds_close", "ldlm_cancel", "obd_ping")
MDC_UNITS = ("usecs", "reqs", "usecs", "usecs", "usecs", "usecs")
RPC_PAGE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

THROTTLE_IDLE = 0x1
THROTTLE_SW_POWER = 0x4
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80

# DCGM_FI_DEV_FABRIC_MANAGER_STATUS (dcgmFabricManagerStatus_t, as DCGM maps NVML's GPU fabric state):
# 0 not supported (no NVSwitch), 1 not started, 2 in progress, 3 success, 4 failure.
FABRIC_NOT_STARTED = 1
FABRIC_SUCCESS = 3


def stable_hash(*parts: object) -> int:
    """A per-fault random seed that, unlike hash(), does not change between processes."""
    return zlib.crc32(repr(parts).encode())


class Stats:
    """Lustre-style statistics: per line count, min, max, sum, sumsq, over a leading shape."""

    def __init__(self, shape: tuple[int, ...], lines: int) -> None:
        self.count = np.zeros((*shape, lines), dtype=np.int64)
        self.sum = np.zeros((*shape, lines), dtype=np.float64)
        self.sumsq = np.zeros((*shape, lines), dtype=np.float64)
        self.min = np.zeros((*shape, lines), dtype=np.float64)
        self.max = np.zeros((*shape, lines), dtype=np.float64)

    def add(self, line: int, count: np.ndarray, size: np.ndarray) -> None:
        """Record `count` samples of value `size` (arrays over the leading shape)."""
        count = np.rint(count).astype(np.int64)
        has = count > 0
        first = has & (self.count[..., line] == 0)
        size = np.broadcast_to(size, count.shape)
        self.count[..., line] += count
        self.sum[..., line] += count * np.rint(size)
        self.sumsq[..., line] += count * np.rint(size) ** 2
        self.min[..., line] = np.where(
            first, size, np.where(has, np.minimum(self.min[..., line], size), self.min[..., line])
        )
        self.max[..., line] = np.where(has, np.maximum(self.max[..., line], size), self.max[..., line])

    def reset(self, index: Any) -> None:
        for array in (self.count, self.sum, self.sumsq, self.min, self.max):
            array[index] = 0


@dataclass
class LogLine:
    t: float  # sim seconds
    node: int
    text: str
    log: str = "kernel"  # which of the node's logs: kernel (kern.log) or fabricmanager (fabricmanager.log)


@dataclass
class AppLine:
    t: float
    node: int
    job: str
    rank: int
    text: str
