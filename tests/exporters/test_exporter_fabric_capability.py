"""UFM's view of what a port may train at (exporters/fabric_parse.py ``capability_rate``): the widest
enabled width x the fastest enabled speed, against which a downshifted link shows even when every port of
its node downshifted. Fed the twin's UFM port objects (twin/render.py ``ufm_ports``, UFM's field names)."""

from __future__ import annotations

import datetime as dt

from exporters.fabric_parse import capability_rate, port_rows
from twin import render
from twin.scenario import from_dict
from twin.sim import Simulation

NDR_4X = 400e9 / 8


def test_capability_is_the_widest_width_times_the_fastest_speed_listed() -> None:
    assert capability_rate(["SDR", "DDR", "QDR"], ["1x", "4x"]) == 10e9 * 4 / 8  # a QDR port
    assert capability_rate(["SDR", "FDR", "EDR", "HDR", "NDR"], ["1x", "2x", "4x"]) == NDR_4X
    assert capability_rate(["HDR"], ["2x"]) == 50e9 * 2 / 8
    # a document without the lists, or with nothing known in them, gives no capability (not a zero)
    assert capability_rate(None, ["4x"]) is None
    assert capability_rate(["NDR"], "4x") is None
    assert capability_rate(["warp"], ["4x"]) is None


def test_a_downshifted_host_port_reads_below_its_enabled_rate_in_ufms_document() -> None:
    scenario = from_dict(
        {
            "name": "capability",
            "seed": 91,
            "start": "2026-11-22T09:00:00Z",
            "duration": "5m",
            "tick": "5s",
            "cluster": {"name": "fmt", "nodes": 2},
            "jobs": [],
            "faults": [
                {"kind": "ib_lane_downshift", "target": {"node": "n0002", "port": "mlx5_4"}, "onset": "30s",
                 "duration": "3m", "magnitude": 1},
            ],
            "realism": "off",
        }
    )  # fmt: skip
    sim = Simulation(scenario, dt.datetime(2026, 11, 22, 9, 0, tzinfo=dt.UTC))
    while sim.t < 120:
        sim.advance()
    rows = {(r.labels["node"], r.labels["hca_port"]): r for r in port_rows(render.ufm_ports(sim), {})
            if r.labels["side"] == "host"}  # fmt: skip
    slow, fine = rows[("n0002", "mlx5_4/1")], rows[("n0001", "mlx5_4/1")]
    assert slow.rate_bytes == 100e9 / 8 and slow.enabled_rate_bytes == NDR_4X == slow.supported_rate_bytes
    assert fine.rate_bytes == fine.enabled_rate_bytes == NDR_4X
