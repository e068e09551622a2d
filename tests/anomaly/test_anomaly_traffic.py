"""The routing test (anomaly/traffic.py): a node busier because its experts are sent more tokens receives
more InfiniBand bytes than its peers and is not flagged; a slow node receives what they do; bytes not read
decide nothing. On the twin: a drawn benign day's MoE node that its experts' own wander kept 8-15 % above
its peers for minutes, flagged without the test and not with it."""

from __future__ import annotations

import numpy as np
import pytest
from anomaly_helpers import benign_day_flags

from anomaly.state import Candidate, DetectorConfig
from anomaly.traffic import received_excess, routed
from anomaly.window import Window

NODES = ["n1", "n2", "n3", "n4"]


def window_with(received: list[float]) -> Window:
    window = Window.empty(0.0, NODES, 2)
    window.ib_rcv_rate = np.asarray(received, dtype=float)
    return window


def candidate(resid: float) -> Candidate:
    """Node n1's GPU 0 above its peers by ``resid`` (log)."""
    shape = (len(NODES), 2)
    residuals = np.zeros(shape)
    residuals[0, 0] = resid
    ones = np.ones(shape)
    return Candidate("7", ones, ones.reshape(-1, 1), [0, 1, 2, 3], np.nan, ones > 0, residuals, ones * 0.02)


def test_a_node_that_receives_more_in_proportion_is_routed_and_one_that_does_not_is_not() -> None:
    cfg = DetectorConfig()
    busier = window_with([10.7e9, 10.0e9, 10.1e9, 9.9e9])  # +6.7 % against the others' median
    assert received_excess(busier, [0, 1, 2, 3])[0] == pytest.approx(np.log(10.7 / 10.0))
    assert routed(cfg, busier, candidate(0.15), 0, 0, 0.0) is True  # 0.065 >= 0.25 x 0.15
    # A loud one is more than its tokens: not routed; but its bytes did rise, so not "unrouted" either.
    assert routed(cfg, busier, candidate(0.40), 0, 0, 0.0) is None
    alike = window_with([10.0e9, 10.0e9, 10.1e9, 9.9e9])
    assert routed(cfg, alike, candidate(0.10), 0, 0, 0.0) is False  # a slow node: sent what its peers are


def test_the_extra_work_is_read_against_the_peers_now_where_an_offset_was_learnt_low() -> None:
    """A node that learnt -8 % in a low spell of the routing and now runs 20 % above that does 12 % more
    than its peers: 4 % more bytes account for it (0.25 x 0.12), not for the residual's 20 %."""
    cfg = DetectorConfig()
    window = window_with([10.4e9, 10.0e9, 10.0e9, 10.0e9])
    assert routed(cfg, window, candidate(0.20), 0, 0, -0.08) is True
    assert not routed(cfg, window, candidate(0.20), 0, 0, 0.0)
    assert not routed(cfg, window, candidate(0.20), 0, 0, 0.05)  # a usual +5 %: the residual counts


def test_bytes_not_read_or_the_test_off_decide_nothing() -> None:
    cfg = DetectorConfig()
    assert routed(cfg, Window.empty(0.0, NODES, 2), candidate(0.15), 0, 0, 0.0) is None  # no exporter: NaN
    one_missing = window_with([10.7e9, np.nan, 10.1e9, 9.9e9])
    assert routed(cfg, one_missing, candidate(0.15), 0, 0, 0.0) is None
    assert routed(cfg, window_with([10.7e9, 0.0, 10.1e9, 9.9e9]), candidate(0.15), 0, 0, 0.0) is None
    off = DetectorConfig(routing_traffic=0.0)
    assert routed(off, window_with([10.7e9, 10.0e9, 10.1e9, 9.9e9]), candidate(0.15), 0, 0, 0.0) is None
    assert received_excess(window_with([10.7e9, 10.0e9, 10.1e9, 9.9e9]), [0]) is None  # one node


def test_an_moe_node_whose_experts_drew_more_tokens_is_not_flagged() -> None:
    """benign_day_4468's 8-node MoE job 84683: from 300 minutes the experts on n0020 carried 8-15 % more
    load than their peers' (the profile's own wander) while routing began at 302; without the routing
    test the node was flagged at 307 after the routing hold, with it nothing is."""
    flags = benign_day_flags("benign_day_4468", 312, off={"routing_traffic": 0.0})
    assert [(f.job, f.node) for f in flags["off"]] == [("84683", "n0020")]
    assert flags["shipped"] == []


def test_the_bytes_read_are_the_node_agents_received_data_counter() -> None:
    """The query reads the metric the node agent makes of sysfs's port_rcv_data (4-byte words, published
    in bytes: tests/exporters/test_exporter_node.py), not a name of its own."""
    from anomaly.queries import Queries
    from exporters.infiniband import counter_metric

    name, multiplier, _ = counter_metric("port_rcv_data")
    assert multiplier == 4
    assert f"{name}_total[" in Queries().node_fields()["ib_rcv_rate"]
    assert f'{name}_total{{node=~"n1"}}[' in Queries().node_fields('node=~"n1"')["ib_rcv_rate"]
