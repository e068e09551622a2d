"""Several nodes from one agent process, driven by a generic nodes file (``--nodes-file``), as the stack
runner uses it for the twin; the stack runner's side (the file built from the twin's layout); and every
``--help`` example that needs nothing running, run as written."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from exporter_helpers import NodeSpec, build_node, promtool_check_metrics, value

from exporters.component import node_entries, write_nodes_file
from support import free_port, wait_until

CLI = [sys.executable, "-m", "fleetsight.cli", "exporter"]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def state_directory(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "state"
    monkeypatch.setenv("STATE_DIRECTORY", str(folder))
    return folder


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> dict[str, dict[str, Path]]:
    root = tmp_path_factory.mktemp("nodes")
    return {
        name: build_node(root / name, NodeSpec(gpus=2, ib_devices=2, oscs=1, topology=False))
        for name in ("n0001", "n0002", "n0003")
    }


def entry(name: str, tree: dict[str, Path]) -> dict:
    return {
        "node": name,
        "sysfs_root": str(tree["sys"]),
        "procfs_root": str(tree["proc"]),
        "kmsg_file": str(tree["kern_log"]),
        "kernel_log_format": "syslog",
    }


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, cwd=REPO)


def test_one_process_serves_every_node_and_follows_the_file(trees, tmp_path):
    nodes_file = tmp_path / "nodes.json"
    down = tmp_path / "n0001.agent.down"  # a simulator's crashed host: the agent of n0001 gone
    # a simulator's cluster and rack, labelled on the node's target as a site's discovery labels every job
    labels = {"cluster": "sim", "rack": "r01", "__metrics_path__": "/not/this"}
    first = {**entry("n0001", trees["n0001"]), "unreachable_file": str(down), "target_labels": labels}
    write_nodes_file(nodes_file, [first, entry("n0002", trees["n0002"])])
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [*CLI, "node", "--nodes-file", str(nodes_file), "--listen", f"127.0.0.1:{port}", "--no-nvml"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def targets() -> dict[str, str] | None:
        try:
            body = httpx.get(f"{base}/targets.json", timeout=5).json()
        except (httpx.HTTPError, ValueError):
            return None
        return {t["labels"]["node"]: t["labels"]["__metrics_path__"] for t in body}

    try:
        found = wait_until(targets, timeout=30, what="the agent's /targets.json")
        assert found == {"n0001": "/nodes/n0001/metrics", "n0002": "/nodes/n0002/metrics"}
        listed = httpx.get(f"{base}/targets.json").json()
        assert listed[0]["targets"] == [f"127.0.0.1:{port}"]
        assert [t["labels"] for t in listed] == [
            {"cluster": "sim", "rack": "r01", "node": "n0001", "__metrics_path__": "/nodes/n0001/metrics"},
            {"node": "n0002", "__metrics_path__": "/nodes/n0002/metrics"},
        ]
        text = httpx.get(f"{base}/nodes/n0002/metrics").text
        assert value(text, "fleetsight_infiniband_port_up", node="n0002", device="mlx5_0") == 1
        assert value(text, "fleetsight_infiniband_port_up", node="n0001", device="mlx5_0") is None
        promtool_check_metrics(text)
        assert httpx.get(f"{base}/nodes/n0009/metrics").status_code == 404
        assert httpx.get(f"{base}/nodes/n0001/metrics").status_code == 200
        down.write_text("host down\n")
        assert httpx.get(f"{base}/nodes/n0001/metrics").status_code == 503  # Prometheus: up 0
        assert httpx.get(f"{base}/nodes/n0002/metrics").status_code == 200
        down.unlink()
        assert httpx.get(f"{base}/nodes/n0001/metrics").status_code == 200
        # The file changes: n0002 goes, n0003 comes.
        write_nodes_file(nodes_file, [entry("n0001", trees["n0001"]), entry("n0003", trees["n0003"])])
        wait_until(lambda: targets() == {"n0001": "/nodes/n0001/metrics", "n0003": "/nodes/n0003/metrics"},
                   timeout=20, what="the targets to follow the nodes file")  # fmt: skip
        # A broken file keeps the nodes as they were.
        nodes_file.write_text('[{"node": "n0001", "sysfs_rot": "/typo"}]')
        assert targets() == {"n0001": "/nodes/n0001/metrics", "n0003": "/nodes/n0003/metrics"}
        assert httpx.get(f"{base}/nodes/n0003/metrics").status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=15)
    output = process.stdout.read() if process.stdout else ""
    assert process.returncode == 0, output
    assert "event=nodes_file_invalid" in output and "sysfs_rot" in output


def test_a_bad_nodes_file_at_start_is_a_clear_error(trees, tmp_path):
    cases = {
        "not json": ("[{", "nodes.json"),
        "not a list": ('{"node": "n0001"}', "expected a JSON list of objects"),
        "a typo": ('[{"node": "n0001", "sysfs_rot": "/x"}]', "unknown or per-process option(s) sysfs_rot"),
        "a process option": (
            '[{"node": "n0001", "listen": ":1"}]',
            "unknown or per-process option(s) listen",
        ),
        "twice": ('[{"node": "n0001"}, {"node": "n0001"}]', "listed twice"),
        "a bad name": ('[{"node": "a b"}]', "not a valid host name"),
        "a bad collector": (
            '[{"node": "n0001", "collectors": ["gpu-magic"]}]',
            "unknown collector(s) gpu-magic",
        ),
    }
    for case, (content, message) in cases.items():
        nodes_file = tmp_path / "nodes.json"
        nodes_file.write_text(content)
        result = run("node", "--once", "--nodes-file", str(nodes_file))
        assert result.returncode != 0, case
        assert message in result.stderr, (case, result.stderr)
        assert "Traceback" not in result.stderr, case


def test_option_names_as_flags_or_parameters_and_the_command_line_fills_the_rest(trees, tmp_path):
    nodes_file = tmp_path / "nodes.json"
    tree = trees["n0001"]
    nodes_file.write_text(
        json.dumps([{"node": "n0001", "sysfs-root": str(tree["sys"]), "collector": ["infiniband"]}])
    )
    result = run("node", "--once", "--no-state", "--nodes-file", str(nodes_file), "--no-nvml")
    assert result.returncode == 0, result.stderr
    assert value(result.stdout, "fleetsight_collector_success", node="n0001", collector="infiniband") == 1
    assert value(result.stdout, "fleetsight_collector_success", node="n0001", collector="pcie") is None


def test_the_stack_runner_builds_the_nodes_file_from_the_twins_meta_json(tmp_path):
    """The runner reads the sources each node lists in the twin's meta.json (the twin writes them with
    its layout's own functions) and loads no twin code; a node listed without sources is skipped."""
    from twin import layout

    out = tmp_path / "twin"
    gpus = [{"gpu": 0, "pci_bdf": "0000:18:00.0", "uuid": "GPU-a", "model": "H100"}]
    layout.meta_file(out).parent.mkdir(parents=True)
    nodes = [
        {"name": "n0001", "gpus": gpus, "sources": layout.node_sources("n0001")},
        {"name": "n0002", "sources": layout.node_sources("n0002")},
        {"name": "n0003"},
    ]
    layout.meta_file(out).write_text(json.dumps({"cluster": "demo", "nodes": nodes}))
    entries = node_entries(out, "http://127.0.0.1:19100", tmp_path / "gpus")
    assert [e["node"] for e in entries] == ["n0001", "n0002"]
    # the labels the twin's dcgm targets carry: rules join the two jobs on (cluster, node)
    assert [e["target_labels"] for e in entries] == [{"cluster": "demo"}, {"cluster": "demo"}]
    first = entries[0]
    assert first["sysfs_root"] == str(layout.sysfs_root(out, "n0001"))
    assert first["kmsg_file"] == str(layout.kernel_log(out, "n0001"))
    assert first["pcie_bandwidth_file"] == str(layout.pcie_bandwidth_file(out, "n0001"))
    assert first["redfish_url"] == layout.bmc_url("http://127.0.0.1:19100", "n0001")
    assert json.loads(Path(first["gpu_map"]).read_text()) == [
        {"gpu": 0, "pci_bdf": "0000:18:00.0", "uuid": "GPU-a"}
    ]
    assert "gpu_map" not in entries[1]
    # Before the twin wrote meta.json: no nodes yet.
    assert node_entries(tmp_path / "bare", "http://t", tmp_path / "g") == []


def help_examples(*command: str) -> list[list[str]]:
    """The example command lines of a --help text (continuation lines joined, trailing notes dropped)."""
    text = run(*command, "--help").stdout
    block = text.split("Examples", 1)[1].split("Options:", 1)[0]
    joined = re.sub(r"\\\n\s*", " ", block)
    lines = [line.strip() for line in joined.splitlines() if line.strip().startswith("fleetsight ")]
    return [shlex.split(re.split(r"\s{3,}", line)[0]) for line in lines]


def test_every_help_example_that_needs_nothing_running_runs_as_written():
    examples = help_examples() + help_examples("node") + help_examples("fabric")
    runnable = [e for e in examples if "--once" in e and "127.0.0.1:19100" not in " ".join(e)]
    runnable = [e for e in runnable if "run/data/twin" not in " ".join(e)]  # needs `fleetsight up`
    assert len(runnable) >= 3, examples
    for example in runnable:
        result = subprocess.run(
            [sys.executable, "-m", "fleetsight.cli", *example[1:]],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        assert result.returncode == 0, (example, result.stderr)
        assert "fleetsight_collector_success" in result.stdout, example
        promtool_check_metrics(result.stdout)


def test_collectors_register_themselves_and_the_agent_builds_what_is_enabled(tmp_path):
    """The node agent's collectors come from the registry their modules fill (node_exporter's
    registerCollector model): order, one name each, and only the enabled and configured ones built."""
    import pytest

    from exporters import core
    from exporters.node import COLLECTORS, NodeOptions, build_sources

    assert COLLECTORS == ("pcie", "infiniband", "xid", "bmc", "lustre", "probes")
    with pytest.raises(ValueError, match="registered twice"):
        core.register_collector("pcie", position=99)(lambda opts, gpu_map: None)
    opts = NodeOptions(node="n1", sysfs_root=str(tmp_path), procfs_root=str(tmp_path), nvml=False)
    # no BMC configured and no probe file: those two build nothing
    assert [s.name for s in build_sources(opts)] == ["pcie", "infiniband", "xid", "lustre"]
    opts.collectors = ("xid",)
    assert [s.name for s in build_sources(opts)] == ["xid"]
