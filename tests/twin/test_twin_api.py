"""The twin's Redfish and UFM routes (twin/api.py): one route table, answered by the twin's real HTTP
server and, without a socket, by the backfill's in-process transport. Both must give the same status,
body and headers for every resource, known or not; and the real exporters read the in-process answers
in a backfill."""

from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from twin_helpers import FLEETSIGHT, scenario_arg

from evaluation.backfill import twin_transport
from fleetsight.settings import REPO_ROOT
from twin.scenario import load
from twin.server import TwinServer
from twin.sim import Simulation

SUPPLIES = "/redfish/v1/Chassis/1/PowerSubsystem/PowerSupplies"
MISSING = (
    "/bmc/n0099/redfish/v1/",  # unknown node
    "/bmc/n0099/redfish/v1/Chassis/1/Power",
    "/bmc/n0001",
    "/bmc/n0001/",
    "/bmc/n0001/redfish/v1/Systems",
    "/bmc/n0001/redfish/v1/Chassis/2",
    "/bmc/n0001/redfish/v1/Chassis/2/Power",
    f"/bmc/n0001{SUPPLIES}/PSU6",  # the twin's nodes have six supplies
    f"/bmc/n0001{SUPPLIES}/PSU6/Metrics",
    f"/bmc/n0001{SUPPLIES}/PSUx",  # the index is typed: not a number, no resource
    f"/bmc/n0001{SUPPLIES}/PSU-1",
    "/ufm/ufmRest/resources/links",
)
UFM = (
    "/ufm/ufmRest/resources/ports",
    "/ufm/ufmRest/resources/ports/",
    "/ufm/ufmRest/resources/ports?system=n0002&system=n0003",
    "/ufm/ufmRest/resources/systems",
    "/ufm/ufmRest/app/events",
    "/ufm/ufmRest/app/events?severity=Critical",
    "/ufm/ufmRest/app/events?type=nothing",
    "/ufm/csv/metrics",
)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[httpx.Client, httpx.Client]]:
    """The psu_failure scenario past its fault's onset, served by the twin's HTTP server on a free
    loopback port, and the same simulation behind the backfill's in-process transport."""
    scenario = load(scenario_arg("psu_failure"))
    sim = Simulation(scenario, scenario.start)
    for _ in range(int(10 * 60 / scenario.tick)):  # the PSU fails 8 minutes in
        sim.advance()
    server = TwinServer("127.0.0.1", 0, sim, threading.RLock())
    server.start()
    try:
        with (
            httpx.Client(base_url=server.base_url, timeout=10) as network,
            httpx.Client(base_url="http://twin", transport=twin_transport(sim)) as inprocess,
        ):
            yield network, inprocess
    finally:
        server.stop()


def same_answer(network: httpx.Client, inprocess: httpx.Client, path: str) -> httpx.Response:
    served, answered = network.get(path), inprocess.get(path)
    assert (answered.status_code, answered.content) == (served.status_code, served.content), path
    for header in ("content-type", "odata-version"):
        assert answered.headers.get(header) == served.headers.get(header), (path, header)
    return served


def test_every_redfish_resource_answers_the_same_both_ways(served) -> None:
    network, inprocess = served
    for node in ("n0001", "n0002", "n0005"):
        # Walk the tree as a client does: from the service root, by @odata.id links.
        seen, todo = set(), ["/redfish/v1/", "/redfish/v1", "/redfish"]
        while todo:
            path = todo.pop()
            if path in seen:
                continue
            seen.add(path)
            response = same_answer(network, inprocess, f"/bmc/{node}{path}")
            if path in ("/redfish/v1/Systems", "/redfish/v1/Managers"):
                assert response.status_code == 404  # linked by the root, not played by the twin
                continue
            assert response.status_code == 200 and response.headers["odata-version"] == "4.0", path
            todo += re.findall(r'"@odata\.id": "(/redfish/v1[^"#]*)"', response.text)
            same_answer(network, inprocess, f"/bmc/{node}{path.rstrip('/')}/")  # a trailing slash too
        assert {f"{SUPPLIES}/PSU{i}/Metrics" for i in range(6)} <= seen
    psu = network.get(f"/bmc/n0002{SUPPLIES}/PSU3").json()
    assert psu["Status"]["Health"] == "Critical"  # the fault's supply: the bodies are live state


def test_unknown_nodes_and_resources_are_404_both_ways(served) -> None:
    network, inprocess = served
    for path in MISSING:
        response = same_answer(network, inprocess, path)
        assert response.status_code == 404, path
        if path.startswith("/bmc/"):
            assert response.json()["error"]["code"] == "Base.1.15.ResourceNotFound", path
    assert "n0099" in network.get("/bmc/n0099/redfish/v1/").json()["error"]["message"]


def test_ufm_answers_the_same_both_ways(served) -> None:
    network, inprocess = served
    for path in UFM:
        assert same_answer(network, inprocess, path).status_code == 200, path
    ports = network.get("/ufm/ufmRest/resources/ports?system=n0002&system=n0003").json()
    assert ports and {p["system_name"] for p in ports} == {"n0002", "n0003"}
    assert network.get("/ufm/ufmRest/app/events?type=nothing").json() == []
    assert inprocess.get("/ufm/").json()["ports"] == "http://twin/ufm/ufmRest/resources/ports"


def test_backfill_exporters_read_the_in_process_bmcs_and_ufm(tmp_path: Path) -> None:
    """The real node agents and fabric exporter of a backfill get their Redfish and UFM answers from
    the in-process routes: every node's BMC answered, and the failed supply shows."""
    blocks = tmp_path / "tsdb"
    result = subprocess.run(
        [*FLEETSIGHT, "evaluate", "backfill", "--scenario", scenario_arg("psu_failure"), "--out", str(blocks),
         "--duration", "12m", "--end", "2026-11-21T10:12:00Z", "--agent-step", "60s", "--keep-openmetrics"],
        capture_output=True, text=True, cwd=REPO_ROOT, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    text = "".join(p.read_text() for p in sorted(tmp_path.glob("tsdb-chunk-*.om")))
    bmc_up = re.findall(r'^fleetsight_bmc_up\{[^}]*node="(n\d+)"[^}]*\} (\S+) ', text, re.M)
    assert {node for node, _ in bmc_up} == {f"n000{i}" for i in range(1, 6)}
    assert all(float(value) == 1 for _, value in bmc_up)
    healthy = re.findall(r"^fleetsight_bmc_psu_healthy\{([^}]*)\} (\S+) ", text, re.M)
    failed = {labels for labels, value in healthy if float(value) == 0}
    assert failed and all('node="n0002"' in labels and 'psu="PSU3"' in labels for labels in failed)
    assert re.search(r"^fleetsight_fabric_ports\{[^}]*\} [1-9]", text, re.M)
