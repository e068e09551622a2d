"""evaluation/fabric_confusion.py: a fabric fault's label from the alerts that fired on its hosts, each
flash cut's time to its alert, and the macro-F1 over the fabric kinds (pure functions, no server)."""

from __future__ import annotations

import datetime as dt

import pytest

from evaluation.fabric_confusion import FabricFault, cut_delays, label, lead_s, scores

T0 = dt.datetime(2026, 12, 3, 2, 0, tzinfo=dt.UTC).timestamp()


def episode(alertname: str, node: str, start: float, end: float, device: str = "mlx5_3") -> dict:
    iso = lambda t: dt.datetime.fromtimestamp(T0 + t, dt.UTC).isoformat()  # noqa: E731
    return {
        "alertname": alertname,
        "labels": {"node": node, "device": device},
        "start": iso(start),
        "end": iso(end),
    }


def fault(kind: str, nodes: list[str], cuts: list[list[float]] | None = None) -> FabricFault:
    return FabricFault("f1", kind, nodes, "mlx5_3", T0 + 600, T0 + 1800, cuts or [])


def test_a_fault_is_labelled_by_the_kind_whose_alert_fired_on_its_hosts() -> None:
    cut = fault("ib_flash_cut", ["n1"])
    assert label(cut, [episode("InfiniBandFlashCut", "n1", 700, 1000)]) == "ib_flash_cut"
    # another kind's alert on the same host makes it that kind's; one on another host does not count
    flapping = [
        episode("InfiniBandFlashCut", "n1", 700, 1000),
        episode("InfiniBandLinkFlapping", "n1", 900, 1200),
    ]
    assert label(cut, flapping) == "ib_link_flap"
    assert label(cut, [episode("InfiniBandLinkFlapping", "n2", 900, 1200)]) == "none"
    # a degrading link's own alerts are both its symbol errors and the port's death at the end
    degrading = fault("ib_degrading_link", ["n1"])
    own = [
        episode("InfiniBandSymbolErrors", "n1", 800, 1900),
        episode("InfiniBandPortDown", "n1", 1920, 2400),
    ]
    assert label(degrading, own) == "ib_degrading_link"


def test_congestion_is_right_only_when_no_fabric_alert_fires_on_any_host_behind_the_leaf() -> None:
    congestion = fault("ib_congestion", ["n1", "n2", "n3"])
    assert label(congestion, []) == "ib_congestion"
    assert label(congestion, [episode("StragglerNode", "n2", 700, 900)]) == "ib_congestion"
    assert label(congestion, [episode("InfiniBandPortRateDegraded", "n3", 700, 900)]) == "ib_lane_downshift"


def test_each_cut_is_timed_to_the_alert_on_its_port() -> None:
    cuts = fault("ib_flash_cut", ["n1"], [[T0 + 700, 0.1], [T0 + 760, 0.2], [T0 + 1500, 0.05]])
    episodes = [
        episode("InfiniBandFlashCut", "n1", 715, 1000),
        episode("InfiniBandFlashCut", "n1", 1500, 1560, "mlx5_0"),
    ]
    # the second cut came while the alert fired for the first; the third was on another port's episode
    assert cut_delays(cuts, episodes) == [pytest.approx(15.0), 0.0, None]


def test_macro_f1_averages_the_kinds_present() -> None:
    pairs = [
        ("ib_flash_cut", "ib_flash_cut"),
        ("ib_lane_downshift", "ib_flash_cut"),
        ("ib_congestion", "ib_congestion"),
    ]
    result = scores(pairs)
    assert result["per_kind"]["ib_flash_cut"]["precision"] == pytest.approx(0.5)
    assert result["per_kind"]["ib_lane_downshift"]["recall"] == 0.0
    assert result["macro_f1"] == pytest.approx((2 / 3 + 0.0 + 1.0) / 3)
    assert result["confusion"]["ib_lane_downshift"] == {"ib_flash_cut": 1}


def test_a_degrading_links_lead_is_from_its_first_symbol_error_alert_to_the_failure() -> None:
    degrading = fault("ib_degrading_link", ["n1"])
    episodes = [
        episode("InfiniBandSymbolErrors", "n1", 1000, 2000),
        episode("InfiniBandPortDown", "n1", 1920, 2400),
    ]
    assert lead_s(degrading, episodes) == pytest.approx(800.0)
    assert lead_s(degrading, [episode("InfiniBandPortDown", "n1", 1920, 2400)]) is None
