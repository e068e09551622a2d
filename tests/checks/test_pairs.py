"""Pair checks off the scheduler: a validation asking for the pair check on one node gets a healthy idle
partner (one on its own leaf first), a unit without one waits saying so, pairs go before single-node
work; and the two sides of `fleetsight checks pair` as two real processes, talking through the twin's
ib_write_bw stand-ins, post one result per node with the result per port."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import yaml

from checks.catalog import load_catalog
from checks.kube import KubeChecks, job_name, started_at
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
    token = "pair-test-results-token-0c4f"
    service_env = {**os.environ, "FLEETSIGHT_CHECKS_TOKENS": f"{token}=results"}
    with stopping(Process("checks", serve, tmp_path / "checks.log", service_env)) as service:
        service.wait_ready(f"{url}/-/ready")
        server = subprocess.Popen([*pair, "--here", "srv"], stdout=subprocess.PIPE, text=True)
        client = subprocess.run(
            [*pair, "--here", "cli", "--report", url],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**os.environ, "FLEETSIGHT_CHECKS_TOKEN": token},  # the client side posts
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


# A Job's name: a DNS-1123 subdomain that is also its pods' job-name label value (so 63 characters at most)
JOB_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def test_kubernetes_job_names_keep_the_start_time_and_tell_long_node_names_apart() -> None:
    """A pair's two Jobs start together on two nodes whose names may share a long prefix, and the same node
    may run the check again within the second (a tool that fails at once): every name must differ and
    stay a valid 63-character label (cutting the time off, as a plain [:63] did for long node names,
    reused the name: 409 Conflict)."""
    nodes = ["kc1", "dgx-h100-rack01-node01", "dgx-h100-rack01-node02", "gpu-node-a01.cluster.example.com"]
    times = (1763000000.25, 1763000000.75, 1763000001.0)
    names = {(n, t): job_name("ib_pair_bandwidth", n, t) for n in nodes for t in times}
    assert len(set(names.values())) == len(names)
    for (_, started), name in names.items():
        assert len(name) <= 63 and JOB_NAME.fullmatch(name), name
        assert name.endswith(f"-{round(started * 1000)}"), name
    assert names[("kc1", times[0])] == "fleetsight-check-ib-pair-bandwidth-kc1-1763000000250"
    runner = KubeChecks(None, load_catalog(), "http://checks:9443", ["fleetsight"])  # type: ignore[arg-type]
    job = runner.job(Unit("ib_pair_bandwidth", ("dgx-h100-rack01-node02",)), ["checks", "pair"])
    assert job["metadata"]["name"].startswith("fleetsight-check-ib-pair-bandwidth-dgx-h10-")
    assert job["spec"]["template"]["spec"]["nodeName"] == "dgx-h100-rack01-node02"
    # when the Job started, to the millisecond: a result of the run before, finished earlier in the same
    # second, is not this Job's (creationTimestamp, whole seconds, is only the fallback)
    started = started_at(job)
    assert job["metadata"]["name"].endswith(f"-{round(started * 1000)}")
    job["metadata"]["creationTimestamp"] = "2025-11-13T02:13:20Z"
    assert started_at(job) == started  # the annotation wins
    del job["metadata"]["annotations"]
    assert started_at(job) == 1763000000.0
