"""For each single-fault scenario: its truth line, and its signature in the outputs, read the way real
consumers read them (sysfs strings, kernel log lines, prometheus_client's parser for /metrics, Redfish
and UFM JSON, slurmrestd's job list, Megatron-style rank logs).

Each scenario runs at max speed and stops mid-fault (--duration 12m; the fault lasts 8m..16m), then
the twin serves that moment's state."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from twin_helpers import FORMAT_SCENARIOS, SCENARIOS, step_times

from twin import render
from twin.scenario import load
from twin.sim import Simulation

START = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC).timestamp()
MID_FAULT = ("--duration", "12m")


def only_truth(run, kind: str, target: dict) -> dict:
    lines = run.truth()
    assert len(lines) == 1, lines
    line = lines[0]
    assert line["kind"] == kind
    assert line["target"] == target
    assert line["onset_unix"] == START + 480
    assert line["end_unix"] == START + 960
    assert line["effects"], "a truth line lists the effects it causes"
    return line


def mean_step(log: str, before: bool) -> float:
    onset = "2026-11-21 10:08:00"
    times = [ms for stamp, ms in step_times(log) if (stamp < onset) == before and stamp > "2026-11-21 10:02"]
    assert times, "no progress lines in that window"
    return sum(times) / len(times)


def test_psu_failure_power_brake(twin_factory) -> None:
    run = twin_factory("psu_failure", *MID_FAULT)
    only_truth(run, "psu_failure", {"node": "n0002", "psu": 3})
    psu = run.get("/bmc/n0002/redfish/v1/Chassis/1/PowerSubsystem/PowerSupplies/PSU3").json()
    assert psu["Status"]["Health"] == "Critical" and psu["LineInputStatus"] == "LossOfInput"
    assert run.get("/bmc/n0002/redfish/v1/Chassis/1").json()["Status"]["Health"] == "Critical"
    assert run.get("/bmc/n0001/redfish/v1/Chassis/1").json()["Status"]["Health"] == "OK"
    slow, peer = run.dcgm("n0002"), run.dcgm("n0001")
    for gpu, reasons in slow["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"].items():
        assert int(reasons) // 128 % 2 == 1, f"gpu {gpu}: HW Power Brake bit missing"
        assert slow["DCGM_FI_DEV_POWER_USAGE"][gpu] <= 150.0
    assert all(int(r) // 128 % 2 == 0 for r in peer["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"].values())
    # The slow node stays busy while its peers wait.
    slow_tensor = sum(slow["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].values()) / 8
    peer_tensor = sum(peer["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].values()) / 8
    assert peer_tensor < 0.6 * slow_tensor
    assert sum(peer["DCGM_FI_DEV_POWER_USAGE"].values()) / 8 < 400
    log = run.rank_logs("n0001", "2001")[0]
    assert 2.4 < mean_step(log, before=False) / mean_step(log, before=True) < 3.4


def test_thermal_throttle_one_gpu(twin_factory) -> None:
    run = twin_factory("thermal_throttle", *MID_FAULT)
    only_truth(run, "thermal_throttle", {"node": "n0003", "gpu": 5})
    metrics = run.dcgm("n0003")
    assert metrics["DCGM_FI_DEV_GPU_TEMP"]["5"] > 85
    assert int(metrics["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"]["5"]) // 64 % 2 == 1  # HW thermal slowdown
    assert metrics["DCGM_FI_DEV_SM_CLOCK"]["5"] < 0.7 * metrics["DCGM_FI_DEV_SM_CLOCK"]["4"]
    others = [g for g in metrics["DCGM_FI_DEV_GPU_TEMP"] if g != "5"]
    assert all(metrics["DCGM_FI_DEV_GPU_TEMP"][g] < 75 for g in others)
    assert all(int(metrics["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"][g]) == 0 for g in others)
    log = run.rank_logs("n0001", "2001")[0]
    assert mean_step(log, before=False) > 1.3 * mean_step(log, before=True)


def test_pcie_downgrade(twin_factory) -> None:
    run = twin_factory("pcie_downgrade", *MID_FAULT)
    only_truth(run, "pcie_downgrade", {"node": "n0002", "gpu": 1, "gen": 1})
    bdf = "0000:2a:00.0"
    assert run.sysfs("n0002", f"bus/pci/devices/{bdf}/current_link_speed") == "2.5 GT/s PCIe\n"
    assert run.sysfs("n0002", f"bus/pci/devices/{bdf}/max_link_speed") == "32.0 GT/s PCIe\n"
    assert run.sysfs("n0002", f"bus/pci/devices/{bdf}/current_link_width") == "16\n"
    assert run.sysfs("n0002", f"bus/pci/devices/{bdf}/vendor") == "0x10de\n"
    assert run.sysfs("n0001", f"bus/pci/devices/{bdf}/current_link_speed") == "32.0 GT/s PCIe\n"
    probe = json.loads((run.node("n0002") / "fleetsight/pcie_bandwidth.json").read_text())
    by_gpu = {g["gpu"]: g for g in probe["gpus"]}
    assert by_gpu[1]["pci_bdf"] == bdf
    assert 2e9 < by_gpu[1]["host_to_device_bytes_per_second"] < 5e9
    assert all(g["host_to_device_bytes_per_second"] > 40e9 for i, g in by_gpu.items() if i != 1)


def test_ib_link_flap(twin_factory) -> None:
    run = twin_factory("ib_link_flap", *MID_FAULT)
    only_truth(run, "ib_link_flap", {"node": "n0004", "port": "mlx5_2"})
    counters = "class/infiniband/mlx5_2/ports/1/counters"
    assert int(run.sysfs("n0004", f"{counters}/link_downed")) >= 1
    assert int(run.sysfs("n0004", f"{counters}/symbol_error")) > 0
    assert int(run.sysfs("n0004", "class/infiniband/mlx5_3/ports/1/counters/link_downed")) == 0
    assert int(run.sysfs("n0001", f"{counters}/link_downed")) == 0
    kern = run.kern("n0004")
    assert re.search(r"kernel: \[\s*\d+\.\d{6}\] mlx5_core 0000:3c:00\.0: .*Link down", kern)
    assert "ibp60s0: Link up" in kern
    events = run.get("/ufm/ufmRest/app/events?severity=Critical").json()
    assert any(e["name"] == "Link went down" and "n0004" in e["object_path"] for e in events)


def test_ib_port_down(twin_factory) -> None:
    run = twin_factory("ib_port_down", *MID_FAULT)
    only_truth(run, "ib_port_down", {"node": "n0001", "port": "mlx5_6"})
    port = "class/infiniband/mlx5_6/ports/1"
    assert run.sysfs("n0001", f"{port}/state") == "1: DOWN\n"
    assert run.sysfs("n0001", f"{port}/phys_state") == "3: Disabled\n"
    assert run.sysfs("n0001", "class/infiniband/mlx5_5/ports/1/state") == "4: ACTIVE\n"
    ports = run.get("/ufm/ufmRest/resources/ports?system=n0001").json()
    down = [p for p in ports if p["node_description"] == "n0001 mlx5_6"]
    assert down and down[0]["logical_state"] == "Down" and down[0]["physical_state"] != "Link Up"
    logs = run.rank_logs("n0001", "2001")
    assert any("NCCL WARN NET/IB" in text for text in logs.values())
    job = run.get("/slurm/v0.0.40/jobs").json()["jobs"][0]
    assert job["restart_cnt"] >= 1


def test_xid_79_gpu_falls_off_the_bus(twin_factory) -> None:
    run = twin_factory("xid", *MID_FAULT)
    truth = only_truth(run, "xid", {"node": "n0003", "gpu": 2, "code": 79})
    assert truth["jobs"] == ["2001"]
    kern = run.kern("n0003")
    assert re.search(
        r"NVRM: Xid \(PCI:0000:3a:00\): 79, pid=\S+, (name=\S+, )?GPU has fallen off the bus\.", kern
    )
    metrics = run.dcgm("n0003")
    assert "2" not in metrics["DCGM_FI_DEV_POWER_USAGE"] and len(metrics["DCGM_FI_DEV_POWER_USAGE"]) == 7
    assert run.sysfs("n0003", "bus/pci/devices/0000:3a:00.0/current_link_speed") == "Unknown\n"
    logs = run.rank_logs("n0003", "2001")
    assert "CUDA error" in logs[2 * 8 + 2] or any("CUDA error" in t for t in logs.values())
    job = run.get("/slurm/v0.0.40/jobs").json()["jobs"][0]
    assert job["restart_cnt"] == 1 and job["job_state"] == ["RUNNING"]
    assert "0003" not in job["nodes"], "the requeued job must avoid the node whose GPU is gone"


def test_hbm_row_remap_pending(twin_factory) -> None:
    run = twin_factory("hbm_row_remap", *MID_FAULT)
    only_truth(run, "hbm_row_remap", {"node": "n0002", "gpu": 7})
    metrics = run.dcgm("n0002")
    assert metrics["DCGM_FI_DEV_ROW_REMAP_PENDING"]["7"] == 1
    assert metrics["DCGM_FI_DEV_XID_ERRORS"]["7"] == 63
    assert metrics["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS_total"]["7"] >= 2
    assert all(v == 0 for g, v in metrics["DCGM_FI_DEV_ROW_REMAP_PENDING"].items() if g != "7")
    assert re.search(r"NVRM: Xid \(PCI:0000:db:00\): 63, .*Row Remapper", run.kern("n0002"))


def test_host_crash(twin_factory) -> None:
    run = twin_factory("host_crash", *MID_FAULT)
    only_truth(run, "host_crash", {"node": "n0004"})
    assert run.get("/dcgm/n0004/metrics").status_code == 503
    assert run.get("/dcgm/n0001/metrics").status_code == 200
    assert run.get("/bmc/n0004/redfish/v1/Chassis/1").json()["PowerState"] == "Off"
    # slurmctld's view 4 minutes in: pings unanswered, not yet DOWN (SlurmdTimeout is 300 s)
    nodes = {n["name"]: n for n in run.get("/slurm/v0.0.40/nodes").json()["nodes"]}
    assert nodes["n0004"]["state"] == ["IDLE", "NOT_RESPONDING"] and nodes["n0004"]["reason"] == ""
    assert all("NOT_RESPONDING" not in nodes[n]["state"] for n in ("n0001", "n0002", "n0003", "n0005"))
    ports = run.get("/ufm/ufmRest/resources/ports?system=n0004").json()
    assert ports and all(p["logical_state"] == "Down" for p in ports)
    peer_logs = run.rank_logs("n0001", "2001")
    assert any("Watchdog caught collective operation timeout" in t for t in peer_logs.values())


def test_host_crash_reboot_resets_counters(twin_factory) -> None:
    run = twin_factory("host_crash", serve=False)  # the whole 20 minutes: the host is back at 16m
    kern = run.kern("n0004")
    assert re.search(r"n0004 kernel: \[\s+[0-3]\.\d{6}\] Linux version", kern), (
        "uptime restarts after the reboot"
    )
    data = "class/infiniband/mlx5_0/ports/1/counters/port_rcv_data"
    assert int(run.sysfs("n0004", data)) < 0.01 * int(run.sysfs("n0001", data))


def test_nvswitch_fatal(twin_factory) -> None:
    run = twin_factory("nvswitch_fatal", *MID_FAULT)
    only_truth(run, "nvswitch_fatal", {"node": "n0001", "nvswitch": 2})
    assert re.search(
        r"nvidia-nvswitch2: SXid \(PCI:0000:07:00\.0\): 24007, Fatal, Link \d+", run.kern("n0001")
    )
    logs = run.rank_logs("n0001", "2001")
    assert any("NCCL WARN Cuda failure" in t for t in logs.values())
    job = run.get("/slurm/v0.0.40/jobs").json()["jobs"][0]
    assert job["restart_cnt"] == 1 and "0001" not in job["nodes"]


def osc_mean_wait(run, node: str, ost: int) -> float:
    folder = next((run.node(node) / "proc/fs/lustre/osc").glob(f"lustre-OST{ost:04x}-osc-*"))
    for line in (folder / "stats").read_text().splitlines():
        fields = line.split()
        if fields[0] == "req_waittime":
            assert fields[2:4] == ["samples", "[usecs]"]
            return int(fields[6]) / int(fields[1])
    raise AssertionError("no req_waittime line")


def test_lustre_ost_slow(twin_factory) -> None:
    run = twin_factory("lustre_ost_slow", *MID_FAULT)
    only_truth(run, "lustre_ost_slow", {"ost": 3})
    assert osc_mean_wait(run, "n0001", 3) > 3 * osc_mean_wait(run, "n0001", 0)
    kern = run.kern("n0002")
    assert re.search(
        r"ptlrpc_expire_one_request\(\)\) @@@ Request sent has timed out for slow reply.*lustre-OST0003", kern
    )
    assert "LustreError: 11-0: lustre-OST0003-osc-" in kern


def test_gray_slow_node_has_no_hardware_signal(twin_factory) -> None:
    run = twin_factory("gray_slow_node", *MID_FAULT)
    only_truth(run, "gray_slow_node", {"node": "n0002"})
    slow, peer = run.dcgm("n0002"), run.dcgm("n0001")
    assert all(int(r) == 0 for r in slow["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"].values())
    assert all(v == 0 for v in slow["DCGM_FI_DEV_XID_ERRORS"].values())
    assert run.kern("n0002") == ""
    assert sum(slow["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].values()) > 1.1 * sum(
        peer["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].values()
    )
    log = run.rank_logs("n0001", "2001")[0]
    assert 1.15 < mean_step(log, before=False) / mean_step(log, before=True) < 1.45


def test_loss_spike(twin_factory) -> None:
    run = twin_factory("loss_spike", *MID_FAULT)
    only_truth(run, "loss_spike", {"job": "2001"})
    log = run.rank_logs("n0003", "2001")[16]
    losses = [
        (m.group(1), float(m.group(2)))
        for m in re.finditer(r"^\[([^\]]+)\] .*lm loss: ([\d.E+-]+)", log, re.M)
    ]
    before = [v for s, v in losses if "10:05" <= s[11:16] < "10:08"]
    during = [v for s, v in losses if s[11:16] >= "10:08"]
    assert before and during
    assert min(during) > 3 * max(before)


@pytest.mark.parametrize("name", ["demo", "mixed_day", "fault_free_day"])
def test_shipped_scenarios_are_valid(name: str) -> None:
    scenario = load(SCENARIOS / f"{name}.yaml")
    assert scenario.jobs
    if name == "fault_free_day":
        assert not scenario.faults
    else:
        # "A fault every few minutes" (demo) / every ~20 min (mixed day), every kind represented.
        gaps = scenario.duration / len(scenario.faults)
        assert gaps < (300 if name == "demo" else 1800)
        assert len({f.kind for f in scenario.faults}) == 12


def test_slurm_nodes_follow_a_crash_as_slurmctld_would() -> None:
    """NOT_RESPONDING while pings go unanswered, DOWN once SlurmdTimeout (300 s) has passed, back after
    the reboot; the nodes of a running job are ALLOCATED."""
    sim = Simulation(load(FORMAT_SCENARIOS / "host_crash.yaml"), dt.datetime.fromtimestamp(START, dt.UTC))

    def state_at(minutes: float, node: str = "n0004") -> list[str]:
        while sim.t < minutes * 60:
            sim.advance()
            sim.kernel_lines.clear()
            sim.app_lines.clear()
        nodes = {n["name"]: n for n in render.slurm_nodes(sim)["nodes"]}
        return nodes[node]["state"]

    assert state_at(7) == ["ALLOCATED"]
    assert state_at(10)[-1] == "NOT_RESPONDING" and "DOWN" not in state_at(10)
    assert state_at(14) == ["DOWN", "NOT_RESPONDING"]
    assert state_at(17) in (["IDLE"], ["ALLOCATED"])
    assert state_at(17, "n0001") == ["ALLOCATED"]


def test_slurmrestd_meta_names_the_release_its_shapes_come_from() -> None:
    """The twin answers in data_parser/v0.0.40's shapes, which first shipped with Slurm 23.11: its meta
    says 23.11, with the plugin names and string version numbers slurmrestd 23.11 answers with."""
    sim = Simulation(load(FORMAT_SCENARIOS / "host_crash.yaml"), dt.datetime.fromtimestamp(START, dt.UTC))
    for body in (render.slurm_jobs(sim), render.slurm_nodes(sim)):
        meta = body["meta"]
        assert meta["plugin"] == {
            "type": "openapi/slurmctld",
            "name": "Slurm OpenAPI slurmctld",
            "data_parser": "data_parser/v0.0.40",
            "accounting_storage": "accounting_storage/slurmdbd",
        }
        version = meta["slurm"]["version"]
        assert (version["major"], version["minor"]) == ("23", "11") and version["micro"].isdigit()
        assert meta["slurm"]["release"] == "{major}.{minor}.{micro}".format(**version)
        assert body["errors"] == [] and body["warnings"] == []
