"""Pair checks off the scheduler: a validation asking for the pair check on one node gets a healthy idle
partner (one on its own leaf first), a unit without one waits saying so, pairs go before single-node
work; and the two sides of `fleetsight checks pair` as two real processes, talking through the twin's
ib_write_bw stand-ins, post one result per node with the result per port."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import yaml

from checks.plan import Unit, plan, with_partners
from support import Process, free_port, stopping

FLEETSIGHT = [sys.executable, "-m", "fleetsight.cli"]
LEAVES = {"a1": frozenset({"leaf-a"}), "a2": frozenset({"leaf-a"}), "b1": frozenset({"leaf-b"})}


def test_a_validation_pair_gets_a_partner_on_its_own_leaf_first() -> None:
    wanted = [Unit("ib_pair_bandwidth", ("a1",), validation=True), Unit("dcgm_diag_r2", ("b1",))]
    paired = with_partners(wanted, {"ib_pair_bandwidth"}, {"a2", "b1"}, LEAVES)
    assert paired[0] == Unit("ib_pair_bandwidth", ("a1", "a2"), validation=True)
    assert paired[1] == wanted[1]
    alone = with_partners(wanted[:1], {"ib_pair_bandwidth"}, set(), LEAVES)
    decision = plan(alone, {"a1"}, [], LEAVES, budget=4, unit_size={"ib_pair_bandwidth": 2})
    assert decision.waiting == {alone[0]: "no partner: no healthy idle node to pair with"}


def test_pairs_go_before_single_node_work_that_would_take_one_of_their_leaves() -> None:
    pair, single = Unit("ib_pair_bandwidth", ("a2", "b1")), Unit("dcgm_diag_r2", ("a1",))
    decision = plan([single, pair], {"a1", "a2", "b1"}, [], LEAVES, budget=4)
    assert decision.start == [pair]
    assert decision.waiting == {single: "leaf busy: leaf-a"}


def test_the_two_sides_of_a_pair_post_a_result_per_node_and_port(tmp_path: Path) -> None:
    faults = tmp_path / "faults.yml"
    faults.write_text(yaml.safe_dump({"srv": [{"kind": "ib_port_down", "port": 6}]}))
    stand_in = [
        sys.executable,
        "-m",
        "twin.checks",
        "--faults",
        str(faults),
        "--node",
        "{node}",
        "ib_write_bw",
    ]
    tools = tmp_path / "tools.yml"
    tools.write_text(yaml.safe_dump({"tools": {"ib_write_bw": stand_in}}))
    port = free_port()
    serve = [*FLEETSIGHT, "checks", "serve", "--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path)]
    url = f"http://127.0.0.1:{port}"
    pair = [*FLEETSIGHT, "checks", "pair", "--client", "cli", "--server", "srv", "--tools", str(tools)]
    with stopping(Process("checks", serve, tmp_path / "checks.log")) as service:
        service.wait_ready(f"{url}/-/ready")
        server = subprocess.Popen([*pair, "--here", "srv"], stdout=subprocess.PIPE, text=True)
        client = subprocess.run(
            [*pair, "--here", "cli", "--report", url],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        served = server.communicate(timeout=60)[0]
        results = {r["node"]: r for r in httpx.get(f"{url}/v1/results", timeout=5).json()["results"]}
    assert client.returncode == 1, client.stderr  # a failed check, posted
    assert server.returncode == 0 and served.count("RDMA_Write BW Test") == 7
    assert sorted(results) == ["cli", "srv"]
    for node, partner in (("cli", "srv"), ("srv", "cli")):
        result = results[node]
        assert result["summary"] == f"slow or unreadable towards {partner}: mlx5_6"
        ports = result["evidence"]["ports"]
        assert sorted(ports) == [f"mlx5_{i}" for i in range(8)]
        assert [d for d, p in ports.items() if not p["passed"]] == ["mlx5_6"]
