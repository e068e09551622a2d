"""The straggler scorer's bands (issue 42: 5 %, 10 %, 20 %, 40 % of the job's step time), its recall
within 15 minutes and its rows per cause (evaluation/anomaly_scoring.py), on synthetic episodes and
flags: the scorer is pure code, so each figure here is worked out by hand from the episodes below."""

from __future__ import annotations

import itertools

import pytest

from anomaly.detector import Event
from anomaly.state import Straggler
from evaluation.anomaly import Episode, ScenarioRun, score
from evaluation.anomaly_scoring import BANDS, BELOW, WITHIN_S, band_of
from evaluation.anomaly_truth import NEUTRAL_SLOWDOWN


def flag(node: str, time: float, cause: str = "unknown", job: str = "1") -> Event:
    return Event("flag", time, Straggler(job, node, cause, 0, 5.0, time, {}))


def clear(node: str, time: float, job: str = "1") -> Event:
    return Event("clear", time, Straggler(job, node, "unknown", 0, 0.0, time, {}))


def episode(
    fid: str,
    kind: str,
    node: str,
    onset: float,
    end: float,
    slowdown: float,
    pacing: list[tuple[float, float]] | None = None,
    masked: list[tuple[float, float]] | None = None,
    benign: bool = False,
) -> Episode:
    """An episode of job 1; without ``pacing``, the fault sets the job's pace all along."""
    spans = [(onset, end)] if pacing is None else pacing
    return Episode("s", fid, kind, "1", node, onset, end, slowdown, benign, spans, masked or [])


def run_of(episodes: list[Episode], events: list[Event], fault_free: bool = False) -> ScenarioRun:
    return ScenarioRun("s", 16, 4.0, fault_free, episodes, {"detector": events})


@pytest.mark.parametrize(
    ("slowdown", "band"),
    [
        (0.049, BELOW),
        (0.05, "5%"),
        (0.0749, "5%"),
        (0.075, "10%"),
        (0.1499, "10%"),
        (0.15, "20%"),
        (0.2999, "20%"),
        (0.30, "40%"),
        (2.0, "40%"),
    ],
)
def test_bands_are_the_issues_with_edges_halfway(slowdown: float, band: str) -> None:
    assert band_of(slowdown) == band


def test_the_first_band_starts_where_episodes_stop_being_neutral() -> None:
    """No counted episode falls below the first band, and none is left between two bands."""
    assert BANDS[0][1] == NEUTRAL_SLOWDOWN
    assert all(high == low for (_, _, high), (_, low, _) in itertools.pairwise(BANDS))
    assert [name for name, _, _ in BANDS] == ["5%", "10%", "20%", "40%"]


def test_recall_within_15_minutes_per_band() -> None:
    """Three 5 % episodes: one flagged after 5 min, one after 20 min (found, but late), one missed; a
    10 % one flagged after 2 min; a 40 % power brake after 30 s."""
    episodes = [
        episode("f1", "gray_slow_node", "n1", 0.0, 1800.0, 0.06),
        episode("f2", "thermal_throttle", "n2", 2000.0, 4000.0, 0.055),
        episode("f3", "psu_failure", "n3", 5000.0, 6200.0, 0.07),
        episode("f4", "pcie_downgrade", "n4", 7000.0, 8000.0, 0.10),
        episode("f5", "psu_failure", "n5", 9000.0, 9600.0, 2.0),
    ]
    events = [
        flag("n1", 300.0),
        flag("n2", 2000.0 + 1200.0, cause="thermal"),
        flag("n4", 7120.0, cause="pcie"),
        flag("n5", 9030.0, cause="power_brake"),
    ]
    figures = score([run_of(episodes, events)], "detector")
    small = figures["by_band"]["5%"]
    assert (small["episodes"], small["detected"], small["recall"]) == (3, 2, 0.6667)
    assert small["recall_15min"] == 0.3333
    assert (small["latency_median_s"], small["precision"]) == (750.0, 1.0)
    assert figures["by_band"]["10%"]["recall_15min"] == 1.0
    assert figures["by_band"]["40%"]["latency_median_s"] == 30.0
    assert "20%" not in figures["by_band"] and BELOW not in figures["by_band"]
    assert figures["recall_15min"] == 0.6
    assert [m["fault_id"] for m in figures["missed"]] == ["f3"]


def test_the_15_minutes_count_only_while_the_fault_sets_the_pace() -> None:
    """A 5 % straggler that paced 5 min, was masked 20 min by a louder node, and paced again: a flag
    10 min into its second span has kept the job waiting 15 min in all (within); one 12 min into it,
    17 min (late), though its latency (from the span's start) is under 15 min either way."""
    pacing = [(0.0, 300.0), (1500.0, 3000.0)]
    masked = [(300.0, 1500.0)]
    on_time = episode("f1", "gray_slow_node", "n1", 0.0, 3000.0, 0.06, pacing=pacing, masked=masked)
    late = episode("f2", "gray_slow_node", "n2", 0.0, 3000.0, 0.06, pacing=pacing, masked=masked)
    figures = score(
        [run_of([on_time, late], [flag("n1", 1500.0 + 600.0), flag("n2", 1500.0 + 720.0)])], "detector"
    )
    small = figures["by_band"]["5%"]
    assert (small["recall"], small["recall_15min"]) == (1.0, 0.5)
    assert small["latency_median_s"] == 660.0 and small["latency_median_s"] < WITHIN_S


def test_an_episode_found_by_a_flag_already_held_is_found_at_once() -> None:
    """The node was flagged for an earlier fault and the flag held into the next one: found, and
    within 15 minutes (it was on the operator's screen when the second fault began to pace)."""
    first = episode("f1", "psu_failure", "n1", 0.0, 600.0, 2.0)
    second = episode("f2", "gray_slow_node", "n1", 600.0, 1800.0, 0.06)
    figures = score(
        [run_of([first, second], [flag("n1", 30.0, cause="power_brake"), clear("n1", 1900.0)])], "detector"
    )
    assert figures["detected_by_held_flag"] == 1
    assert figures["by_band"]["5%"]["recall_15min"] == 1.0
    assert figures["by_band"]["5%"]["latency_median_s"] is None


def test_rows_per_cause_and_wrong_flags_outside_the_bands() -> None:
    """Per cause: the fault kind's expected cause (a power brake, a gray node's 'unknown'); a wrong
    flag with no fault pacing the job and one during a benign disturbance count in the overall
    precision and the '<5%' row, not in a band's; a neutral fault (4 %) counts nowhere."""
    episodes = [
        episode("f1", "psu_failure", "n1", 0.0, 1200.0, 0.06),
        episode("f2", "gray_slow_node", "n2", 2000.0, 3200.0, 0.20),
        episode("f3", "thermal_throttle", "n3", 4000.0, 5200.0, 0.04),
        episode("b1", "os_jitter", "n4", 6000.0, 6600.0, 0.0, benign=True),
    ]
    events = [
        flag("n1", 90.0, cause="clocks"),
        flag("n2", 2060.0),
        flag("n3", 4100.0, cause="thermal"),  # the neutral fault: neither right nor wrong
        flag("n4", 6100.0),  # during the benign disturbance: wrong
        flag("n5", 7000.0),  # nothing at all: wrong
    ]
    figures = score([run_of(episodes, events)], "detector")
    assert (figures["true_flags"], figures["wrong_flags"], figures["precision"]) == (2, 2, 0.5)
    assert figures["by_band"]["5%"]["precision"] == 1.0 and figures["by_band"]["20%"]["precision"] == 1.0
    assert figures["by_band"][BELOW]["episodes"] == 0 and figures["by_band"][BELOW]["wrong_flags"] == 2
    assert list(figures["by_band"]) == [BELOW, "5%", "20%"]
    causes = figures["by_cause"]
    assert set(causes) == {"power_brake", "unknown", "benign", "none"}
    assert causes["power_brake"]["episodes"] == 1 and causes["power_brake"]["recall"] == 1.0
    assert causes["power_brake"]["cause_accuracy"] == 0.0  # it said "clocks"
    assert causes["unknown"]["cause_accuracy"] == 1.0
    assert (causes["benign"]["wrong_flags"], causes["none"]["wrong_flags"]) == (1, 1)
    rows = {(r["cause"], r["band"]): r for r in figures["by_cause_band"]}
    assert rows[("power_brake", "5%")]["latency_median_s"] == 90.0
    assert rows[("unknown", "20%")]["latency_median_s"] == 60.0


def test_the_report_keeps_the_keys_its_readers_use() -> None:
    """bench/anomaly_eval_table.py, docs/anomaly.md and the detector's tests read these."""
    figures = score(
        [run_of([episode("f1", "gray_slow_node", "n1", 0.0, 600.0, 0.1)], [flag("n1", 60.0)])], "detector"
    )
    for key in (
        "by_band",
        "by_kind",
        "by_kind_band",
        "by_cause",
        "by_cause_band",
        "at_target",
        "missed",
        "wrong",
    ):
        assert key in figures
    for key in ("episodes", "precision", "recall", "recall_15min", "f1", "latency_median_s", "latency_p95_s"):
        assert key in figures["by_band"]["10%"]
