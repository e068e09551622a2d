"""A job that says it routes experts (anomaly/declared.py): read from a Slurm job's comment and from a
pod's labels, carried on the job's JobRef, and trusted by the detector from the job's first window in
jobs of a few nodes (``DetectorConfig.declared_routing_below``; docs/anomaly.md, "A job that says it
routes").

The real producers' side is tested elsewhere: Debian's slurmrestd serving a job's ``--comment``
(tests/contracts/test_slurmrestd_contract.py) and the API server giving a pod's labels to the owners
reader (tests/deploy/test_pod_owners.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from anomaly_helpers import SCENARIOS, benign_day_flags, detector_variants

import evaluation.anomaly as evaluation
from anomaly.declared import (
    ROUTING_COMMENT_ENV,
    declares_routing,
    routing_comment_pattern,
)
from anomaly.detector import Detector, DetectorConfig
from anomaly.jobs import HPC_JOB_LABEL, KUBERNETES, SLURM, JobIdentity, JobMap, JobRef, from_series, merge
from anomaly.paths import presumed_wandering
from anomaly.scheduler import routing_jobs
from anomaly.window import Window
from evaluation.anomaly_feed import TwinFeed
from twin.scenario import load as load_scenario

# A 4-node MoE job whose expert routing starts 15 minutes in and hands the busiest place on every
# 3 minutes at 14 % (benign_day_4417's job 84170 was flagged 7 times in such a start), beside a dense
# job. Seed 2 is one of the 4 in 12 seeds where the gauge alone lets routing through (seeds 1-12:
# docs/anomaly.md).
FIRST_ROUTING = """\
name: moe_first_routing
description: benign only, a 4-node MoE job's first routing from its first quarter hour
seed: 2
start: '2026-11-22T06:00:00Z'
duration: 55m
tick: 5s
cluster: {{name: t, nodes: 8}}
dcgm: {dcgm}
jobs:
- {{id: '7', name: moe-0, nodes: n0001-n0004, profile: moe-8x22b, pipeline_stages: 1,
   checkpoint_interval: 48h{declares}}}
- {{id: '8', name: dense-1, nodes: n0005-n0008, profile: llm-8b, checkpoint_interval: 48h}}
faults:
- {{kind: moe_imbalance, target: {{job: '7', every: 3m}}, onset: 15m, duration: 40m, magnitude: 0.14}}
"""
SLURM_DCGM = "{labels: slurm}"
KUBERNETES_DCGM = "{labels: kubernetes, pod_labels: true}"


def _scenario(tmp_path: Path, dcgm: str = SLURM_DCGM, declares: bool | None = None) -> Path:
    path = tmp_path / "moe_first_routing.yaml"
    flag = "" if declares is None else f", declares_routing: {str(declares).lower()}"
    path.write_text(FIRST_ROUTING.format(dcgm=dcgm, declares=flag))
    return path


def _first_refs(path: Path) -> dict[str, JobRef]:
    return next(iter(TwinFeed(path, 30.0, duration=60.0, sample_window=5.0).windows())).job_refs


# ---------------------------------------------------------------- where the declaration is read
def test_the_comment_word_and_the_pod_label() -> None:
    pattern = routing_comment_pattern("")
    assert pattern.search("model profile moe-8x22b expert-routing")
    assert pattern.search("Expert-Routing; team=lm")
    assert not pattern.search("no-expert-routing")  # a longer word is not the word
    assert not pattern.search("model profile moe-8x22b")
    assert routing_comment_pattern(r"\bmoe-").search("model profile moe-8x22b")  # a site's own
    assert declares_routing({"fleetsight_io_expert_routing": "true"})
    assert declares_routing({"fleetsight.io/expert-routing": "Yes"}, sanitised=False)
    assert not declares_routing({"fleetsight_io_expert_routing": "false"})
    assert not declares_routing({})


def test_a_bad_comment_pattern_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ROUTING_COMMENT_ENV, "expert-(routing")
    with pytest.raises(ValueError, match=ROUTING_COMMENT_ENV):
        routing_comment_pattern()
    monkeypatch.setenv(ROUTING_COMMENT_ENV, "routes")
    assert routing_comment_pattern().search("this job routes experts")


def test_the_running_jobs_whose_comment_declares() -> None:
    body = {
        "jobs": [
            {"job_id": 11, "comment": "model profile moe-8x22b expert-routing"},
            {"job_id": 12, "comment": "model profile llm-70b"},
            {"job_id": 13, "comment": {"job": "expert-routing", "administrator": ""}},
            {"job_id": 14, "comment": "expert-routing"},  # not running: not in the window's jobs
            {"job_id": 15},
        ]
    }
    running = {"11": ["n1"], "12": ["n2"], "13": ["n3"], "15": ["n5"]}
    assert routing_jobs(body, routing_comment_pattern(""), running) == {"11", "13"}


def test_the_declaration_rides_on_the_jobs_ref() -> None:
    jobs = merge({"11": ["n1", "n2"], "12": ["n3"]}, JobMap(), routing={"11"})
    assert jobs.refs["11"] == JobRef("11", SLURM, declared_routing=True)
    assert jobs.refs["12"].declared_routing is False
    series = [
        ("n4", {"namespace": "lm", "jobset_sigs_k8s_io_jobset_name": "moe"}),
        (
            "n5",
            {
                "namespace": "lm",
                "jobset_sigs_k8s_io_jobset_name": "moe",
                "fleetsight_io_expert_routing": "true",
            },
        ),
    ]
    labelled = from_series(JobIdentity(), series)
    assert labelled.refs["lm/moe"] == JobRef("lm/moe", KUBERNETES, "lm", declared_routing=True)


@pytest.mark.parametrize("dcgm", [SLURM_DCGM, KUBERNETES_DCGM], ids=["slurm-comment", "pod-label"])
def test_the_twins_moe_job_declares_by_default_and_the_feed_reads_it(tmp_path: Path, dcgm: str) -> None:
    refs = _first_refs(_scenario(tmp_path, dcgm))
    moe = next(ref for ref in refs.values() if ref.id.endswith("7") or "moe" in ref.id)
    dense = next(ref for ref in refs.values() if ref is not moe)
    assert moe.declared_routing and not dense.declared_routing, refs
    assert load_scenario(_scenario(tmp_path, dcgm)).jobs[0].slurm_comment.endswith(" expert-routing")
    silent = _first_refs(_scenario(tmp_path, dcgm, declares=False))
    assert not any(ref.declared_routing for ref in silent.values()), silent


# ---------------------------------------------------------------- what the detector does with it
def test_a_declared_moe_jobs_first_routing_is_held_where_the_gauge_alone_flags_it(tmp_path: Path) -> None:
    """One simulation, three detectors, without the bytes-received test (``routing_traffic`` 0) to see
    the declaration alone: trusting it, nothing is flagged; reading the gauge alone (session 46's
    detector), the routing's busiest nodes are, 1-20 minutes into the routing, before the gauge has
    learnt that the job wanders. With the bytes (the shipped test), the gauge alone flags nothing
    either: the busiest node is the one sent the most tokens."""
    detectors = {
        "trusted": lambda s: Detector(DetectorConfig(sample_average_s=s, routing_traffic=0.0)),
        "gauge": lambda s: Detector(
            DetectorConfig(sample_average_s=s, declared_routing_below=0, routing_traffic=0.0)
        ),
        "gauge_bytes": lambda s: Detector(DetectorConfig(sample_average_s=s, declared_routing_below=0)),
    }
    run = evaluation.run_scenario(_scenario(tmp_path), sample_window=5.0, detectors=detectors)
    assert run.fault_free
    flags = {name: [e.straggler for e in got if e.kind == "flag"] for name, got in run.events.items()}
    assert flags["trusted"] == [], [f.as_dict() for f in flags["trusted"]]
    assert flags["gauge"] and {f.job for f in flags["gauge"]} == {"7"}, flags["gauge"]
    assert all("wander_windows" not in f.evidence for f in flags["gauge"])
    assert flags["gauge_bytes"] == [], [f.as_dict() for f in flags["gauge_bytes"]]


def test_a_job_that_says_nothing_is_read_by_its_gauge_as_before(tmp_path: Path) -> None:
    """The same job without the declaration: without the bytes-received test the detector is the gauge
    alone again and flags the routing; the shipped detector, which reads the bytes, does not."""
    run = evaluation.run_scenario(
        _scenario(tmp_path, declares=False),
        sample_window=5.0,
        detectors=detector_variants(no_bytes={"routing_traffic": 0.0}),
    )
    flags = {name: [e.straggler for e in got if e.kind == "flag"] for name, got in run.events.items()}
    assert flags["no_bytes"] and {f.job for f in flags["no_bytes"]} == {"7"}, flags["no_bytes"]
    assert flags["shipped"] == [], [f.as_dict() for f in flags["shipped"]]


def test_a_declaration_is_kept_for_the_layout_when_a_cycle_loses_the_comment() -> None:
    """slurmrestd down for a cycle: the job comes from dcgm-exporter's hpc_job label alone, which says
    nothing of routing. The job said it routes; one silent cycle must not make it calm."""
    detector = Detector(DetectorConfig())
    nodes = ["n0001", "n0002", "n0003", "n0004"]
    said = Window.empty(1000.0, nodes, 8)
    said.jobs, said.job_refs = {"11": [0, 1, 2, 3]}, {"11": JobRef("11", SLURM, declared_routing=True)}
    detector.step(said)
    silent = Window.empty(1030.0, nodes, 8)
    silent.jobs, silent.job_refs = {"11": [0, 1, 2, 3]}, {"11": JobRef("11", HPC_JOB_LABEL)}
    detector.step(silent)
    state = detector.jobs["11"]
    assert state.declared_routing and presumed_wandering(detector.config, state)
    assert not presumed_wandering(DetectorConfig(declared_routing_below=0), state)


def test_an_eight_node_moe_jobs_first_routing_is_held_where_it_declares() -> None:
    """benign_day_4429's first 35 minutes: its 8-node MoE job 84292 routes from minute 10, the busiest
    place moving every 5 minutes at 14 %, before its gauge has read a wander. Declared jobs of 8 nodes
    count as wandering (``declared_routing_below`` 9): nothing is flagged. With the bound at 8 nodes
    (session 47's) and without the bytes-received test, the routing's busiest nodes are, one per turn;
    with the bytes fewer are (one, measured), so the declaration still counts."""
    flags = benign_day_flags(
        "benign_day_4429",
        35,
        under8={"declared_routing_below": 8, "routing_traffic": 0.0},
        under8_bytes={"declared_routing_below": 8},
    )
    assert flags["shipped"] == [], [f.as_dict() for f in flags["shipped"]]
    assert len(flags["under8_bytes"]) < len(flags["under8"]), flags["under8_bytes"]
    assert len(flags["under8"]) >= 3 and {f.job for f in flags["under8"]} == {"84292"}, flags["under8"]
    assert all("wander_windows" not in f.evidence for f in flags["under8"])  # not held: calm by its gauge


def test_a_twelve_node_moe_jobs_two_minute_routing_is_held_where_it_declares() -> None:
    """benign_day_4453's first hour: its 12-node MoE job 84531 routes from minute 39, the busiest place
    moving every 2 minutes at 18 %, faster than the drift gauge's 8-window means can read (its gauge
    never counted the job as wandering). Declared jobs of up to 12 nodes count as wandering
    (``declared_routing_below`` 13): nothing is flagged. With the bound at 9 (session 49's) and without
    the bytes-received test, its routing turns are, in that job only; with the bytes fewer are (one,
    measured), so the bound still counts."""
    flags = benign_day_flags(
        "benign_day_4453",
        60,
        under9={"declared_routing_below": 9, "routing_traffic": 0.0},
        under9_bytes={"declared_routing_below": 9},
    )
    assert flags["shipped"] == [], [f.as_dict() for f in flags["shipped"]]
    assert len(flags["under9_bytes"]) < len(flags["under9"]), flags["under9_bytes"]
    assert len(flags["under9"]) >= 3 and {f.job for f in flags["under9"]} == {"84531"}, flags["under9"]


def test_the_price_a_gray_node_in_a_declared_twelve_node_job_waits_for_the_hold() -> None:
    """The bound's price (moe_gray_x14_12n, 5-s samples): a node 40 % slower in a declared 12-node MoE
    job is still flagged, and nothing else, but after the routing hold; with the bound at 9 it is
    flagged within a minute of its onset. One simulation feeds both detectors."""
    run = evaluation.run_scenario(
        SCENARIOS / "moe_gray_x14_12n.yaml",
        sample_window=5.0,
        detectors=detector_variants(under9={"declared_routing_below": 9}),
    )
    episodes = [e for e in run.episodes if e.counted]
    assert [(e.job, e.node) for e in episodes] == [("7030", "n0009")], run.episodes
    onset = episodes[0].onset
    first: dict[str, float] = {}
    for name, events in run.events.items():
        flags = [e for e in events if e.kind == "flag"]
        assert {(e.straggler.job, e.straggler.node) for e in flags} == {("7030", "n0009")}, (name, flags)
        first[name] = min(e.time for e in flags) - onset
    assert first["under9"] <= 60.0 < first["shipped"], first
