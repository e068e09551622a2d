"""`fleetsight evaluate alerts`: the scorer on hand-made firings, and the whole pipeline (twin backfill ->
real Prometheus -> promtool-recorded rules -> alert evaluation -> score) on twin scenarios."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from evaluation.alert_scoring import expected_alerts, load_truth, score
from evaluation.firings import Episode, firing_episodes, straggler_samples
from evaluation.replay import EvaluationError
from fleetsight.dcgm import names_of
from rules.ruleset import Rule
from support import FLEETSIGHT, REPO_ROOT
from twin.fault_kinds import PACE_KINDS
from twin.truth import Fault


def truth_line(id_: str, kind: str, target: dict, onset: float, **extra: object) -> dict:
    """A truth line with every key docs/twin.md promises (twin.truth.TRUTH_KEYS)."""
    line = {"id": id_, "kind": kind, "benign": False, "target": target, "onset": "", "end": "",
            "onset_unix": onset, "end_unix": onset + 100, "magnitude": None, "jobs": [], "job": None,
            "job_slowdown": 0.0, "job_failed": False, "effects": {}}  # fmt: skip
    return {**line, **extra}


def test_the_scorer_reads_the_twins_truth_through_the_twins_reader(tmp_path: Path) -> None:
    truth = tmp_path / "truth.jsonl"
    lines = [
        truth_line("f2", "psu_failure", {"node": "n0002"}, 300.0, job="2001"),
        truth_line("f1", "xid", {"node": "n0003", "gpu": 2, "code": 79}, 100.0),
        truth_line("d1", "dataloader_hiccup", {}, 10.0, benign=True),
    ]
    truth.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    faults = load_truth(truth)
    assert all(isinstance(f, Fault) for f in faults)
    assert [(f.id, f.node, f.code, f.benign) for f in faults] == [  # sorted by onset
        ("d1", None, None, True),
        ("f1", "n0003", 79, False),
        ("f2", "n0002", None, False),
    ]
    assert expected_alerts(faults[1]) == ("GPUFellOffBus",)
    assert expected_alerts(faults[0]) == ()
    # the pace stragglers (no GPU signature) are the training watch's alert's to catch
    slow = [
        truth_line(f"p{i}", kind, {"node": "n0004"}, 50.0, job="2001") for i, kind in enumerate(PACE_KINDS)
    ]
    truth.write_text("\n".join(json.dumps(line) for line in slow) + "\n")
    assert {expected_alerts(f) for f in load_truth(truth)} == {("TrainingPaceStraggler",)}
    # a line without the keys the format promises is refused with its file and line
    truth.write_text(json.dumps({"id": "x", "kind": "xid", "onset_unix": 1.0, "end_unix": 2.0}) + "\n")
    with pytest.raises(EvaluationError, match=r"truth\.jsonl:1: missing keys"):
        load_truth(truth)


def test_for_clause_is_applied_like_prometheus() -> None:
    rule = Rule("X", "expr", "g", Path("x.yml"), True, for_seconds=60, labels={"severity": "warning"})
    # present at 0..45 s (too short for 60 s), gap, then 120..300 s
    stamps = [0, 15, 30, 45, *range(120, 301, 15)]
    series = [{"metric": {"__name__": "x", "node": "n1"}, "values": [[t, "1"] for t in stamps]}]
    episodes = firing_episodes(rule, series, step=15)
    assert [(e.start, e.end, e.labels) for e in episodes] == [
        (180, 315, {"node": "n1", "severity": "warning"})
    ]


def test_scoring_counts_caught_missed_false_and_delay() -> None:
    faults = [
        Fault("f1", "psu_failure", onset=1000, end=1500, node="n1"),
        Fault("f2", "thermal_throttle", onset=1000, end=1500, node="n2"),
        Fault("f3", "ib_port_down", onset=1000, end=1500, node="n3"),
    ]
    episodes = [
        Episode("GPUPowerBrakeActive", {"node": "n1", "gpu": "0"}, 1075, 1600),
        Episode("GPUThermalThrottling", {"node": "n4", "gpu": "1"}, 1100, 1200),  # wrong node: false
    ]
    observable = {
        "GPUPowerBrakeActive": True,
        "GPUThermalThrottling": True,
        "InfiniBandPortDown": False,
        "PSUFailed": False,
    }
    alerts, kinds, false_alerts, missed = score("s", faults, episodes, observable)
    assert (kinds["psu_failure"].caught, kinds["psu_failure"].delays_s) == (1, [75])
    assert (kinds["thermal_throttle"].caught, kinds["thermal_throttle"].missed) == (0, 1)
    assert (kinds["ib_port_down"].missed, kinds["ib_port_down"].not_observable) == (0, 1)
    assert alerts["GPUThermalThrottling"].false_episodes == 1 and len(false_alerts) == 1
    assert [m["fault"] for m in missed] == ["f2"]


def scenario(path: Path, name: str, seed: int, nodes: int, faults: list[dict]) -> Path:
    """A small scenario of our own (not a shipped file): the rules must not be tuned to those."""
    path.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "seed": seed,
                "start": "2026-11-22T06:00:00Z",
                "duration": "30m",
                "tick": "5s",
                "cluster": {"name": "hpc-t", "nodes": nodes},
                "jobs": [
                    {
                        "id": "7001",
                        "name": "pretrain-t",
                        "nodes": nodes,
                        "profile": "llm-20b",
                        "checkpoint_interval": "10m",
                    }
                ],
                "faults": faults,
            }
        )
    )
    return path


@pytest.mark.stack
def test_faults_are_caught_and_a_quiet_cluster_raises_nothing(tmp_path: Path) -> None:
    faulty = scenario(
        tmp_path / "faulty.yaml",
        "faulty",
        seed=7,
        nodes=6,
        faults=[
            {
                "kind": "psu_failure",
                "target": {"node": "n0004", "psu": 2},
                "onset": "8m",
                "duration": "12m",
                "magnitude": 200,
            },
            {
                "kind": "xid",
                "target": {"node": "n0002", "gpu": 6, "code": 79},
                "onset": "10m",
                "duration": "10m",
            },
            {
                "kind": "thermal_throttle",
                "target": {"node": "n0005", "gpu": 1},
                "onset": "9m",
                "duration": "10m",
                "magnitude": 0.6,
            },
            # Seen only through `up` and the node agent's series (sysfs), not dcgm-exporter's.
            {"kind": "host_crash", "target": {"node": "n0006"}, "onset": "7m", "duration": "6m"},
            {
                "kind": "ib_port_down",
                "target": {"node": "n0001", "port": "mlx5_3"},
                "onset": "11m",
                "duration": "8m",
            },
        ],
    )
    quiet = scenario(tmp_path / "quiet.yaml", "quiet", seed=4242, nodes=8, faults=[])
    result = subprocess.run(
        [
            *FLEETSIGHT,
            "evaluate",
            "alerts",
            "--scenario",
            str(faulty),
            "--scenario",
            str(quiet),
            "--json",
            "--no-anomaly",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    by_name = {s["scenario"]: s for s in report["scenarios"]}
    kinds = by_name["faulty"]["kinds"]
    for kind in ("psu_failure", "xid", "thermal_throttle", "host_crash", "ib_port_down"):
        assert kinds[kind]["caught"] == 1, (kind, by_name["faulty"]["missed_faults"])
    # `for:` as Prometheus applies it: the power brake (1m) fires after a minute, the PSU (30s) after
    # half of one (its BMC reading comes with the node agent's scrape), within a few evaluations
    alerts = by_name["faulty"]["alerts"]
    assert 60 <= alerts["GPUPowerBrakeActive"]["max_delay_s"] <= 180
    assert 30 <= alerts["PSUFailed"]["max_delay_s"] <= 120
    assert by_name["faulty"]["false_alerts"] == []
    assert by_name["quiet"]["faults"] == 0 and by_name["quiet"]["false_alerts"] == []
    # the data the twin backfills reaches the rules: dcgm-exporter's, the node agent's, `up`
    present = by_name["quiet"]["metrics_present"]
    for name in ("up", "fleetsight_bmc_psu_healthy",
                 "fleetsight_infiniband_port_up", "fleetsight_pcie_link_speed_downgraded"):  # fmt: skip
        assert name in present, name
    # the clock-event reasons, under whichever of its names the twin's counters file publishes
    assert set(names_of("DCGM_FI_DEV_CLOCKS_EVENT_REASONS")) & set(present), present


def test_straggler_flags_become_the_series_the_service_exports() -> None:
    events = [
        {"event": "flag", "time": 1000.0, "hpc_job": "7", "node": "n2", "cause": "unknown"},
        {"event": "cause", "time": 1100.0, "hpc_job": "7", "node": "n2", "cause": "thermal"},
        {"event": "clear", "time": 1200.0, "hpc_job": "7", "node": "n2", "cause": "thermal"},
        {"event": "flag", "time": 1500.0, "hpc_job": "8", "node": "n3", "cause": "pcie"},  # never cleared
    ]
    samples = straggler_samples(events, begin=900.0, end=1600.0, cluster="c")
    by_cause: dict[str, list[float]] = {}
    for labels, stamp in samples:
        assert 'job="anomaly"' in labels and 'cluster="c"' in labels
        by_cause.setdefault(labels.split('cause="')[1].split('"')[0], []).append(stamp)
    # one sample per 30-second cycle while the flag stands, under the cause known at that time
    assert by_cause["unknown"] == [1020.0, 1050.0, 1080.0]
    assert by_cause["thermal"] == [1110.0, 1140.0, 1170.0]
    assert by_cause["pcie"] == [1500.0, 1530.0, 1560.0, 1590.0]


def test_a_missing_scenario_is_a_clear_error() -> None:
    result = subprocess.run(
        [*FLEETSIGHT, "evaluate", "alerts", "--scenario", "/nonexistent/scenario.yaml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert result.returncode != 0
    assert "no scenario file" in result.stderr
