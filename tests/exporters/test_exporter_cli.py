"""`fleetsight exporter ...` as a user runs it: --help, --once, --config, a served endpoint, bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from exporter_helpers import FIXTURES, NodeSpec, build_node, value

from support import free_port, wait_until

CLI = [sys.executable, "-m", "fleetsight.cli", "exporter"]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def state_directory(tmp_path, monkeypatch) -> Path:
    """The agents these tests start keep their Xid state in a temporary folder (as under systemd with
    StateDirectory=), never in this machine's /var/lib or home."""
    folder = tmp_path / "state"
    monkeypatch.setenv("STATE_DIRECTORY", str(folder))
    return folder


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.fixture(scope="module")
def node_tree(tmp_path_factory) -> dict[str, Path]:
    lines = (FIXTURES / "kernlog" / "xid_generations.log").read_text().splitlines()
    return build_node(
        tmp_path_factory.mktemp("cli") / "n0007", NodeSpec(oscs=2, downgraded_gpu=5, kern_lines=lines)
    )


def test_every_command_has_help_with_an_example():
    for command in ([], ["node"], ["fabric"]):
        result = run(*command, "--help")
        assert result.returncode == 0, result.stderr
        assert "Example" in result.stdout


def test_once_prints_one_scrape(node_tree):
    result = run(
        "node",
        "--once",
        "--node",
        "n0007",
        "--no-nvml",
        "--sysfs-root",
        str(node_tree["sys"]),
        "--procfs-root",
        str(node_tree["proc"]),
        "--kmsg-file",
        str(node_tree["kern_log"]),
    )
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert value(text, "fleetsight_pcie_link_downgraded", node="n0007", gpu="5") == 1
    assert value(text, "fleetsight_gpu_xid_errors_total", xid="79", pci_bdf="0000:18:00.0") == 2
    assert value(text, "fleetsight_infiniband_port_up", device="mlx5_0", port="1") == 1
    assert value(text, "fleetsight_lustre_client_read_bytes_total", fs="scratch") == 1258291200
    for collector in ("pcie", "infiniband", "xid", "lustre"):
        assert value(text, "fleetsight_collector_success", collector=collector) == 1, collector


def test_naming_infiniband_makes_a_host_without_it_a_failure(tmp_path):
    """Left to its default, the IB collector is quiet on a host without /sys/class/infiniband (RoCE or
    Ethernet clusters); `--collector infiniband` says IB is expected, so its absence is a failure."""
    common = ["node", "--once", "--no-state", "--node", "n0007", "--no-nvml", "--sysfs-root", str(tmp_path)]
    quiet, named = run(*common), run(*common, "--collector", "infiniband")
    assert quiet.returncode == 0 and named.returncode == 0, quiet.stderr + named.stderr
    assert value(quiet.stdout, "fleetsight_collector_success", collector="infiniband") == 1
    assert value(named.stdout, "fleetsight_collector_success", collector="infiniband") == 0


def test_config_file_sets_defaults_and_flags_win(node_tree, tmp_path):
    config = tmp_path / "agent.yaml"
    config.write_text(
        f"node: from-config\nsysfs_root: {node_tree['sys']}\nprocfs_root: {node_tree['proc']}\n"
        f"kmsg_file: {node_tree['kern_log']}\nnvml: false\ncollector: [pcie, infiniband]\n"
    )
    result = run("node", "--config", str(config), "--once", "--node", "from-flag")
    assert result.returncode == 0, result.stderr
    assert value(result.stdout, "fleetsight_collector_success", collector="pcie", node="from-flag") == 1
    assert value(result.stdout, "fleetsight_collector_success", collector="xid") is None


def test_bad_input_gets_a_clear_error_not_a_traceback(tmp_path):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("- just\n- a list\n")
    cases = [
        (["node", "--config", str(bad_yaml), "--once"], "must hold a mapping"),
        (["node", "--once", "--node", "bad name!"], "not a valid host name"),
        (["node", "--once", "--redfish-url", "http://x", "--ipmitool", "ipmitool"], "not both"),
        (["fabric", "--once"], "Missing option '--ufm-url'"),
        (["node", "--collector", "gpu-magic"], "Invalid value"),
    ]
    for args, message in cases:
        result = run(*args)
        assert result.returncode != 0, args
        assert message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr


def test_served_agent_answers_scrapes_and_stops_cleanly_on_sigterm(node_tree):
    port = free_port()
    process = subprocess.Popen(
        [
            *CLI,
            "node",
            "--node",
            "n0007",
            "--no-nvml",
            "--listen",
            f"127.0.0.1:{port}",
            "--sysfs-root",
            str(node_tree["sys"]),
            "--procfs-root",
            str(node_tree["proc"]),
            "--kmsg-file",
            str(node_tree["kern_log"]),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def metrics():
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
            except httpx.HTTPError:
                return None
            return response.text if response.status_code == 200 else None

        text = wait_until(metrics, timeout=30, what="the node agent's /metrics")
        assert value(text, "fleetsight_infiniband_port_up", device="mlx5_0", port="1", node="n0007") == 1
        assert httpx.get(f"http://127.0.0.1:{port}/nope").status_code == 404
        # Appended kernel lines show up in the next scrape.
        with open(node_tree["kern_log"], "a") as log:
            log.write(
                "2026-11-21T12:00:00+00:00 n0007 kernel: NVRM: Xid (PCI:0000:ba:00): 48, pid=1, name=x, DBE\n"
            )
        text = wait_until(
            lambda: (
                (t := metrics())
                and value(t, "fleetsight_gpu_xid_errors_total", xid="48", pci_bdf="0000:ba:00.0") == 1
                and t
            ),
            timeout=20,
            what="the appended Xid to be counted",
        )
        assert text
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=15)
    assert process.returncode == 0
    output = process.stdout.read() if process.stdout else ""
    assert "event=listening" in output


def test_the_agent_reads_this_machine_without_crashing():
    """A real host's /sys and /proc (whatever this machine has): the agent must answer, never crash."""
    result = run(
        "node",
        "--once",
        "--no-nvml",
        "--collector",
        "pcie",
        "--collector",
        "infiniband",
        "--kmsg-file",
        os.devnull,
    )
    assert result.returncode == 0, result.stderr
    assert "fleetsight_collector_success" in result.stdout
