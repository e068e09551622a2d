"""The detector on the twin's physics (in-process, the evaluation's path): the straggler is flagged
with its cause within the latency target, nobody else is, and a fault-free stretch with checkpoints,
stalls and job starts/ends raises nothing. Expected nodes and onsets come from the twin's truth."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from anomaly_helpers import detector_variants

from anomaly.detector import DetectorConfig, Event, Straggler
from evaluation import anomaly as evaluation
from evaluation.scenarios import resolve as resolve_scenario
from fleetsight.settings import REPO_ROOT
from fleetsight.slurmrest import expand_hostlist, running_jobs
from support import FLEETSIGHT
from twin.scenario import load as load_scenario

SPANS_4N = Path(__file__).resolve().parent / "moe_routing_spans_4n.yaml"
# Scenario files of evaluation/scenarios/anomaly: one fault each, in a job of 8 or 16 nodes.
# Scope: a PSU failure brakes every GPU of the node and a gray node slows them all ("node", no GPU
# named); a hot GPU or a downgraded link slows one ("gpu", that GPU).
CASES = [
    ("psu_cap150_16n", "power_brake", 60.0, "node"),
    ("thermal_r06_8n", "thermal", 60.0, "gpu"),
    ("pcie_gen1_16n", "pcie", 120.0, "gpu"),
    ("gray_x13_8n", "unknown", 120.0, "node"),
]


def fault_gpu_and_job_size(scenario: str) -> tuple[int | None, int]:
    """The faulty GPU (None: the node's) and the job's GPU count, from the scenario file."""
    spec = yaml.safe_load(resolve_scenario(scenario).read_text())
    first, last = spec["jobs"][0]["nodes"].split("-")  # the twin's range, e.g. n0001-n0016
    return spec["faults"][0]["target"].get("gpu"), 8 * (int(last[1:]) - int(first[1:]) + 1)


@pytest.mark.parametrize(("scenario", "cause", "latency_s", "scope"), CASES)
def test_straggler_flagged_with_cause(scenario: str, cause: str, latency_s: float, scope: str) -> None:
    run = evaluation.run_scenario(resolve_scenario(scenario))
    episodes = [e for e in run.episodes if e.counted]
    assert len(episodes) == 1, f"the twin's truth should hold one slowing fault: {run.episodes}"
    assert episodes[0].slowdown >= 0.1
    episode = episodes[0]
    flags = [e for e in run.events["detector"] if e.kind == "flag"]
    assert [(f.straggler.job, f.straggler.node) for f in flags] == [(episode.job, episode.node)], flags
    flag = flags[0]
    assert flag.straggler.cause == cause
    assert episode.onset <= flag.time <= episode.onset + latency_s
    evidence = flag.straggler.evidence
    # The straggler is the busy one: its tensor activity is above its peers' median.
    assert evidence["tensor_active"] > evidence["tensor_active_peers_median"]
    clears = [e for e in run.events["detector"] if e.kind == "clear"]
    assert clears and clears[0].time >= episode.end, "the flag must hold while the fault lasts"
    # The GPU where one GPU is the cause, none where the whole node is.
    assert evidence["scope"] == scope
    gpu, job_gpus = fault_gpu_and_job_size(scenario)
    assert flag.straggler.gpu == gpu and evidence["gpus"] == ([gpu] if scope == "gpu" else list(range(8)))
    # The job's cost: GPU-hours its GPUs idled, against the twin's truth (slowdown while it paced).
    impact = evidence["impact"]
    idle = episode.slowdown / (1 + episode.slowdown)
    truth = idle * job_gpus * episode.pacing_s / 3600
    assert impact["job_gpus"] == job_gpus
    assert 0.7 * truth <= impact["gpu_hours_lost"] <= 1.3 * truth, (impact, truth)


def test_two_stragglers_in_one_job_and_small_jobs() -> None:
    for name in ("two_stragglers_16n", "small_jobs_6n"):
        run = evaluation.run_scenario(resolve_scenario(name))
        flagged = {(e.straggler.job, e.straggler.node) for e in run.events["detector"] if e.kind == "flag"}
        power_braked = {(e.job, e.node) for e in run.episodes if e.counted and e.kind == "psu_failure"}
        assert power_braked and power_braked <= flagged, (name, flagged, run.episodes)
        wrong = flagged - {(e.job, e.node) for e in run.episodes}
        assert not wrong, f"{name}: flags on nodes without a fault: {wrong}"


def test_mixture_of_experts_jobs() -> None:
    """Expert routing moves load between the nodes of a MoE job for minutes: that imbalance is not a
    straggler (no flag in a 3- and a 4-node MoE job over two hours); a node 40 % slower is one."""
    quiet = evaluation.run_scenario(resolve_scenario("moe_small_fault_free_7n"))
    assert quiet.fault_free
    flags = [e.straggler.as_dict() for e in quiet.events["detector"] if e.kind == "flag"]
    assert flags == [], flags
    loud = evaluation.run_scenario(resolve_scenario("moe_gray_x14_8n"))
    episodes = [e for e in loud.episodes if e.counted]
    assert len(episodes) == 1, loud.episodes
    flagged = [(e.straggler.job, e.straggler.node) for e in loud.events["detector"] if e.kind == "flag"]
    assert flagged == [(episodes[0].job, episodes[0].node)], flagged


def events_of_each(
    path: Path, sample_window: float | None = None, **overrides: int | dict[str, float]
) -> dict[str, list[Event]]:
    """One simulation through the shipped detector (``shipped``) and one per named override of
    ``step_exempt_below`` (an int) or of several settings (a dict; evaluation.anomaly.run_scenario's
    ``detectors``): each one's flags and clears."""
    variants = {
        name: value if isinstance(value, dict) else {"step_exempt_below": value}
        for name, value in overrides.items()
    }
    detectors = detector_variants(**variants)
    return evaluation.run_scenario(path, sample_window=sample_window, detectors=detectors).events


def test_routing_that_moves_at_once_is_held_in_a_four_node_moe_job() -> None:
    """The twin's expert routing (`moe_imbalance`) hands the busiest place to another node from one
    window to the next: in a 4-node MoE job that is a sudden lasting rise, the step path's signature.
    At 5-s samples, with the step path exempt from the routing hold as it was, the job's routing was
    flagged (the benign training day's job 7205 twice, this scenario once); held like every other
    path in a wandering job of four nodes or more, nothing is. The exempt variant also goes without the
    bytes-received test (``routing_traffic`` 0), which would withhold those flags by itself: the hold is
    what is tested here. One simulation feeds both detectors."""
    exempt = {"step_exempt_below": DetectorConfig().few_nodes, "routing_traffic": 0.0}
    events = events_of_each(SPANS_4N, 5.0, exempt=exempt)
    flags = {
        name: [
            (e.straggler.job, e.straggler.node, e.straggler.evidence["path"]) for e in got if e.kind == "flag"
        ]
        for name, got in events.items()
    }
    assert flags["shipped"] == [], flags["shipped"]
    # The scenario does make the case: the exempt step path flags the routing's busiest node.
    assert flags["exempt"] and {job for job, _, _ in flags["exempt"]} == {"7601"}, flags["exempt"]


def test_fault_free_hours_raise_no_flag() -> None:
    run = evaluation.run_scenario(resolve_scenario("fault_free_12n_4h"))
    assert run.fault_free and run.hours >= 4
    flags = [e for e in run.events["detector"] if e.kind == "flag"]
    assert flags == [], [e.straggler.as_dict() for e in flags]
    # The naive power threshold does fire on checkpoints: the scenario does exercise them.
    assert any(e.kind == "flag" for e in run.events["static_power"])


def _flag(node: str, time: float) -> Event:
    return Event("flag", time, Straggler("1", node, "unknown", 0, 5.0, time, {}))


def test_scoring_counts_a_fault_only_while_it_sets_the_pace() -> None:
    """A mild straggler masked by a loud one: a flag on it then is neither right nor wrong, and its
    latency runs from when it paces again; a loss spike (the application's, no node slowed) shelters
    no flag; a flag on a node without a fault is wrong."""
    mild = evaluation.Episode(
        "s", "f1", "gray_slow_node", "1", "n1", 0.0, 1800.0, 0.08, pacing=[(0.0, 60.0), (900.0, 1800.0)]
    )
    mild.masked = [(60.0, 900.0)]
    loud = evaluation.Episode("s", "f2", "psu_failure", "1", "n2", 60.0, 900.0, 1.5, pacing=[(60.0, 900.0)])
    spike = evaluation.Episode("s", "f3", "loss_spike", "1", "n3", 0.0, 1800.0, 0.0, pacing=[])
    events = [_flag("n1", 300.0), _flag("n2", 90.0), _flag("n1", 1020.0), _flag("n3", 1500.0)]
    run = evaluation.ScenarioRun("s", 4, 0.5, False, [mild, loud, spike], {"detector": events})
    figures = evaluation.score([run], "detector")
    assert (figures["true_flags"], figures["wrong_flags"], figures["recall"]) == (2, 1, 1.0)
    assert figures["by_kind"]["gray_slow_node"]["latency_median_s"] == 120.0
    assert figures["by_kind"]["psu_failure"]["latency_median_s"] == 30.0
    assert [w["node"] for w in figures["wrong"]] == ["n3"] and figures["missed"] == []


def test_evaluate_cli_json_has_the_contract_keys() -> None:
    result = subprocess.run(
        [*FLEETSIGHT, "evaluate", "anomaly", "--scenario", "psu_cap150_16n", "--json", "--duration", "20m"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    for key in ("precision", "recall", "latency_median_s", "false_flags", "baselines", "by_kind", "by_band"):
        assert key in report
    # --duration: only the first 20 of the scenario's 40 minutes; the brake (from 14 min) is in it.
    assert report["scenarios"][0]["hours"] == round(20 / 60, 2) and report["recall"] == 1.0
    assert set(report["baselines"]) == {"static_power", "zscore"}
    assert report["recall"] == 1.0 and report["precision"] == 1.0
    assert report["by_kind"]["psu_failure"]["episodes"] == 1
    assert report["by_kind"]["psu_failure"]["cause_accuracy"] == 1.0
    # The target population (a 3x power brake is in it), counted apart.
    assert report["at_target"]["episodes"] == 1 and report["at_target"]["recall"] == 1.0


def test_evaluate_cli_rejects_unknown_scenario() -> None:
    result = subprocess.run(
        [*FLEETSIGHT, "evaluate", "anomaly", "--scenario", "no_such_scenario"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "no_such_scenario" in result.stderr and "Traceback" not in result.stderr


def test_slurm_hostlists_and_running_jobs() -> None:
    assert expand_hostlist("n[0001-0003,0007],gpu-a1") == ["n0001", "n0002", "n0003", "n0007", "gpu-a1"]
    assert expand_hostlist("n0005") == ["n0005"]
    body = {
        "jobs": [
            {"job_id": 11, "job_state": ["RUNNING"], "nodes": "n[0001-0002]"},
            {"job_id": 12, "job_state": ["PENDING", "REQUEUED"], "nodes": ""},
            {"job_id": 13, "job_state": "RUNNING", "nodes": "n0009"},
        ]
    }
    assert running_jobs(body) == {"11": ["n0001", "n0002"], "13": ["n0009"]}


SMALL_MOE_BRAKE = """\
name: small_moe_brake
description: a power brake (~290 W) on one node of a 2-node mixture-of-experts job
seed: 5
start: '2026-11-22T06:00:00Z'
duration: 30m
tick: 5s
cluster:
  name: t
  nodes: 6
jobs:
- id: '7'
  name: moe-0
  nodes: n0001-n0002
  profile: moe-8x22b
  checkpoint_interval: 20m
- id: '8'
  name: vision-1
  nodes: n0003-n0006
  profile: vision
  checkpoint_interval: 29m
faults:
- kind: psu_failure
  target:
    node: n0002
    psu: 1
  onset: 9m
  duration: 14m
  magnitude: 290
"""


def test_power_brake_in_a_two_node_moe_job(tmp_path) -> None:
    """Expert routing swings a 2-node job's load by ~25 % between its nodes, so the small-job scale is
    too wide for the z-score; the braked node still shows as the busier one at a lower clock and power,
    with the brake bit: flagged with its cause for as long as the brake lasts (the z-score alone let
    the flag go after 6 of its 14 minutes), and its peer (busy by routing before) never."""
    path = tmp_path / "small_moe_brake.yaml"
    path.write_text(SMALL_MOE_BRAKE)
    run = evaluation.run_scenario(path)
    episodes = [e for e in run.episodes if e.counted]
    assert [(e.job, e.node) for e in episodes] == [("7", "n0002")], run.episodes
    flags = [e for e in run.events["detector"] if e.kind == "flag"]
    assert [(f.straggler.job, f.straggler.node, f.straggler.cause) for f in flags] == [
        ("7", "n0002", "power_brake")
    ], [f.straggler.as_dict() for f in flags]
    assert episodes[0].onset <= flags[0].time <= episodes[0].onset + 120.0
    evidence = flags[0].straggler.evidence
    assert evidence["tensor_active"] > evidence["tensor_active_peers_median"]
    assert evidence["power_w"] < evidence["power_w_peers_median"]
    clears = [e for e in run.events["detector"] if e.kind == "clear"]
    assert clears and clears[0].time >= episodes[0].end, "the flag must hold while the brake lasts"


FOUR_NODE_MOE = """\
name: moe_four_nodes
description: a fault-free 4-node mixture-of-experts job beside two dense ones
seed: 7209
start: '2026-11-22T06:00:00Z'
duration: 1h
tick: 5s
cluster:
  name: gen
  nodes: 24
jobs:
- id: '9100'
  name: vision-0
  nodes: n0001-n0004
  profile: vision
  checkpoint_interval: 23m
- id: '9102'
  name: moe-8x22b-2
  nodes: n0005-n0008
  profile: moe-8x22b
  checkpoint_interval: 11m
- id: '9103'
  name: llm-8b-3
  nodes: n0009-n0024
  profile: llm-8b
  checkpoint_interval: 11m
faults: []
"""


def test_four_node_moe_job_swings_raise_no_flag(tmp_path) -> None:
    """A 4-node mixture-of-experts job learns a cross-sectional spread of ~2 % in its first calm
    windows, then routing swings its nodes by 15-25 % for minutes: against that spread healthy nodes
    reached z 7-11 and were flagged. Jobs of a few nodes take their scale from their own recent windows."""
    path = tmp_path / "four_node_moe.yaml"
    path.write_text(FOUR_NODE_MOE)
    run = evaluation.run_scenario(path)
    assert run.fault_free and run.hours >= 1
    flags = [e.straggler.as_dict() for e in run.events["detector"] if e.kind == "flag"]
    assert flags == [], flags


SMALL_MOE_GRAY = """\
name: small_moe_gray
description: a gray node (x1.5, no hardware signal) in one of three 2-node mixture-of-experts jobs
seed: 11
start: '2026-11-22T06:00:00Z'
duration: 1h
tick: 5s
cluster:
  name: t
  nodes: 6
jobs:
- {id: '7', name: moe-0, nodes: n0001-n0002, profile: moe-8x22b, checkpoint_interval: 20m}
- {id: '8', name: moe-1, nodes: n0003-n0004, profile: moe-8x22b, checkpoint_interval: 25m}
- {id: '9', name: moe-2, nodes: n0005-n0006, profile: moe-8x22b, checkpoint_interval: 15m}
faults:
- {kind: gray_slow_node, target: {node: n0001}, onset: 15m, duration: 12m, magnitude: 1.5}
"""


def test_a_gray_node_in_a_two_node_moe_job_rises_suddenly_and_is_held_like_routing(tmp_path) -> None:
    """Routing swings a 2-node MoE job's nodes by 15-25 %; a gray node has no hardware signal to tell it
    from that, but it breaks in from one window to the next (the step path). So does routing that hands
    the busiest place to the other node at once: the drawn benign days' 2- and 3-node MoE jobs were
    flagged 14 times so, and the step path's hits are now held like every other path in a wandering
    job. The price, shown here from one simulation: exempt (at the offsets' old 8 % cap), the step
    path flags the gray node within three minutes and holds it while it lasts; shipped, it is not
    flagged within its 12 minutes, and nothing else is. Since the cap is 14 % (a pipeline's last stage
    on slow silicon, docs/anomaly.md "A new layout and a pipeline's last stage") the exempt setting
    does not find it either (not traced; the shipped setting never did). The old settings had no
    thaw (``wander_thaw``): with it, the gray node, whose offset was below 0 when it set in, learns
    part of its slowdown back up to 0 and the old settings lose it too (docs/anomaly.md, "An offset
    learnt in a low spell")."""
    path = tmp_path / "small_moe_gray.yaml"
    path.write_text(SMALL_MOE_GRAY)
    scenario = load_scenario(path)
    old_cap = {"step_exempt_below": 3, "max_offset": 0.08, "wander_thaw": False}
    events = events_of_each(path, exempt=3, old_cap=old_cap)
    (fault,) = scenario.faults
    onset = scenario.start.timestamp() + fault.onset
    flags = [(e.straggler.job, e.straggler.node, e.time) for e in events["old_cap"] if e.kind == "flag"]
    assert [(job, node) for job, node, _ in flags] == [("7", "n0001")], flags
    assert onset < flags[0][2] <= onset + 180.0
    clears = [e.time for e in events["old_cap"] if e.kind == "clear"]
    assert clears and clears[0] >= onset + fault.duration, "the flag must hold while the fault lasts"
    assert [e for e in events["exempt"] if e.kind == "flag"] == []
    assert [e for e in events["shipped"] if e.kind == "flag"] == []


def test_two_node_moe_jobs_without_a_fault_raise_no_flag(tmp_path) -> None:
    """The step path's guard: two hours of three 2-node MoE jobs with their benign disturbances (a
    peer's sampler landing in the communication phase for a minute looks like a sudden rise too)."""
    quiet = SMALL_MOE_GRAY.replace("seed: 11", "seed: 12").replace("duration: 1h", "duration: 2h")
    path = tmp_path / "small_moe_quiet.yaml"
    path.write_text(quiet.split("faults:")[0] + "faults: []\n")
    run = evaluation.run_scenario(path)
    assert run.fault_free and run.hours >= 2
    flags = [e.straggler.as_dict() for e in run.events["detector"] if e.kind == "flag"]
    assert flags == [], flags


SMALL_MOE_PCIE = """\
name: small_moe_pcie
description: a GPU's PCIe link down to Gen2 in a 3-node mixture-of-experts job
seed: {seed}
start: '2026-11-22T06:00:00Z'
duration: 40m
tick: 5s
cluster:
  name: t
  nodes: 5
jobs:
- {{id: '7', name: moe-0, nodes: n0001-n0003, profile: moe-8x22b, checkpoint_interval: 25m,
   pipeline_stages: 1}}
- {{id: '8', name: dense-1, nodes: n0004-n0005, profile: llm-8b, checkpoint_interval: 30m}}
faults:
- {{kind: pcie_downgrade, target: {{node: n0002, gpu: 5, gen: 2}}, onset: 12m, duration: 12m, magnitude: 2.0}}
"""


@pytest.mark.parametrize("seed", [24, 27])
def test_a_pcie_downgrade_in_a_three_node_moe_job_and_no_one_else(tmp_path, seed: int) -> None:
    """A starved link keeps its GPU busy at its clock (power above its peers', not below), so the small
    jobs' hardware path takes the downgrade itself as the signal (seed 27: an 11 % slowdown missed
    before). And a peer that routing makes the busiest of the job is not a straggler: with the job's
    averages already wandering by 3 %, the slow path asks for a hardware signal (seed 24: a peer flagged
    3 minutes after the fault ended, before)."""
    path = tmp_path / f"small_moe_pcie_{seed}.yaml"
    path.write_text(SMALL_MOE_PCIE.format(seed=seed))
    run = evaluation.run_scenario(path)
    (episode,) = [e for e in run.episodes if e.counted]
    flags = [
        (e.straggler.job, e.straggler.node, e.straggler.cause)
        for e in run.events["detector"]
        if e.kind == "flag"
    ]
    assert flags == [("7", "n0002", "pcie")], flags
    first = next(e for e in run.events["detector"] if e.kind == "flag")
    assert episode.onset < first.time <= episode.onset + 180.0
