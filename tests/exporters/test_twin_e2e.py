"""End to end: the exporters, run as a user runs them (`--once`), against the digital twin's outputs,
one fault kind per node (tests/exporters/fixtures/twin/exporter_faults.yaml), read at minute 12 when
every fault is active."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from exporter_helpers import FIXTURES, promtool_check_metrics, samples, value

from exporters.component import node_entries, write_nodes_file
from support import free_port, wait_until
from twin.truth import load_faults

REPO = Path(__file__).resolve().parents[2]
SCENARIO = FIXTURES / "twin" / "exporter_faults.yaml"
CLI = [sys.executable, "-m", "fleetsight.cli"]


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    """The twin, run to minute 12 at full speed, then serving its last state (Redfish, UFM) over HTTP."""
    out = tmp_path_factory.mktemp("twin") / "out"
    log = out.parent / "twin.log"
    port = free_port()
    with open(log, "w") as handle:
        process = subprocess.Popen(
            [
                *CLI,
                "twin",
                "run",
                "--scenario",
                str(SCENARIO),
                "--out",
                str(out),
                "--truth",
                str(out.parent / "truth.jsonl"),  # the ground truth lies outside what exporters read
                "--serve",
                "--listen",
                f"127.0.0.1:{port}",
            ],
            cwd=REPO,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(
            lambda: "scenario_over" in log.read_text() or process.poll() is not None,
            timeout=180,
            what="the twin to finish its scenario",
        )
        assert process.poll() is None, f"the twin exited early:\n{log.read_text()[-3000:]}"
        faults = [f for f in load_faults(out.parent / "truth.jsonl") if not f.benign]  # benign: not faults
        yield {"out": out, "url": f"http://127.0.0.1:{port}", "truth": {f.kind: f for f in faults}}
    finally:
        process.terminate()
        process.wait(timeout=20)


@pytest.fixture(scope="module")
def nodes(twin) -> str:
    """All twin nodes in one scrape: the nodes file the stack runner writes from the twin's layout,
    served by one agent with --once."""
    state = str(twin["out"].parent / "state")  # not this machine's /var/lib
    nodes_file = twin["out"].parent / "nodes.json"
    write_nodes_file(nodes_file, node_entries(twin["out"], twin["url"], twin["out"].parent / "gpus"))
    result = subprocess.run(
        [*CLI, "exporter", "node", "--nodes-file", str(nodes_file), "--once"],
        cwd=REPO,
        env={**os.environ, "STATE_DIRECTORY": state},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def fabric(twin) -> str:
    result = subprocess.run(
        [
            *CLI,
            "exporter",
            "fabric",
            "--once",
            "--ufm-url",
            f"{twin['url']}/ufm",
            "--ufm-telemetry-url",
            f"{twin['url']}/ufm/csv/metrics",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_every_fault_of_the_scenario_is_active(twin):
    kinds = {
        "psu_failure",
        "pcie_downgrade",
        "ib_port_down",
        "ib_link_flap",
        "xid",
        "hbm_row_remap",
        "nvswitch_fatal",
        "lustre_ost_slow",
        "host_crash",
        "thermal_throttle",
        "gray_slow_node",
        "loss_spike",
    }
    assert set(twin["truth"]) == kinds


def test_every_collector_succeeds_on_every_node(nodes):
    success = {
        dict(ls)["node"] + "/" + dict(ls)["collector"]: v
        for (n, ls), v in samples(nodes).items()
        if n == "fleetsight_collector_success"
    }
    assert len(success) == 12 * 6
    assert [k for k, v in success.items() if v != 1] == []


def test_the_twins_files_lie_where_its_layout_says(twin):
    from twin import layout

    names = layout.node_names(twin["out"])
    assert len(names) == 12
    for node in names:
        for path in (
            layout.sysfs_root(twin["out"], node) / "class" / "infiniband",
            layout.procfs_root(twin["out"], node),
            layout.kernel_log(twin["out"], node),
            layout.pcie_bandwidth_file(twin["out"], node),
        ):
            assert path.exists(), path
    assert len(layout.node_gpus(twin["out"])[names[0]]) == 8


def test_promtool_finds_nothing_to_say_about_either_exporter(nodes, fabric):
    promtool_check_metrics(nodes)
    promtool_check_metrics(fabric)


def test_psu_failure(nodes, twin):
    psu = f"PSU{twin['truth']['psu_failure'].line['target']['psu']}"
    assert value(nodes, "fleetsight_bmc_psu_healthy", node="n0001", psu=psu) == 0
    healthy = [
        v
        for (n, ls), v in samples(nodes).items()
        if n == "fleetsight_bmc_psu_healthy" and dict(ls)["node"] == "n0001" and dict(ls)["psu"] != psu
    ]
    assert healthy and all(v == 1 for v in healthy)
    assert value(nodes, "fleetsight_bmc_power_consumed_watts", node="n0001") > 0
    # The redundancy group is its own metric: lost on the node with the failed supply only.
    redundant = {
        dict(ls)["node"]: v
        for (n, ls), v in samples(nodes).items()
        if n == "fleetsight_bmc_psu_redundancy_ok"
    }
    assert redundant["n0001"] == 0
    assert len(redundant) >= 10 and all(v == 1 for node, v in redundant.items() if node != "n0001")


def test_pcie_downgrade(nodes):
    gpu1 = {"node": "n0002", "gpu": "1", "kind": "gpu"}
    assert value(nodes, "fleetsight_pcie_link_downgraded", **gpu1) == 1
    assert value(nodes, "fleetsight_pcie_link_speed_transfers_per_second", **gpu1) == 2.5e9
    bandwidth = "fleetsight_pcie_host_to_device_bandwidth_bytes_per_second"
    assert value(nodes, bandwidth, node="n0002", gpu="1") < 5e9
    assert value(nodes, bandwidth, node="n0002", gpu="0") > 40e9
    downgraded = [
        dict(ls) for (n, ls), v in samples(nodes).items() if n == "fleetsight_pcie_link_downgraded" and v
    ]
    assert {(d["node"], d["pci_bdf"]) for d in downgraded} <= {
        ("n0002", "0000:2a:00.0"),
        ("n0005", "0000:3a:00.0"),
    }


def test_ib_port_down(nodes, fabric):
    assert value(nodes, "fleetsight_infiniband_port_up", node="n0003", device="mlx5_6") == 0
    assert value(nodes, "fleetsight_infiniband_port_up", node="n0003", device="mlx5_5") == 1
    assert value(fabric, "fleetsight_fabric_port_up", side="host", node="n0003", hca_port="mlx5_6/1") == 0
    leaf = value(fabric, "fleetsight_fabric_port_up", side="switch", node="n0003", hca_port="mlx5_6/1")
    assert leaf == 0


def test_ib_link_flap(nodes, fabric):
    port = {"node": "n0004", "device": "mlx5_2"}
    assert value(nodes, "fleetsight_infiniband_port_link_downed_total", **port) >= 1
    assert value(nodes, "fleetsight_infiniband_port_link_downed_total", node="n0004", device="mlx5_1") == 0
    assert value(nodes, "fleetsight_kernel_events_total", node="n0004", kind="ib_link_down") >= 1
    assert (
        value(
            fabric, "fleetsight_fabric_port_link_downed_total", side="host", node="n0004", hca_port="mlx5_2/1"
        )
        >= 1
    )


def test_xid_79_gpu_fallen_off_the_bus(nodes, twin):
    gpu = twin["truth"]["xid"].gpu
    meta = json.loads((twin["out"] / "meta.json").read_text())
    uuid = next(n for n in meta["nodes"] if n["name"] == "n0005")["gpus"][gpu]["uuid"]
    labels = {"node": "n0005", "xid": "79", "gpu": str(gpu), "uuid": uuid, "category": "fallen_off_bus"}
    assert value(nodes, "fleetsight_gpu_xid_errors_total", **labels) >= 1
    assert value(nodes, "fleetsight_pcie_link_up", node="n0005", gpu=str(gpu)) == 0


def test_hbm_row_remap(nodes):
    labels = {"node": "n0006", "xid": "63", "gpu": "7", "category": "memory_ecc"}
    assert value(nodes, "fleetsight_gpu_xid_errors_total", **labels) >= 1


def test_nvswitch_fatal(nodes):
    assert (
        value(nodes, "fleetsight_nvswitch_sxid_errors_total", node="n0007", sxid="24007", severity="fatal")
        >= 1
    )


def test_lustre_ost_slow(nodes, twin):
    slow = f"OST{twin['truth']['lustre_ost_slow'].line['target']['ost']:04x}"
    series = samples(nodes)
    ratios = []
    for node in ("n0009", "n0010", "n0011", "n0012"):  # job 3003 keeps doing I/O through the fault
        mean = {}
        for (name, ls), wait in series.items():
            labels = dict(ls)
            wanted = name == "fleetsight_lustre_client_rpc_wait_seconds_total" and labels["node"] == node
            if wanted and labels["component"] == "osc":
                requests = value(nodes, "fleetsight_lustre_client_rpc_requests_total", **labels)
                mean[labels["target"]] = wait / requests
        others = statistics.median(v for t, v in mean.items() if t != slow)
        ratios.append(mean[slow] / others)
    assert min(ratios) > 3, ratios
    assert value(nodes, "fleetsight_kernel_events_total", node="n0010", kind="lustre_rpc_timeout") >= 1


def test_host_crash(nodes, fabric):
    assert value(nodes, "fleetsight_bmc_chassis_power_on", node="n0008") == 0
    assert value(nodes, "fleetsight_bmc_chassis_power_on", node="n0007") == 1
    down = [
        v
        for (n, ls), v in samples(fabric).items()
        if n == "fleetsight_fabric_port_up" and dict(ls).get("node") == "n0008"
    ]
    assert down and all(v == 0 for v in down)


def test_faults_without_an_exporter_signal_stay_quiet(nodes):
    """thermal_throttle (n0009), gray_slow_node (n0010), loss_spike (job 3003) show in DCGM, the job
    logs and the anomaly service: the exporters must not invent hardware symptoms for them."""
    series = samples(nodes)
    for node in ("n0009", "n0010", "n0011", "n0012"):
        xids = [
            v
            for (n, ls), v in series.items()
            if n == "fleetsight_gpu_xid_errors_total" and dict(ls)["node"] == node
        ]
        assert xids == []
        for name in (
            "fleetsight_pcie_link_downgraded",
            "fleetsight_bmc_psu_healthy",
            "fleetsight_infiniband_port_up",
        ):
            values = [v for (n, ls), v in series.items() if n == name and dict(ls)["node"] == node]
            expected = 0 if name.endswith("downgraded") else 1
            assert values and all(v == expected for v in values), (node, name)


def test_fabric_sees_the_whole_twin(fabric, twin):
    meta = json.loads((twin["out"] / "meta.json").read_text())
    hca_ports = sum(len(n["hcas"]) for n in meta["nodes"])
    host_side = [
        ls
        for (n, ls), _ in samples(fabric).items()
        if n == "fleetsight_fabric_port_up" and dict(ls)["side"] == "host"
    ]
    assert len(host_side) == hca_ports
    for part in ("ports", "systems", "events", "telemetry"):
        assert value(fabric, "fleetsight_collector_success", collector=f"fabric_{part}") == 1
    assert (
        value(
            fabric,
            "fleetsight_fabric_port_transmit_bytes_total",
            node="n0001",
            hca_port="mlx5_0/1",
            side="host",
        )
        > 0
    )


@pytest.mark.stack
def test_fleetsight_up_has_prometheus_scrape_every_node_agent_and_the_fabric(stack_env):
    """`fleetsight up` with the exporters: the twin's demo in real time, the multi-node agent, the
    fabric exporter, and the real Prometheus scraping them through the agent's service discovery."""
    stack_env.cli("up", "exporter-node", "exporter-fabric", "prometheus", timeout=240)
    query = stack_env.url("prometheus", "/api/v1/query")

    def scraped() -> dict[str, float] | None:
        import httpx

        try:
            body = httpx.get(query, params={"query": "count by (job) (up == 1)"}, timeout=5).json()
        except (httpx.HTTPError, ValueError):
            return None
        jobs = {r["metric"]["job"]: float(r["value"][1]) for r in body["data"]["result"]}
        meta_file = stack_env.run_dir / "data" / "twin" / "meta.json"
        nodes = len(json.loads(meta_file.read_text())["nodes"]) if meta_file.exists() else -1
        return jobs if jobs.get("fleetsight-fabric") and jobs.get("fleetsight-node") == nodes else None

    wait_until(scraped, timeout=150, interval=2, what="Prometheus to scrape every node agent and the fabric")
    import httpx

    result = httpx.get(query, params={"query": "min(fleetsight_collector_success)"}, timeout=5).json()
    assert float(result["data"]["result"][0]["value"][1]) == 1
