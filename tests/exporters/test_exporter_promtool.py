"""``promtool check metrics`` (Prometheus's own linter) finds nothing to say about what the exporters
serve: the node agent with every collector and every kind of source, and the fabric exporter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from exporter_helpers import (
    FIXTURES,
    JsonServer,
    NodeSpec,
    build_node,
    load_routes,
    names,
    promtool_check_metrics,
    value,
)
from test_exporter_ipmi_vendors import fake_ipmitool

from exporters.fabric import FabricExporter
from exporters.node import NodeAgent, NodeOptions


def full_node(tmp_path: Path) -> dict[str, Path]:
    """A node with GPUs, HCAs, a kernel log of every driver generation's Xids, Lustre client and
    server stats (jobstats too) and a health-probe file."""
    lines = (FIXTURES / "kernlog" / "xid_generations.log").read_text().splitlines()
    paths = build_node(tmp_path / "n0001", NodeSpec(oscs=4, downgraded_gpu=2, kern_lines=lines))
    shutil.copytree(FIXTURES / "lustre" / "proc" / "fs", paths["proc"] / "fs", dirs_exist_ok=True)
    probe = tmp_path / "pcie_bandwidth.json"
    gpus = [
        {
            "gpu": g,
            "pci_bdf": f"0000:{b:02x}:00.0",
            "uuid": f"GPU-{g}",
            "host_to_device_bytes_per_second": 5e10,
        }
        for g, b in enumerate([0x18, 0x2A])
    ]
    probe.write_text(json.dumps({"measured_at": 1795255200.5, "gpus": gpus}))
    return {**paths, "probe": probe}


def scrape(paths: dict[str, Path], **options) -> str:
    agent = NodeAgent(
        NodeOptions(
            node="n0001",
            sysfs_root=str(paths["sys"]),
            procfs_root=str(paths["proc"]),
            kmsg_file=str(paths["kern_log"]),
            nvml=False,
            bmc_interval_s=0.0,
            lustre_jobstats=True,
            pcie_bandwidth_file=str(paths["probe"]),
            **options,
        )
    )
    try:
        return agent.scrape().decode()
    finally:
        agent.close()


def test_node_agent_with_every_collector_and_redfish(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETSIGHT_BMC_USERNAME", "fleet")
    monkeypatch.setenv("FLEETSIGHT_BMC_PASSWORD", "s3cret")
    server = JsonServer(load_routes("bmc_both_schemas.json"), credentials=("fleet", "s3cret"))
    try:
        text = scrape(full_node(tmp_path), redfish_url=server.url)
    finally:
        server.close()
    for collector in ("pcie", "infiniband", "xid", "bmc", "lustre", "pcie_bandwidth"):
        assert value(text, "fleetsight_collector_success", collector=collector) == 1, collector
    # Every family is there, so the lint covers them all.
    for name in (
        "fleetsight_infiniband_port_link_downed_total",
        "fleetsight_gpu_xid_errors_total",
        "fleetsight_nvswitch_sxid_errors_total",
        "fleetsight_bmc_psu_redundancy_ok",
        "fleetsight_lustre_job_read_bytes_total",
        "fleetsight_pcie_host_to_device_bandwidth_bytes_per_second",
    ):
        assert name in names(text), name
    promtool_check_metrics(text)


def test_node_agent_with_ipmi(tmp_path):
    text = scrape(
        full_node(tmp_path), ipmitool=str(fake_ipmitool(tmp_path, "hpe_proliant_dl360_sdr_elist.txt"))
    )
    assert value(text, "fleetsight_bmc_up", protocol="ipmi") == 1
    assert "fleetsight_bmc_sel_entries" in names(text)
    promtool_check_metrics(text)


def test_fabric_exporter(tmp_path):
    routes = {
        "/ufmRest/resources/ports": json.loads((FIXTURES / "ufm" / "ports.json").read_text()),
        "/ufmRest/resources/systems": json.loads((FIXTURES / "ufm" / "systems.json").read_text()),
        "/ufmRest/app/events": json.loads((FIXTURES / "ufm" / "events.json").read_text()),
        "/csv/metrics": (FIXTURES / "ufm" / "telemetry.csv").read_text(),
    }
    server = JsonServer(routes, prefix="/ufm")
    exporter = FabricExporter(ufm_url=f"{server.url}/ufm", telemetry_url=f"{server.url}/ufm/csv/metrics")
    try:
        exporter.refresh()
        text = exporter.snapshot.text.decode()
    finally:
        exporter.close()
        server.close()
    assert "fleetsight_fabric_port_symbol_errors_total" in names(text)
    promtool_check_metrics(text)
