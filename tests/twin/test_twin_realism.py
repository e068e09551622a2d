"""The twin is as hard as a real cluster by default: calibration figures, NCCL-wait semantics, fault
signatures that scale with magnitude within physics, background counters, benign disturbances, and a
ground truth that lies outside the data and names nothing the data shows."""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from twin_helpers import FLEETSIGHT, SCENARIOS, twin_validate

from fleetsight.settings import REPO_ROOT
from twin import calibrate
from twin.counters import THROTTLE_HW_THERMAL, THROTTLE_SW_POWER, THROTTLE_SW_THERMAL
from twin.fault_kinds import FAULT_KINDS
from twin.scenario import from_dict, load
from twin.sim import Simulation
from twin.truth import TRUTH_KEYS, default_truth_path, load_truth

START = dt.datetime(2026, 11, 21, 10, tzinfo=dt.UTC)


def scenario(nodes: int = 8, job_nodes: int = 8, profile: str = "llm-70b", faults=(), **extra) -> dict:
    return {
        "seed": 5,
        "duration": "30m",
        "cluster": {"name": "t", "nodes": nodes},
        "jobs": [{"id": "1", "nodes": job_nodes, "profile": profile, "checkpoint_interval": "4h"}],
        "faults": list(faults),
        **extra,
    }


def run_physics(raw: dict, minutes: float) -> tuple[Simulation, list[dict[str, np.ndarray]]]:
    """Advance the physics; keep a few fields per tick."""
    sim = Simulation(from_dict(raw), START)
    kept = []
    for _ in range(int(minutes * 60 / sim.scenario.tick)):
        sim.advance()
        sim.kernel_lines.clear()
        sim.app_lines.clear()
        kept.append(
            {
                "t": sim.t,
                "tensor": sim.tensor.copy(),
                "util": sim.gpu_util.copy(),
                "gr": sim.gr_active.copy(),
                "sm": sim.sm_active.copy(),
                "power": sim.power.copy(),
                "temp": sim.gpu_temp.copy(),
                "throttle": sim.throttle.copy(),
                "xmit_wait": sim.ib_counters["port_xmit_wait"][:, 0].astype(float),
                "computing": sim.jobs[0].phase == "compute",
            }
        )
    return sim, kept


def test_calibration_a_ten_percent_straggler_hides_in_one_sample() -> None:
    figures = calibrate.measure()
    assert figures["tensor_cv_per_sample_median"] >= 0.05
    assert 0.02 <= figures["node_10min_mean_range_layout_only"] <= 0.06
    assert figures["node_10min_mean_range"] <= 0.08
    assert figures["slow_node_tensor_z_single_sample_median"] < 2
    assert figures["slow_node_power_z_single_sample_median"] < 2
    assert figures["slow_node_tensor_z_5min_median"] > 2.5, "over minutes the straggler is clear"


def test_realism_off_is_the_clean_twin() -> None:
    figures = calibrate.measure({**calibrate.CALIBRATION_SCENARIO, "realism": "off"})
    assert figures["slow_node_tensor_z_single_sample_median"] > 4


def test_peers_waiting_in_nccl_stay_util_100_while_tensor_and_power_fall() -> None:
    slow = {"kind": "gray_slow_node", "target": {"node": "n0003"}, "onset": "10m", "duration": "20m"}
    _, ticks = run_physics(scenario(faults=[{**slow, "magnitude": 1.5}]), 25)
    before = [t for t in ticks if 200 < t["t"] < 600 and t["computing"]]
    during = [t for t in ticks if t["t"] > 660 and t["computing"]]
    peers = [i for i in range(8) if i != 2]

    def mean(rows: list, key: str, nodes: list[int]) -> float:
        return float(np.mean([r[key][nodes].mean() for r in rows]))

    assert mean(during, "util", peers) > 95, "the NCCL kernel is resident while peers wait"
    assert mean(during, "gr", peers) > 0.9
    assert mean(during, "tensor", peers) < 0.8 * mean(before, "tensor", peers)
    assert mean(during, "sm", peers) < 0.85 * mean(before, "sm", peers)
    assert mean(during, "power", peers) < mean(before, "power", peers) - 60
    # The waiting peers' IB ports pile up port_xmit_wait faster than before; the straggler's less.
    rate_before = (before[-1]["xmit_wait"] - before[0]["xmit_wait"]) / (len(before) or 1)
    rate_during = (during[-1]["xmit_wait"] - during[0]["xmit_wait"]) / (len(during) or 1)
    assert (rate_during[peers] > 1.5 * rate_before[peers]).all()
    assert rate_during[2] < rate_during[peers].min()


@pytest.mark.parametrize(
    ("ratio", "low", "high", "hw_bit"), [(0.9, 83.0, 88.5, False), (0.55, 88.0, 92.5, True)]
)
def test_thermal_signature_scales_with_magnitude_within_physics(
    ratio: float, low: float, high: float, hw_bit: bool
) -> None:
    fault = {
        "kind": "thermal_throttle",
        "target": {"node": "n0002", "gpu": 4},
        "onset": "5m",
        "duration": "20m",
    }
    _, ticks = run_physics(scenario(faults=[{**fault, "magnitude": ratio}]), 15)
    hot = [t["temp"][1, 4] for t in ticks if t["t"] > 600]
    assert low <= float(np.median(hot)) <= high
    assert max(t["temp"].max() for t in ticks) < 95, "an H100 slows down near 90 C; it never reads 125"
    bits = [int(t["throttle"][1, 4]) for t in ticks if t["t"] > 600]
    assert all(b & THROTTLE_SW_THERMAL for b in bits)
    assert any(b & THROTTLE_HW_THERMAL for b in bits) == hw_bit
    healthy = np.delete(np.array([t["throttle"] for t in ticks]).reshape(len(ticks), -1), 1 * 8 + 4, axis=1)
    assert not (healthy & (THROTTLE_SW_THERMAL | THROTTLE_HW_THERMAL)).any()


def test_healthy_busy_gpus_show_power_cap_bit_and_background_counters() -> None:
    sim, ticks = run_physics(scenario(nodes=16, job_nodes=16), 30)
    busy = np.array([t["throttle"] for t in ticks if t["computing"]])
    share = float(((busy & THROTTLE_SW_POWER) > 0).mean())
    assert 0.05 < share < 0.9, f"SW power cap bit on {share:.0%} of busy samples"
    power = np.array([t["power"] for t in ticks if t["computing"]])
    assert power.max() <= 700 + 15 and np.percentile(power, 90) > 600
    assert sim.pcie_replay.sum() > 0, "healthy GPUs replay a PCIe TLP now and then"
    assert (sim.pcie_replay == 0).mean() > 0.5, "most GPUs stay at zero"


def test_psu_brake_power_has_spread_and_mild_cap_is_mild() -> None:
    psu = {"kind": "psu_failure", "target": {"node": "n0002", "psu": 1}, "onset": "5m", "duration": "20m"}
    sim, strong = run_physics(scenario(faults=[{**psu, "magnitude": 150}]), 12)
    braked = np.array([t["power"][1] for t in strong if t["t"] > 400 and t["computing"]])
    assert braked.max() <= 150 and braked.std() > 1.0
    slowdown_strong = load_truth_from(sim)[0]["job_slowdown"]
    sim, _ = run_physics(scenario(faults=[{**psu, "magnitude": 450}]), 12)
    slowdown_mild = load_truth_from(sim)[0]["job_slowdown"]
    assert 1.05 < slowdown_mild < 1.8 < 2.3 < slowdown_strong < 3.6


def load_truth_from(sim: Simulation) -> list[dict[str, Any]]:
    sim.refresh_truth()
    return [line for line in sim.truth_lines if not line["benign"]]


def test_truth_names_the_job_and_its_slowdown_and_benign_events() -> None:
    gray = {"kind": "gray_slow_node", "target": {"node": "n0004"}, "onset": "5m", "duration": "20m"}
    idle = {
        "kind": "thermal_throttle",
        "target": {"node": "n0010", "gpu": 0},
        "onset": "5m",
        "duration": "5m",
    }
    raw = scenario(nodes=10, faults=[{**gray, "magnitude": 1.2}, idle], realism={"benign_per_node_hour": 6})
    sim, _ = run_physics(raw, 30)
    sim.refresh_truth()
    lines = sim.truth_lines
    assert all(set(TRUTH_KEYS) <= set(line) for line in lines)
    faults = {line["kind"]: line for line in lines if not line["benign"]}
    assert faults["gray_slow_node"]["job"] == "1"
    assert 1.1 < faults["gray_slow_node"]["job_slowdown"] < 1.3
    assert faults["thermal_throttle"]["job"] is None and faults["thermal_throttle"]["job_slowdown"] == 1.0
    benign = [line for line in lines if line["benign"]]
    assert benign, "benign disturbances are listed"
    assert {line["kind"] for line in benign} <= {"dataloader_hiccup", "os_jitter", "slow_rank_logging"}
    assert all(line["job"] == "1" and line["job_slowdown"] >= 1.0 for line in benign)
    assert all(not line["job_failed"] for line in lines)


def _spans_s(line: dict[str, Any], key: str) -> list[tuple[float, float]]:
    """A truth line's spans in seconds since the scenario's start."""
    start = START.timestamp()
    return [(a - start, b - start) for a, b in line[key]]


def test_truth_says_what_each_fault_itself_costs_when_faults_overlap() -> None:
    """A mild straggler beside a loud one waits like its peers: while the power brake sets the pace,
    the gray node is masked; before and after, it paces the job by its own share."""
    gray = {"kind": "gray_slow_node", "target": {"node": "n0003"}, "onset": "5m", "duration": "20m"}
    psu = {"kind": "psu_failure", "target": {"node": "n0006", "psu": 0}, "onset": "10m", "duration": "10m"}
    spike = {"kind": "loss_spike", "target": {"node": "n0002"}, "onset": "6m", "duration": "10m"}
    raw = scenario(faults=[{**gray, "magnitude": 1.15}, {**psu, "magnitude": 150}, {**spike, "magnitude": 8}])
    sim, _ = run_physics({**raw, "realism": {"benign_per_node_hour": 0}}, 28)
    lines = {line["kind"]: line for line in load_truth_from(sim)}
    gray_line, psu_line, spike_line = lines["gray_slow_node"], lines["psu_failure"], lines["loss_spike"]
    # The old meaning stays: the job's whole slowdown while the event lasted.
    assert gray_line["job_slowdown"] > 1.3
    # Its own: a few per cent while it paces, masked exactly while the brake lasts.
    # (x1.15 on a middle pipeline stage: the last stage already computes 4 % more, and silicon differs.)
    assert 1.04 < gray_line["fault_slowdown"] < 1.12
    assert _spans_s(gray_line, "masked") == [(600.0, 1200.0)]
    assert _spans_s(gray_line, "pacing") == [(300.0, 600.0), (1200.0, 1500.0)]
    assert psu_line["fault_slowdown"] > 2.0 and _spans_s(psu_line, "pacing") == [(600.0, 1200.0)]
    assert psu_line["masked"] == []
    # A loss spike is the application's: it slows no node, so it neither paces nor is masked.
    assert spike_line["fault_slowdown"] == 1.0 and spike_line["pacing"] == spike_line["masked"] == []


def test_two_equal_stragglers_both_set_the_pace() -> None:
    """Two equally slow nodes: removing one alone does not speed the job, yet neither is masked by a
    slower one; each is a straggler costing what it would cost alone."""
    gray = {"kind": "gray_slow_node", "onset": "5m", "duration": "10m", "magnitude": 1.3}
    faults = [{**gray, "target": {"node": node}} for node in ("n0002", "n0007")]
    sim, _ = run_physics({**scenario(faults=faults), "realism": {"benign_per_node_hour": 0}}, 16)
    for line in load_truth_from(sim):
        assert 1.2 < line["fault_slowdown"] < 1.35
        assert line["masked"] == [] and _spans_s(line, "pacing") == [(300.0, 900.0)]


def test_run_writes_truth_outside_and_nothing_in_the_data_names_the_scenario(tmp_path: Path) -> None:
    out = tmp_path / "data" / "twin"
    result = subprocess.run(
        [*FLEETSIGHT, "twin", "run", "--scenario", "case_11", "--out", str(out), "--duration", "25m"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    truth_path = tmp_path / "data" / "twin.truth.jsonl"
    assert default_truth_path(out) == truth_path and truth_path.exists()
    assert not (out / "truth.jsonl").exists()
    lines = load_truth(truth_path)
    gray = [line for line in lines if line["kind"] == "gray_slow_node"]
    assert len(gray) == 1 and gray[0]["job"] == "7101" and 1.0 < gray[0]["job_slowdown"] < 1.12
    info = json.loads((tmp_path / "data" / "twin.truth.scenario.json").read_text())
    assert info["scenario"] == "case_11"
    meta = json.loads((out / "meta.json").read_text())
    assert "scenario" not in meta and "description" not in meta and meta["cluster"] == "hpc-k"
    job = meta["jobs"][0]
    assert job["nodes"] == [f"n{i:04d}" for i in range(1, 17)]
    assert job["allocations"][0]["nodes"] == job["nodes"] and job["allocations"][0]["start_unix"]
    secrets = ["case_11", "gray", "slow_node", "truth", "straggl"]
    for path in out.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert not [s for s in secrets if s in text], path


def test_truth_inside_the_output_folder_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "o"
    result = subprocess.run(
        [
            *FLEETSIGHT,
            "twin",
            "run",
            "--scenario",
            "case_07",
            "--out",
            str(out),
            "--duration",
            "1m",
            "--truth",
            str(out / "t.jsonl"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )
    assert result.returncode == 1 and "outside the output folder" in result.stderr
    assert "Traceback" not in result.stderr


BAD_CASES = {
    "typo": (
        "faults: [{kind: gray_slow_node, target: {node: n0001}, magnitud: 1.2}]",
        "faults[0].magnitud",
        "did you mean 'magnitude'",
    ),
    "overlap": (
        "jobs: [{id: a, nodes: [n0001-n0003]}, {id: b, nodes: [n0003, n0004]}]",
        "jobs[1].nodes",
        "also in jobs[0]",
    ),
    "oversize": ("jobs: [{id: a, nodes: 3}, {id: b, nodes: 3}]", "jobs[1].nodes", "the cluster has 4"),
    "late_onset": (
        "faults: [{kind: host_crash, target: {node: n0001}, onset: 2h}]",
        "faults[0].onset",
        "after the scenario's end",
    ),
    "gray_below_1": (
        "faults: [{kind: gray_slow_node, target: {node: n0001}, magnitude: 0.8}]",
        "faults[0].magnitude",
        "outside physics",
    ),
    "cap_5000": (
        "faults: [{kind: psu_failure, target: {node: n0001}, magnitude: 5000}]",
        "faults[0].magnitude",
        "outside physics",
    ),
    "gpu_8": (
        "faults: [{kind: xid, target: {node: n0001, gpu: 8, code: 79}}]",
        "faults[0].target.gpu",
        "out of range",
    ),
    "port_12": (
        "faults: [{kind: ib_port_down, target: {node: n0001, port: mlx5_12}}]",
        "faults[0].target.port",
        "out of range",
    ),
    "psu_7": (
        "faults: [{kind: psu_failure, target: {node: n0001, psu: 7}}]",
        "faults[0].target.psu",
        "out of range",
    ),
    "node_9": (
        "faults: [{kind: host_crash, target: {node: n0009}}]",
        "faults[0].target.node",
        "unknown node",
    ),
}


def test_validate_rejects_each_bad_case_with_one_line(tmp_path: Path) -> None:
    files = []
    for name, (body, _, _) in BAD_CASES.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"duration: 1h\ncluster: {{nodes: 4, psus_per_node: 6}}\n{body}\n")
        files.append(str(path))
    shipped = sorted(str(p) for p in SCENARIOS.glob("*.yaml"))
    result = twin_validate(*files, *shipped)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == len(files) + len(shipped)
    for name, (_, key, reason) in BAD_CASES.items():
        line = next(line for line in lines if f"{name}.yaml" in line)
        assert line.startswith("INVALID") and key in line and reason in line, line
    assert all(line.startswith("ok") for line in lines if "/twin/scenarios/" in line)


def test_run_refuses_a_bad_file_with_the_same_line(tmp_path: Path) -> None:
    """`run` trips on what `validate` reports, with one line naming file, key and reason."""
    body, key, reason = BAD_CASES["psu_7"]
    path = tmp_path / "psu_7.yaml"
    path.write_text(f"duration: 1h\ncluster: {{nodes: 4, psus_per_node: 6}}\n{body}\n")
    result = subprocess.run(
        [*FLEETSIGHT, "twin", "run", "--scenario", str(path), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and key in lines[0] and reason in lines[0], lines


def test_shipped_scenarios_have_range_and_neutral_names() -> None:
    scenarios = [load(p) for p in sorted(SCENARIOS.glob("*.yaml"))]
    sizes = {s.cluster.nodes for s in scenarios}
    assert min(sizes) <= 8 and max(sizes) >= 128
    assert any(job.size == 2 for s in scenarios for job in s.jobs), "2-node jobs"
    assert {job.pipeline_stages for s in scenarios for job in s.jobs} >= {1, 2, 4}
    grays = [f.magnitude for s in scenarios for f in s.faults if f.kind == "gray_slow_node"]
    assert min(grays) <= 1.05, "stragglers down to the detection limit"
    onsets = {f.onset for s in scenarios for f in s.faults}
    assert len(onsets) > 10
    kinds = {f.kind for s in scenarios for f in s.faults}
    assert {"lustre_ost_slow", "loss_spike"} <= kinds, "confounders"
    idle_faults = 0
    for s in scenarios:
        named = {n for job in s.jobs if not isinstance(job.nodes, int) for n in job.nodes}
        if all(not isinstance(job.nodes, int) for job in s.jobs):
            idle_faults += sum(1 for f in s.faults if f.target.get("node") and f.target["node"] not in named)
    assert idle_faults >= 2, "faults on idle nodes"
    words = [*FAULT_KINDS, "psu", "thermal", "xid", "crash", "gray", "slow", "flap", "fault", "spike"]
    for path in SCENARIOS.glob("*.yaml"):
        raw = yaml.safe_load(path.read_text())
        if path.stem not in ("demo", "fault_free_day", "mixed_day"):
            assert not [w for w in words if w in path.stem], path.stem
        cluster = raw["cluster"]["name"]
        assert not [w for w in words if w in cluster], f"{path.name}: cluster {cluster} names a fault"


def test_run_can_cut_its_history_into_tsdb_blocks(tmp_path: Path) -> None:
    out, blocks = tmp_path / "twin", tmp_path / "tsdb"
    result = subprocess.run(
        [
            *FLEETSIGHT,
            "twin",
            "run",
            "--scenario",
            "case_07",
            "--out",
            str(out),
            "--duration",
            "3m",
            "--history",
            str(blocks),
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (blocks / "wal").mkdir(exist_ok=True)  # promtool 2.42 opens the WAL even to dump blocks
    dump = subprocess.run(
        ["promtool", "tsdb", "dump", str(blocks)], capture_output=True, text=True, check=True
    )
    power = [line for line in dump.stdout.splitlines() if "DCGM_FI_DEV_POWER_USAGE" in line]
    assert len(power) == 4 * 8 * 36, "every GPU of the 4 nodes at every 5 s tick of 3 minutes"
    assert {"6701", "6702"} == set(re.findall(r'hpc_job="(\d+)"', "\n".join(power)))
