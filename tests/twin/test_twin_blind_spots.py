"""The kinds that are not the node's hardware (issue 41): each renders in its real format (dcgm-exporter's
page, kernel log, Fabric Manager's log, the checks' tool answers, an endpoint that stops answering) and is
listed in the truth with "hardware": false, so that an evaluation counts a drain for one as a wrong drain.

One in-process run of tests/twin/scenarios/not_hardware.yaml (13 nodes, 5 simulated minutes, a few
seconds); the endpoints are answered by the twin's own handlers without a socket."""

from __future__ import annotations

import contextlib
import io
import random
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from twin_helpers import FORMAT_SCENARIOS

from evaluation.health import Timeline, fault_rows, summarize, wrong_drains
from exporters.bmc import BmcSource
from exporters.core import Problems
from exporters.redfish import RedfishClient
from twin import api, checks, dcgm, hardware, layout
from twin.fault_kinds import NOT_HARDWARE_KINDS
from twin.history import HistoryRecorder, write_openmetrics
from twin.runner import Runner, RunOptions
from twin.scenario import ScenarioError, from_dict, load
from twin.server import TwinServer
from twin.sim import Simulation
from twin.truth import Fault, load_faults

SCENARIO = FORMAT_SCENARIOS / "not_hardware.yaml"
BLIND_SPOTS = Path(__file__).resolve().parents[2] / "evaluation" / "scenarios" / "health" / "blind_spots.yaml"


@dataclass
class Run:
    sim: Simulation
    out: Path
    truth: Path

    def index(self, node: str) -> int:
        return self.sim.node_index[node]

    def page(self, node: str) -> dict[str, dict[str, float]]:
        """The node's dcgm-exporter page, parsed: {metric: {gpu: value}}."""
        parsed: dict[str, dict[str, float]] = {}
        for family in text_string_to_metric_families(dcgm.metrics(self.sim, self.index(node))):
            for sample in family.samples:
                parsed.setdefault(sample.name, {})[sample.labels["gpu"]] = sample.value
        return parsed

    def kern(self, node: str) -> str:
        return layout.kernel_log(self.out, node).read_text()

    def fabric_log(self, node: str) -> str:
        return layout.fabric_manager_log(self.out, node).read_text()

    def fault(self, kind: str, node: str | None = None) -> Fault:
        found = [f for f in load_faults(self.truth) if f.kind == kind and (node is None or f.node == node)]
        assert len(found) == 1, found
        return found[0]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    out = tmp_path_factory.mktemp("not-hardware") / "out"
    runner = Runner(load(SCENARIO), RunOptions(out=out, speed=None))
    runner.run()
    yield Run(runner.sim, out, runner.writer.truth_path)


def test_every_new_kind_is_in_the_truth_as_not_hardware(run: Run) -> None:
    faults = [f for f in load_faults(run.truth) if not f.benign]
    assert {f.kind for f in faults if not f.hardware} == set(NOT_HARDWARE_KINDS)
    for fault in faults:
        assert fault.line.get("hardware") is (False if fault.kind in NOT_HARDWARE_KINDS else None), fault.kind
        assert fault.line["effects"], fault.kind
    assert run.fault("psu_failure").hardware
    # A crashed job's truth names its nodes (the target names only the job).
    crash = run.fault("job_crash_xids")
    assert crash.node is None and crash.nodes == ["n0005", "n0006"]
    assert crash.line["job"] == "3002" and crash.line["job_failed"] is True


def test_a_silent_dcgm_exporter_answers_503_and_its_history_records_up_0(run: Run) -> None:
    server = SimpleNamespace(sim=run.sim, lock=threading.RLock(), random=random.Random(0), dcgm_cache={})
    status, body = TwinServer.dcgm(server, "n0001")  # the HTTP handler's own answer, no socket
    assert status == 503 and "not answering" in body
    assert TwinServer.dcgm(server, "n0005")[0] == 200
    assert not run.sim.answers(run.index("n0001"), "dcgm-exporter")
    recorder = HistoryRecorder(run.sim, 1)
    recorder.record(run.sim)
    history = recorder.recorded()
    assert not history.answered[0, run.index("n0001")] and history.answered[0, run.index("n0002")]
    text = io.StringIO()
    write_openmetrics(text, run.sim, history)
    assert re.search(r'^up\{node="n0001",[^}]*\} 0 ', text.getvalue(), re.M)
    assert re.search(r'^up\{node="n0002",[^}]*\} 1 ', text.getvalue(), re.M)
    assert "DCGM_FI_DEV_POWER_USAGE{" in text.getvalue()
    assert not re.search(r'^DCGM_FI_DEV_POWER_USAGE\{[^}]*node="n0001"', text.getvalue(), re.M)


def test_a_silent_bmc_answers_503_and_the_node_agents_bmc_collector_fails(run: Run) -> None:
    transport = api.RouterTransport(api.router(api.Views(run.sim, contextlib.nullcontext(), "http://twin")))
    with httpx.Client(transport=transport, base_url="http://twin") as client:
        silent = client.get("/bmc/n0003/redfish/v1/Chassis/1/Power")
        assert silent.status_code == 503
        assert silent.json()["error"]["code"].endswith("ServiceTemporarilyUnavailable")
        assert client.get("/bmc/n0003/redfish/v1/Nothing").status_code == 503
        assert client.get("/bmc/n0001/redfish/v1/Chassis/1/Power").status_code == 200
    # The real collector (as the node agent runs it) reports the failure: ExporterDown's collector half.
    for node, fails in (("n0003", True), ("n0001", False)):
        client = RedfishClient(layout.bmc_url("http://twin", node), None, 5.0, False, transport=transport)
        problems = Problems()
        families = BmcSource(client, interval_s=0.0).gather(problems)
        up = next(s.value for f in families for s in f.samples if s.name == "fleetsight_bmc_up")
        assert bool(problems.by_source) is fails and up == (0.0 if fails else 1.0), node
        client.close()


def test_a_silent_node_agent_is_marked_for_the_agents_runner(run: Run) -> None:
    """The node agent is FleetSight's own process, not the twin's: the twin says it is silent and whoever
    runs the twin's agents (the backfill, the local stack) stops answering for that node."""
    sim = run.sim
    assert not sim.answers(run.index("n0002"), "node_agent")
    assert sim.answers(run.index("n0002"), "dcgm-exporter") and sim.answers(run.index("n0002"), "bmc")
    assert all(sim.answers(run.index("n0001"), s) for s in ("node_agent", "bmc"))
    with pytest.raises(KeyError, match="unknown source"):
        sim.answers(0, "ufm")


def test_profiling_fields_read_0_while_power_and_clocks_stay_busy(run: Run) -> None:
    blind, peer = run.page("n0004"), run.page("n0003")
    for gpu in map(str, range(8)):
        for field in (
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "DCGM_FI_PROF_SM_ACTIVE",
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "DCGM_FI_PROF_DRAM_ACTIVE",
            "DCGM_FI_PROF_PCIE_TX_BYTES",
        ):
            assert blind[field][gpu] == 0.0, (field, gpu)
            assert peer[field][gpu] > 0.0, (field, gpu)
        # what DCGMProfilingBlind (rules/blindness.yml) reads: engine 0, power above 40 % of the limit
        assert blind["DCGM_FI_DEV_POWER_USAGE"][gpu] > 0.4 * blind["DCGM_FI_DEV_ENFORCED_POWER_LIMIT"][gpu]
        assert blind["DCGM_FI_DEV_SM_CLOCK"][gpu] > 1500 and blind["DCGM_FI_DEV_GPU_UTIL"][gpu] > 90


def test_an_xid_storm_is_one_line_repeated_on_one_gpu(run: Run) -> None:
    bus = hardware.xid_bus_id(hardware.GPU_BDFS[3])
    lines = [line.split("] ", 1)[1] for line in run.kern("n0007").splitlines() if "NVRM: Xid" in line]
    assert len(lines) == 250 and len(set(lines)) == 1
    assert lines[0].startswith(f"NVRM: Xid (PCI:{bus}): 31, ") and "MMU Fault" in lines[0]
    assert run.page("n0007")["DCGM_FI_DEV_XID_ERRORS"]["3"] == 31
    assert run.fault("xid_storm").magnitude == 250


def test_a_crashed_job_logs_an_application_xid_on_every_gpu_of_every_node(run: Run) -> None:
    for node in ("n0005", "n0006"):
        xids = re.findall(r"NVRM: Xid \(PCI:([0-9a-f:]+)\): (\d+), pid=\d+", run.kern(node))
        assert sorted(bus for bus, _ in xids) == sorted(hardware.xid_bus_id(b) for b in hardware.GPU_BDFS)
        assert {code for _, code in xids} == {"13"}
        assert set(run.page(node)["DCGM_FI_DEV_XID_ERRORS"].values()) == {13.0}
        folder = layout.job_log_dir(run.out, node, "3002")
        for rank_log in folder.glob("rank-*.log"):
            assert "CUDA error: an illegal memory access was encountered" in rank_log.read_text()
    assert "NVRM: Xid" not in run.kern("n0004")
    assert next(j for j in run.sim.jobs if j.spec.id == "3002").state == "FAILED"


def test_a_missing_tool_answers_as_the_shell_does(
    run: Run, tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    # The truth file, at a moment the fault is active: the stand-in's view of the node.
    mid = run.fault("check_tool_missing").onset + 60
    faults = checks.active_faults(run.truth, "n0008", now=mid)
    assert checks.missing_tool("gpu-probe", faults) == "fleetsight-gpu-probe"
    assert checks.missing_tool("dcgmi", faults) is None
    assert checks.missing_tool("gpu-probe", checks.active_faults(run.truth, "n0007", now=mid)) is None
    # The stand-in as the checks runner calls it (a faults file of the current moment).
    file = tmp_path / "faults.yaml"
    file.write_text(yaml.safe_dump({"n0008": faults}))
    capfd.readouterr()
    assert checks.main(["--faults", str(file), "--node", "n0008", "gpu-probe", "gemm"]) == 127
    out, err = capfd.readouterr()
    assert out == "" and err == "sh: 1: fleetsight-gpu-probe: not found\n"
    assert checks.main(["--faults", str(file), "--node", "n0008", "dcgmi", "diag", "-r", "1", "-j"]) == 0
    assert checks.main(["--faults", str(file), "--node", "n0007", "gpu-probe", "gemm"]) == 0
    assert "fleetsight-probe v1 done" in capfd.readouterr().out


def test_fabric_manager_down_in_its_log_the_gpus_fabric_state_and_a_job_that_starts(run: Run) -> None:
    log = run.fabric_log("n0009")
    assert re.search(
        r"^\[Nov 21 2026 10:02:00\] \[INFO\] \[tid \d+\] Received signal 15, Fabric Manager is "
        r"shutting down$",
        log,
        re.M,
    )
    assert "[ERROR]" in log and "Fabric Manager is not running" in log
    assert set(run.page("n0009")["DCGM_FI_DEV_FABRIC_MANAGER_STATUS"].values()) == {1.0}  # not started
    assert set(run.page("n0010")["DCGM_FI_DEV_FABRIC_MANAGER_STATUS"].values()) == {3.0}  # success
    # The job that started at minute 3 on it fails at CUDA initialisation; the one running on n0011 runs on.
    late = next(j for j in run.sim.jobs if j.spec.id == "3003")
    assert late.state == "FAILED" and late.exit_reason == "fabric_manager"
    ranks = layout.job_log_dir(run.out, "n0009", "3003").glob("rank-*.log")
    assert all("CUDA error: system not yet initialized" in p.read_text() for p in ranks)
    assert next(j for j in run.sim.jobs if j.spec.id == "3004").state == "RUNNING"
    assert run.fault("fabric_manager_down", "n0009").line["job_failed"] is True
    # Started again: its start-up lines, and the fabric back to success.
    assert "Successfully configured all the available NVSwitches" in run.fabric_log("n0012")
    assert set(run.page("n0012")["DCGM_FI_DEV_FABRIC_MANAGER_STATUS"].values()) == {3.0}


BAD_TARGETS = [
    ("telemetry_dropout", {"node": "n0001"}, "target.source: a telemetry_dropout fault needs the source"),
    (
        "telemetry_dropout",
        {"node": "n0001", "source": "ufm"},
        "target.source: expected a source (dcgm-exporter, node_agent, bmc), got 'ufm'",
    ),
    (
        "xid_storm",
        {"node": "n0001", "code": 79},
        "target.code: a xid_storm is an application's Xid, one of 13, 31, 43, 45; got 79",
    ),
    ("job_crash_xids", {}, "target.job: a job_crash_xids fault needs the id of the job that crashes"),
    ("job_crash_xids", {"job": "9999"}, "target.job: no job '9999' in jobs (known: 1)"),
    (
        "check_tool_missing",
        {"node": "n0001", "tool": "nvidia-smi"},
        "target.tool: expected a check tool (dcgmi, gpu_probe, ib_write_bw), got 'nvidia-smi'",
    ),
    ("fabric_manager_down", {}, "target.node: a fabric_manager_down fault needs a node"),
    ("profiling_dropout", {"node": "n0001", "gpu": 8}, "target.gpu: 8 out of range 0..7"),
]


@pytest.mark.parametrize(("kind", "target", "message"), BAD_TARGETS)
def test_a_bad_target_is_one_clear_line(kind: str, target: dict, message: str) -> None:
    raw = {
        "cluster": {"nodes": 2},
        "jobs": [{"id": "1", "nodes": 1}],
        "faults": [{"kind": kind, "target": target, "onset": "1m"}],
    }
    with pytest.raises(ScenarioError) as error:
        from_dict(raw)
    assert message in str(error.value)
    assert str(error.value).startswith("faults[0].")


def test_the_blind_spots_scenario_mixes_every_kind_with_hardware_faults_on_other_nodes() -> None:
    scenario = load(BLIND_SPOTS)
    nodes: dict[str, set[str]] = {}
    for fault in scenario.faults:
        touched = {fault.target["node"]} if "node" in fault.target else set()
        if fault.kind == "job_crash_xids":
            job = next(j for j in scenario.jobs if j.id == fault.target["job"])
            touched = set(job.nodes)
        for node in touched:
            nodes.setdefault(node, set()).add(fault.kind)
    assert all(len(kinds) == 1 for kinds in nodes.values()), nodes  # one fault per node
    kinds = {fault.kind for fault in scenario.faults}
    assert set(NOT_HARDWARE_KINDS) <= kinds
    assert len(kinds - set(NOT_HARDWARE_KINDS)) >= 2
    assert scenario.duration <= 20 * 60  # played in real time by `fleetsight evaluate health`


def test_the_health_evaluation_counts_a_drain_for_a_not_hardware_fault_as_wrong(run: Run) -> None:
    faults = load_faults(run.truth)
    crash, psu = run.fault("job_crash_xids"), run.fault("psu_failure")
    drained = Timeline([(crash.onset + 60, "draining", ["GPUXidUncorrectable"])])
    blind = Timeline([(crash.onset + 60, "unobserved", ["ExporterDown"])])
    assert summarize(crash, drained, "n0005")["verdict"] == "wrong drain"
    assert summarize(crash, blind, "n0005")["verdict"] == "right"
    degraded = Timeline([(crash.onset + 9, "degraded", [])])
    assert summarize(crash, degraded, "n0006")["verdict"] == "wrong degrade"
    assert summarize(psu, Timeline([(psu.onset + 60, "drained", ["PSUFailed"])]))["verdict"] == ""
    rows = fault_rows(faults, {"n0005": drained, "n0006": blind, "n0013": drained})
    assert [r["node"] for r in rows if r["kind"] == "job_crash_xids"] == ["n0005", "n0006"]
    assert wrong_drains(rows) == ["job_crash_xids n0005"]
