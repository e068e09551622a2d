"""Active checks on a real Slurm 22.05 (munged, slurmctld, a slurmd per node, slurmrestd): intrusive
checks run as exclusive batch jobs only on idle nodes, one per fabric leaf, within the budget; and the
validation loop: a node the health service drained for a fault comes back only after the checks its fault
calls for pass on it (the twin's dcgmi stand-in answers, twin/checks.py), and stays out while one fails."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from health_helpers import (
    REPO,
    post_alert,
    slurm_cluster,
    start_slurm_health,
    wait_state,
)

from checks.catalog import load_catalog
from checks.plan import Unit
from checks.slurm import SlurmChecks, validation_requests
from health.slurm_local import LocalSlurm
from support import Process, free_port, stopping, wait_until

NODES = ["n0001", "n0002", "n0003", "n0004"]
LEAVES = {"n0001": frozenset({"leaf-a"}), "n0002": frozenset({"leaf-a"}), "n0003": frozenset({"leaf-b"})}
LEAVES = {**LEAVES, "n0004": frozenset({"leaf-b"})}
FLEETSIGHT = [sys.executable, "-m", "fleetsight.cli"]
TRACE: list[str] = []


@pytest.fixture(scope="module")
def slurm() -> Iterator[LocalSlurm]:
    with slurm_cluster(LocalSlurm, NODES, "fleetsight-test-checks-") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def world(slurm: LocalSlurm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The checks service (a test policy: GPUXidUncorrectable needs dcgm_diag_r4), a tools file that
    points dcgmi at the twin's stand-in, and its faults file."""
    folder = slurm.folder / "checks"  # the batch jobs (as root, any directory) write their output here
    folder.mkdir()
    faults = folder / "faults.yml"
    faults.write_text("{}\n")
    tools = folder / "tools.yml"
    stand_in = [sys.executable, "-m", "twin.checks", "--faults", str(faults), "--node", "{node}"]
    stand_ins = {"dcgmi": [*stand_in, "dcgmi"], "ib_write_bw": [*stand_in, "ib_write_bw"]}
    tools.write_text(yaml.safe_dump({"tools": stand_ins}))
    policy = folder / "policy.yml"
    policy.write_text(yaml.safe_dump({"after": {"GPUXidUncorrectable": ["dcgm_diag_r4"]}, "default": []}))
    port = free_port()
    command = [*FLEETSIGHT, "checks", "serve", "--listen", f"127.0.0.1:{port}", "--state-dir", str(folder)]
    # The jobs post with the token of a file on the nodes (only its path goes through Slurm).
    token_file = folder / "checks-token"
    token_file.write_text("slurm-test-results-token-a71e\n")
    service_env = {**os.environ, "FLEETSIGHT_CHECKS_TOKENS": "slurm-test-results-token-a71e=results"}
    process = Process(
        "checks",
        [*command, "--policy", str(policy), "--cluster", "test"],
        folder / "checks.log",
        service_env,
    )
    url = f"http://127.0.0.1:{port}"
    with stopping(process):
        process.wait_ready(f"{url}/-/ready")
        env = {**slurm.env, "PYTHONPATH": str(REPO)}  # the jobs import twin.checks from this checkout
        runner = SlurmChecks(
            load_catalog(), url, FLEETSIGHT, tools, folder, env=env, leaf_map=LEAVES, budget=3,
            token_file=str(token_file),
        )  # fmt: skip
        yield {"url": url, "faults": faults, "runner": runner, "folder": folder}


def results(url: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["node"], r["check"]): r for r in httpx.get(f"{url}/v1/results", timeout=5).json()["results"]}


def squeue(slurm: LocalSlurm) -> list[tuple[str, str, str]]:
    out = subprocess.run(
        ["squeue", "-h", "-o", "%j|%T|%N"], env=slurm.env, capture_output=True, text=True, check=True
    ).stdout
    return [tuple(line.split("|")) for line in out.splitlines()]  # type: ignore[misc]


def sinfo(slurm: LocalSlurm) -> dict[str, tuple[str, str]]:
    out = subprocess.run(
        ["sinfo", "-N", "-h", "-o", "%N|%T|%E"], env=slurm.env, capture_output=True, text=True, check=True
    ).stdout
    return {n: (s, r) for n, s, r in (line.split("|", 2) for line in out.splitlines())}


def no_check_jobs(slurm: LocalSlurm) -> bool:
    return not [j for j in squeue(slurm) if j[0].startswith("fleetsight-check:")]


def test_intrusive_checks_only_on_idle_nodes_one_per_leaf_within_the_budget(
    slurm: LocalSlurm, world: dict[str, Any]
) -> None:
    runner: SlurmChecks = world["runner"]
    user = subprocess.run(
        ["sbatch", "--parsable", "--nodelist=n0001", "--job-name=training", f"--output={slurm.folder}/%j.out",
         "--wrap", "sleep 600"],
        env=slurm.env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    try:
        wait_until(lambda: ("training", "RUNNING", "n0001") in squeue(slurm), timeout=20, what="the user job")
        wanted = [Unit("dcgm_diag_r2", (n,)) for n in NODES]
        decision = runner.cycle(wanted)
        assert [u.nodes for u in decision.start] == [("n0002",), ("n0003",)]
        assert decision.waiting[wanted[0]] == "not idle: n0001"
        assert decision.waiting[wanted[3]] == "leaf busy: leaf-b"
        wait_until(
            lambda: {("n0002", "dcgm_diag_r2"), ("n0003", "dcgm_diag_r2")} <= set(results(world["url"])),
            timeout=60,
            what="the two check jobs to post their results",
        )
        assert ("n0001", "dcgm_diag_r2") not in results(world["url"])  # never under the running job
        assert ("training", "RUNNING", "n0001") in squeue(slurm)
        wait_until(lambda: no_check_jobs(slurm), timeout=30, what="the check jobs to leave the queue")
        second = runner.cycle(wanted[3:])  # leaf-b is free again
        assert [u.nodes for u in second.start] == [("n0004",)]
        wait_until(
            lambda: ("n0004", "dcgm_diag_r2") in results(world["url"]), timeout=60, what="n0004's result"
        )
    finally:
        subprocess.run(["scancel", user], env=slurm.env, check=False)
    comments = runner.publish_comments(list(results(world["url"]).values()))
    assert comments["n0002"] == "fleetsight-checks: dcgm_diag_r2=PASS"
    shown = subprocess.run(
        ["scontrol", "show", "node", "n0002"], env=slurm.env, capture_output=True, text=True
    )
    assert "Comment=fleetsight-checks: dcgm_diag_r2=PASS" in shown.stdout


def test_budget_holds_across_passes(slurm: LocalSlurm, world: dict[str, Any]) -> None:
    runner: SlurmChecks = world["runner"]
    wait_until(lambda: no_check_jobs(slurm), timeout=30, what="an empty queue")
    tight = SlurmChecks(runner.catalog, runner.checks_url, FLEETSIGHT, runner.tools_file, runner.output_dir,
                        env=runner.env, leaf_map={}, budget=1, token_file=runner.token_file)  # fmt: skip
    wanted = [Unit("dcgm_diag_r4", (n,)) for n in NODES]
    decision = tight.cycle(wanted)
    assert len(decision.start) == 1
    assert all(why.startswith("budget: 1 of 1") for why in decision.waiting.values())
    wait_until(lambda: no_check_jobs(slurm), timeout=60, what="the check job to finish")


def test_a_pair_check_is_one_job_on_both_nodes_holding_both_leaves_with_a_result_per_port(
    slurm: LocalSlurm, world: dict[str, Any]
) -> None:
    """ib_write_bw between n0002 (leaf-a) and n0003 (leaf-b): one two-node job, the server side on
    n0003 and the client on n0002 (the twin's stand-ins talk to each other), port 3 of n0003 down; both
    leaves are held while it runs, and both nodes get the result with the port named."""
    runner: SlurmChecks = world["runner"]
    wait_until(lambda: no_check_jobs(slurm), timeout=60, what="an empty queue")
    world["faults"].write_text(yaml.safe_dump({"n0003": [{"kind": "ib_port_down", "port": 3}]}))
    before = results(world["url"])
    pair = Unit("ib_pair_bandwidth", ("n0002", "n0003"))
    others = [Unit("dcgm_diag_r2", ("n0001",)), Unit("dcgm_diag_r2", ("n0004",))]
    decision = runner.cycle([pair, *others])
    assert decision.start == [pair]
    assert decision.waiting == {others[0]: "leaf busy: leaf-a", others[1]: "leaf busy: leaf-b"}
    jobs = [j for j in squeue(slurm) if j[0] == "fleetsight-check:ib_pair_bandwidth"]
    assert len(jobs) == 1  # one unit of the scheduler for the pair
    assert [u.nodes for _, u, _ in runner.running()] == [("n0002", "n0003")]
    assert runner.cycle(others).waiting == {  # a later pass still sees both leaves held
        others[0]: "leaf busy: leaf-a",
        others[1]: "leaf busy: leaf-b",
    }

    def fresh() -> dict[tuple[str, str], dict[str, Any]]:
        now = results(world["url"])
        return {k: v for k, v in now.items() if k[1] == "ib_pair_bandwidth" and now[k] != before.get(k)}

    wait_until(lambda: len(fresh()) == 2, timeout=90, what="the pair's results for both nodes")
    got = fresh()
    world["faults"].write_text("{}\n")
    for node, partner, role in (("n0002", "n0003", "client"), ("n0003", "n0002", "server")):
        result = got[(node, "ib_pair_bandwidth")]
        assert not result["passed"] and result["summary"] == f"slow or unreadable towards {partner}: mlx5_3"
        evidence = result["evidence"]
        assert (evidence["partner"], evidence["role"]) == (partner, role)
        assert [d for d, p in evidence["ports"].items() if not p["passed"]] == ["mlx5_3"]
        assert evidence["ports"]["mlx5_0"]["gbits"] == pytest.approx(392.0)
        assert "Unable to Connect the HCA" in evidence["ports"]["mlx5_3"]["output_head"]
    wait_until(lambda: no_check_jobs(slurm), timeout=30, what="the pair job to end")


@contextlib.contextmanager
def health_with_gate(alertmanager: str, slurm: LocalSlurm, checks_url: str, folder: Path) -> Iterator[str]:
    env = {"FLEETSIGHT_CHECKS_URL": checks_url, "FLEETSIGHT_CHECKS_REFRESH": "0.3"}
    process, url = start_slurm_health(folder, alertmanager, slurm, env=env)
    with stopping(process):
        yield url


def sync(slurm: LocalSlurm, url: str, ledger: Path) -> None:
    command = [*FLEETSIGHT, "health", "slurm-sync", "--url", url, "--ledger", str(ledger), "--json"]
    subprocess.run(command, env=slurm.env, capture_output=True, text=True, check=True, timeout=60)


def phase(url: str, node: str) -> dict[str, Any]:
    response = httpx.get(f"{url}/v1/validation/{node}", timeout=5)
    return response.json() if response.status_code == 200 else {"phase": None}


def trace(url: str, slurm: LocalSlurm, node: str, step: str) -> None:
    state = httpx.get(f"{url}/v1/nodes/{node}", timeout=5).json()["state"]
    slurm_state, reason = sinfo(slurm)[node]
    where = phase(url, node)["phase"]
    line = f"{time.strftime('%H:%M:%S')} {step:<38} health={state:<9} phase={where!s:<10} slurm={slurm_state}"
    TRACE.append(f"{line} ({reason})")


@contextlib.contextmanager
def slurm_evidence_on_failure(slurm: LocalSlurm) -> Iterator[None]:
    """On a failure, print what slurmctld saw (its log's tail, the queue, the reservations): a job that
    never started on a busy CI machine is otherwise a bare timeout."""
    try:
        yield
    except BaseException:
        log = slurm.folder / "log" / "slurmctld.log"
        print("slurmctld.log (tail):", *log.read_text(errors="replace").splitlines()[-60:], sep="\n")
        for command in (["squeue", "-a", "-o", "%i|%j|%T|%r|%N"], ["scontrol", "show", "reservation"]):
            shown = subprocess.run(command, env=slurm.env, capture_output=True, text=True, check=False)
            print(" ".join(command), shown.stdout, shown.stderr, sep="\n")
        raise


def test_drained_node_stays_out_on_failing_diagnostic_and_resumes_after_a_pass(
    slurm: LocalSlurm, world: dict[str, Any], alertmanager: str, tmp_path: Path
) -> None:
    with slurm_evidence_on_failure(slurm):
        drain_validate_resume(slurm, world, alertmanager, tmp_path)
    print("\n".join(["", "drain -> validate -> resume on Slurm:", *TRACE]))


def drain_validate_resume(
    slurm: LocalSlurm, world: dict[str, Any], alertmanager: str, tmp_path: Path
) -> None:
    node, ledger = "n0004", tmp_path / "ledger.json"
    world["faults"].write_text(yaml.safe_dump({node: [{"kind": "hbm_silent_corruption", "gpu": 2}]}))
    runner: SlurmChecks = world["runner"]
    catalog = runner.catalog
    wait_until(lambda: no_check_jobs(slurm), timeout=30, what="an empty queue")
    with health_with_gate(alertmanager, slurm, world["url"], tmp_path / "health") as url:
        post_alert(alertmanager, "GPUXidUncorrectable", node, ends_in=600, xid="48")
        wait_until(lambda: node in [d["node"] for d in httpx.get(f"{url}/v1/drain-list").json()["nodes"]],
                   timeout=30, what="the drain")  # fmt: skip
        sync(slurm, url, ledger)
        wait_state(url, node, "drained")
        trace(url, slurm, node, "alert fired, slurm-sync drained")
        post_alert(alertmanager, "GPUXidUncorrectable", node, ends_in=0, xid="48")  # repaired
        wait_until(lambda: phase(url, node)["phase"] == "validating", timeout=30, what="validation to start")
        assert phase(url, node)["missing"] == ["dcgm_diag_r4"]
        trace(url, slurm, node, "alert resolved: validating")
        started = runner.cycle(validation_requests(url, catalog)).start
        assert started == [Unit("dcgm_diag_r4", (node,), validation=True)]
        trace(url, slurm, node, "check job queued in its reservation")
        assert sinfo(slurm)[node][1] == "fleetsight: GPUXidUncorrectable (alertmanager)"  # drained again
        wait_until(lambda: phase(url, node)["phase"] == "failed", timeout=60, what="the failing diagnostic")
        failed = phase(url, node)["failed"][0]
        assert failed["check"] == "dcgm_diag_r4" and "memtest (GPU 2)" in failed["summary"]
        wait_until(lambda: no_check_jobs(slurm), timeout=30, what="the check job to end")
        sync(slurm, url, ledger)
        trace(url, slurm, node, "dcgm_diag_r4 ERR: stays out")
        assert node in [d["node"] for d in httpx.get(f"{url}/v1/drain-list").json()["nodes"]]
        # Still drained: "$" while its maintenance reservation lasts, which may end first on a slow machine.
        assert sinfo(slurm)[node][0] in ("drained", "drained$")

        world["faults"].write_text("{}\n")  # the GPU is replaced
        assert runner.cycle(validation_requests(url, catalog, retry_after=3600)).start == []  # not yet
        rerun = runner.cycle(validation_requests(url, catalog, retry_after=0)).start
        assert rerun == [Unit("dcgm_diag_r4", (node,), validation=True)]
        trace(url, slurm, node, "after repair: check job rerun")
        wait_until(lambda: phase(url, node)["phase"] == "resumed", timeout=60, what="the passing diagnostic")
        wait_until(lambda: no_check_jobs(slurm), timeout=30, what="the check job to end")
        runner.cycle([])  # ends the validation reservation
        wait_until(lambda: node not in [d["node"] for d in httpx.get(f"{url}/v1/drain-list").json()["nodes"]],
                   timeout=30, what="the drain to be released")  # fmt: skip
        sync(slurm, url, ledger)
        wait_until(lambda: sinfo(slurm)[node][0] == "idle", timeout=30, what="the node back in service")
        trace(url, slurm, node, "dcgm_diag_r4 PASS: resumed")
        assert (
            "fleetsight-validate-"
            not in subprocess.run(
                ["scontrol", "show", "reservation"], env=slurm.env, capture_output=True, text=True
            ).stdout
        )
