"""Whether a busier node's extra work is traffic it was sent: expert routing, told from a straggler by the
bytes each node receives.

In a mixture-of-experts job the token all-to-all sends every token to the nodes that hold its experts.
A node whose experts are busier (the routing's own drift, a load that moves between nodes every few
minutes) computes more *and* receives more bytes than its peers; a gray or throttled node computes
longer on the same tokens and receives what its peers do (the job slows, so every node's rate falls
alike). The GPU fields cannot tell the two apart; the InfiniBand port counters can
(``fleetsight_infiniband_port_rcv_data_bytes_total``, summed per node: Window.ib_rcv_rate).
"""

from __future__ import annotations

import numpy as np

from .robust import leave_one_out_median, safe_log
from .state import Candidate, DetectorConfig
from .window import Window


def received_excess(window: Window, node_idx: list[int]) -> np.ndarray | None:
    """Per node of the job: the log of its bytes received per second over the median of its job's other
    nodes. None where any of them was not read (no exporter, a missing series) or the job has one node:
    unknown is not routing. An evidence field: read now, for these nodes, where the source did not."""
    if len(node_idx) < 2:
        return None
    window.load_evidence(node_idx)
    rates = window.ib_rcv_rate
    if len(rates) != len(window.nodes):
        return None
    logs = safe_log(rates[node_idx])
    if not np.isfinite(logs).all():
        return None
    return logs - leave_one_out_median(logs)


def routed(
    cfg: DetectorConfig, window: Window, candidate: Candidate, pos: int, gpu: int, offset: float
) -> bool | None:
    """Does the node at ``pos`` receive enough more than its peers to account for its GPU's extra work?
    True: at least ``routing_traffic`` of it (routing); False: under ``unrouted_below`` of it (its bytes
    stayed with its peers': not routing); None between the two, where the bytes were not read, or with
    the test off.

    The extra work is the smaller of the GPU's residual and its deviation from its peers now (the
    residual plus its learnt ``offset``): the bytes are compared with the peers now, while an offset
    learnt in a low spell of the routing puts the residual above what the node does more than they do."""
    if cfg.routing_traffic <= 0:
        return None
    excess = received_excess(window, candidate.window_nodes)
    if excess is None:
        return None
    resid = float(candidate.resid[pos, gpu])
    extra = max(min(resid, resid + offset) if np.isfinite(offset) else resid, 0.0)
    if not np.isfinite(extra):
        return None
    if excess[pos] >= cfg.routing_traffic * extra:
        return True
    # Between the two bars the bytes rose, but by less than the work: a window's tensor noise on top of
    # an expert load. Neither routing nor not (None): only clearly flat bytes say "not routing".
    return False if excess[pos] < cfg.unrouted_below * extra else None
