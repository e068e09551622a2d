"""Several detector settings fed one simulation (`evaluation.anomaly.run_scenario(detectors=...)`, what
bench/anomaly_sweep.py compares settings with): each variant's events are exactly those of a run of its
own, and each is scored under its name."""

from __future__ import annotations

from anomaly.detector import Detector, DetectorConfig, Event
from evaluation import anomaly as evaluation
from evaluation.scenarios import resolve as resolve_scenario

SCENARIO = "gray_x13_8n"  # one gray node in an 8-node job: a flag and its clear


def _as_rows(events: list[Event]) -> list[tuple[str, float, str, str, str]]:
    return [(e.kind, e.time, e.straggler.job, e.straggler.node, e.straggler.cause) for e in events]


def test_each_variant_sees_what_a_run_of_its_own_sees() -> None:
    path = resolve_scenario(SCENARIO)
    alone = evaluation.run_scenario(path)  # the shipped detector and the baselines
    shared = evaluation.run_scenario(
        path,
        detectors={
            "shipped": lambda sample_s: Detector(DetectorConfig(sample_average_s=sample_s)),
            "never_flags": lambda sample_s: Detector(
                DetectorConfig(sample_average_s=sample_s, z_threshold=1e9)
            ),
        },
    )
    assert set(shared.events) == {"shipped", "never_flags"}
    assert _as_rows(alone.events["detector"]) and _as_rows(shared.events["shipped"]) == _as_rows(
        alone.events["detector"]
    )
    assert [e for e in shared.events["never_flags"] if e.kind == "flag"] == []
    shipped, own_run = evaluation.score([shared], "shipped"), evaluation.score([alone], "detector")
    assert shipped["recall"] == own_run["recall"] == 1.0
    assert evaluation.score([shared], "never_flags")["recall"] == 0.0
