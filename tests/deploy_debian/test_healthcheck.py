"""The HealthCheckProgram (deploy/slurm/healthcheck.py) run by a real slurmd (Slurm 22.05) every 2 s:
with the health service up, an unfit node is drained with the service's reason and resumed when fit
again; with the service down, nothing is drained and the node agent's own checks are reported, over
plain http and through the agent's web configuration (https + basic auth, as the node package installs
it), where a hard local failure drains with FLEETSIGHT_LOCAL_DRAIN=1."""

from __future__ import annotations

import dataclasses
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from baremetal_helpers import REPO, HookedSlurm, slurm_health
from health_helpers import fast_policy, slurm_cluster, start_health

from exporters.node_web_files import NodeFiles, make_node_config
from support import Process, free_port, served, stopping, wait_until

sys.path.insert(0, str(REPO / "deploy" / "slurm"))
sys.path.insert(0, str(REPO / "tests" / "exporters"))
import healthcheck
from exporter_helpers import NodeSpec, build_node

NODES = ["n0001", "n0002"]
TOKEN = "test-override-token-77aa"


@pytest.fixture(scope="module")
def slurm() -> Iterator[HookedSlurm]:
    with slurm_cluster(HookedSlurm, NODES, "fleetsight-test-hc-") as cluster:
        yield cluster


def known_nodes(url: str) -> set[str]:
    return {n["node"] for n in httpx.get(f"{url}/v1/nodes").json()["nodes"]}


@pytest.fixture(scope="module")
def health(slurm: HookedSlurm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    process, url = slurm_health(tmp_path_factory.mktemp("health-hc"), slurm, tokens=f"{TOKEN}=read,override")
    with stopping(process):
        wait_until(lambda: set(NODES) <= known_nodes(url), 20, what="the Slurm nodes to be known")
        yield url


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real node agent on a fixture kernel log: its local checks find nothing wrong."""
    folder = tmp_path_factory.mktemp("agent")
    port = free_port()
    kernlog = REPO / "tests" / "exporters" / "fixtures" / "kernlog" / "xid_generations.log"
    command = [sys.executable, "-m", "fleetsight.cli", "exporter", "node", "--node", "n0002", "--no-state"]
    command += ["--collector", "xid", "--kmsg-file", str(kernlog), "--listen", f"127.0.0.1:{port}"]
    url = f"http://127.0.0.1:{port}/metrics"
    with served(Process("node agent", command, folder / "agent.log"), url):
        yield url


@pytest.fixture(scope="module")
def secured_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, NodeFiles]]:
    """The real node agent behind the web configuration the node package makes at install (the same
    generator, under a throwaway root), on a host whose GPU 1 link runs downgraded: a hard local failure."""
    folder = tmp_path_factory.mktemp("secured-agent")
    files = NodeFiles(folder / "root")
    make_node_config(files.root)
    host = build_node(folder / "host", NodeSpec(gpus=2, ib_devices=0, oscs=0, downgraded_gpu=1))
    port = free_port()
    command = [sys.executable, "-m", "fleetsight.cli", "exporter", "node", "--node", "n0001", "--no-state"]
    command += ["--collector", "pcie", "--no-nvml", "--sysfs-root", str(host["sys"])]
    command += ["--listen", f"127.0.0.1:{port}", f"--web.config.file={files.config}"]
    process = Process("node agent behind TLS", command, folder / "agent.log")
    url = f"https://127.0.0.1:{port}/metrics"
    try:
        # ready when it answers at all: without credentials, that is 401
        process.wait_for(lambda: secured_status(url, files) == 401, what="the node agent behind TLS")
        yield url, files
    finally:
        process.stop()


def secured_status(url: str, files: NodeFiles) -> int:
    try:
        return httpx.get(url, verify=ssl.create_default_context(cafile=str(files.ca)), timeout=2).status_code
    except httpx.TransportError:
        return 0


def sinfo(slurm: HookedSlurm) -> dict[str, tuple[str, str]]:
    out = subprocess.run(
        ["sinfo", "-N", "-h", "-o", "%N|%T|%E"], env=slurm.env, capture_output=True, text=True, timeout=30
    ).stdout
    return {n: (s, r) for n, s, r in (line.split("|", 2) for line in out.splitlines())}


def scontrol(slurm: HookedSlurm, *args: str) -> None:
    result = subprocess.run(["scontrol", *args], env=slurm.env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, f"scontrol {' '.join(args)}: {result.stderr}"


def log_lines(slurm: HookedSlurm) -> list[str]:
    return slurm.log.read_text().splitlines() if slurm.log.exists() else []


def test_service_up_unfit_node_is_drained_with_the_reason_and_resumed_when_fit(
    slurm: HookedSlurm, health: str
) -> None:
    slurm.configure(FLEETSIGHT_HEALTH_URL=health)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    body = {"state": "unhealthy", "reason": "test: GPU fell off the bus", "expires_in": "10m"}
    httpx.post(f"{health}/v1/nodes/n0001/override", json=body, headers=auth).raise_for_status()
    state, reason = wait_until(
        lambda: (n := sinfo(slurm)["n0001"])[0] in ("drained", "draining") and n, 30, what="n0001 drained"
    )
    print(f"\nhealthcheck, service up: n0001 {state}, reason {reason!r}")
    assert reason.startswith("fleetsight: healthcheck: unhealthy:")
    assert "GPU fell off the bus" in reason
    assert sinfo(slurm)["n0002"][0] == "idle"
    httpx.delete(f"{health}/v1/nodes/n0001/override", headers=auth).raise_for_status()
    wait_until(lambda: sinfo(slurm)["n0001"][0] == "idle", 30, what="n0001 resumed by the healthcheck")
    assert any("resumed (our drain)" in line for line in log_lines(slurm))


def test_operator_drain_is_never_resumed(slurm: HookedSlurm, health: str) -> None:
    slurm.configure(FLEETSIGHT_HEALTH_URL=health)
    scontrol(slurm, "update", "nodename=n0002", "state=drain", "reason=ops: cabling")
    mark = len(log_lines(slurm))
    said = "Slurm already says 'ops: cabling'"  # the service reports the drain; the reason stays theirs
    wait_until(lambda: any(said in line for line in log_lines(slurm)[mark + 1 :]), 20)
    assert sinfo(slurm)["n0002"] == ("drained", "ops: cabling")
    scontrol(slurm, "update", "nodename=n0002", "state=resume")


def test_service_down_never_drains_and_uses_the_local_checks(
    slurm: HookedSlurm, agent: str, tmp_path: Path
) -> None:
    stopped, url = start_health(tmp_path, fast_policy(), [])
    stopped.stop()  # a health service that was there and is gone: connection refused
    slurm.configure(FLEETSIGHT_HEALTH_URL=url, FLEETSIGHT_AGENT_URL=agent, FLEETSIGHT_HEALTH_TIMEOUT="1")
    mark = len(log_lines(slurm))
    lines = wait_until(
        lambda: [line for line in log_lines(slurm)[mark:] if "unreachable" in line and "passed" in line], 20
    )
    print(f"\nhealthcheck, service down: {lines[0]}")
    assert "not draining for FleetSight's outage" in lines[0]
    assert all(state == "idle" for state, _ in sinfo(slurm).values())
    # the node agent down as well: still no drain, and the report says no check ran
    slurm.configure(FLEETSIGHT_HEALTH_URL=url, FLEETSIGHT_AGENT_URL=url + "/metrics")
    mark = len(log_lines(slurm))
    lines = wait_until(lambda: [x for x in log_lines(slurm)[mark:] if "no check ran" in x], 20)
    print(f"healthcheck, service and agent down: {lines[0]}")
    assert all(state == "idle" for state, _ in sinfo(slurm).values())


def test_service_down_agent_behind_tls_and_basic_auth_local_failure_drains(
    slurm: HookedSlurm, secured_agent: tuple[str, NodeFiles], tmp_path: Path
) -> None:
    url, files = secured_agent
    stopped, health_url = start_health(tmp_path, fast_policy(), [])
    stopped.stop()
    down = {
        "FLEETSIGHT_HEALTH_URL": health_url,
        "FLEETSIGHT_HEALTH_TIMEOUT": "1",
        "FLEETSIGHT_LOCAL_DRAIN": "1",
    }
    access = {
        "FLEETSIGHT_AGENT_URL": url,
        "FLEETSIGHT_AGENT_PASSWORD_FILE": str(files.password),
        "FLEETSIGHT_AGENT_CA_FILE": str(files.ca),
        "FLEETSIGHT_AGENT_SERVER_NAME": "fleetsight-exporter",
    }
    # the password left out: the agent answers 401, so no check ran and nothing is drained
    slurm.configure(**down, **{k: v for k, v in access.items() if k != "FLEETSIGHT_AGENT_PASSWORD_FILE"})
    mark = len(log_lines(slurm))
    lines = wait_until(lambda: [x for x in log_lines(slurm)[mark:] if "no check ran" in x], 20)
    print(f"\nhealthcheck, agent behind TLS, no password: {lines[0]}")
    assert "HTTP 401" in lines[0]
    assert all(state == "idle" for state, _ in sinfo(slurm).values())
    # with it: the local checks read the agent over verified https and the downgraded link drains
    slurm.configure(**down, **access)
    try:
        state, reason = wait_until(
            lambda: (n := sinfo(slurm)["n0001"])[0] in ("drained", "draining") and n, 30, what="n0001 drained"
        )
        print(f"healthcheck, agent behind TLS with the password: n0001 {state}, reason {reason!r}")
        assert reason.startswith("fleetsight-local: PCIe link downgraded")
    finally:
        mark = len(log_lines(slurm))
        slurm.configure(**{**down, **access, "FLEETSIGHT_LOCAL_DRAIN": "0"})  # report only again
        # Every node's healthcheck reads this agent, so each drains on its own run: wait until each has
        # run report-only (none drains after that), then resume the drained ones (Slurm refuses to
        # resume a node that is not drained: n0002 may not have run before n0001 drained).
        wait_until(
            lambda: all(
                any(f" {node}: " in x and "(report only)" in x for x in log_lines(slurm)[mark:])
                for node in NODES
            ),
            30,
            what="every node's healthcheck in report-only mode",
        )
        for node, (state, _) in sinfo(slurm).items():  # a local drain is lifted by hand, never by it
            if state in ("drained", "draining"):
                scontrol(slurm, "update", f"nodename={node}", "state=resume")


def test_the_agents_certificate_is_checked_for_the_configured_name(
    secured_agent: tuple[str, NodeFiles],
) -> None:
    url, files = secured_agent
    access = healthcheck.AgentAccess(
        url, "prometheus", str(files.password), str(files.ca), "fleetsight-exporter"
    )
    assert "fleetsight_pcie_link_downgraded" in healthcheck.read_agent(access, 5)
    with pytest.raises(ssl.SSLCertVerificationError, match="fleetsight-elsewhere"):
        healthcheck.read_agent(dataclasses.replace(access, server_name="fleetsight-elsewhere"), 5)
    with pytest.raises(ssl.SSLCertVerificationError):  # the system's CAs do not know a node's own CA
        healthcheck.read_agent(dataclasses.replace(access, ca_file=None), 5)
    with pytest.raises(OSError):  # plain http on the TLS port: no answer
        healthcheck.read_agent(dataclasses.replace(access, url=url.replace("https", "http")), 5)


def test_local_rules_read_the_node_agents_metric_names() -> None:
    text = (
        'fleetsight_pcie_link_downgraded{gpu="3"} 1\n'
        'fleetsight_pcie_link_downgraded{gpu="4"} 0\n'
        'fleetsight_infiniband_port_up{device="mlx5_0",port="1"} 0\n'
        "fleetsight_bmc_psu_healthy 1\n"
    )
    assert healthcheck.local_failures(text) == [
        'PCIe link downgraded {gpu="3"}',
        'InfiniBand port down {device="mlx5_0",port="1"}',
    ]
