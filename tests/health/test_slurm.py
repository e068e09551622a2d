"""slurm-sync and the prolog against a real Slurm on loopback (munged, slurmctld, a slurmd per node,
slurmrestd): drains and reasons checked with the real `sinfo`, and an operator's drain never resumed.
The health service reads the same Slurm through the real slurmrestd (draining vs drained)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from health_helpers import (
    REAL_API,
    REPO,
    node_state,
    post_alert,
    scheduler_views,
    slurm_cluster,
    start_slurm_health,
    wait_state,
)

from health.model import SchedulerView
from health.slurm_local import LocalSlurm
from health.sources import expand_hostlist
from support import free_port, wait_until

NODES = [f"n{i:04d}" for i in range(1, 7)]
FLEETSIGHT = [sys.executable, "-m", "fleetsight.cli"]


def write_prolog(folder: Path) -> dict[str, Path]:
    """slurmd runs FleetSight's prolog before every job; the health service's URL arrives later. The
    script, plus a line per run so that tests know the prolog has finished."""
    prolog = folder / "prolog.sh"
    script = REPO / "health" / "prolog.py"
    prolog.write_text(
        f'#!/bin/sh\n/usr/bin/python3 {script} --timeout 2 --url "$(cat {folder}/health-url)" '
        f"2>>{folder}/prolog.err\n"
        f'rc=$?\necho "$SLURM_JOB_ID $rc" >> {folder}/prolog.done\nexit $rc\n'
    )
    prolog.chmod(0o755)
    return {"prolog": prolog}


@pytest.fixture(scope="module")
def slurm() -> Iterator[LocalSlurm]:
    with slurm_cluster(LocalSlurm, NODES, "fleetsight-test-slurm-", write_prolog) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def health(alertmanager: str, slurm: LocalSlurm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with slurm_health(alertmanager, slurm, tmp_path_factory.mktemp("health-slurm")) as url:
        (slurm.folder / "health-url").write_text(url)
        yield url


@contextlib.contextmanager
def slurm_health(alertmanager: str, slurm: LocalSlurm, folder: Path) -> Iterator[str]:
    """A health service reading Alertmanager and the real slurmrestd; its breaker lets all 6 nodes go."""
    process, url = start_slurm_health(folder, alertmanager, slurm)
    try:
        # every Slurm node known; the session's shared Alertmanager may name other nodes as well (an
        # earlier module's alerts), which the service also lists
        wait_until(
            lambda: set(NODES) <= {n["node"] for n in httpx.get(f"{url}/v1/nodes").json()["nodes"]},
            timeout=20,
            what="the Slurm nodes to be known",
        )
        yield url
    finally:
        process.stop()


def run(slurm: LocalSlurm, *command: str) -> str:
    result = subprocess.run(command, env=slurm.env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, f"{command}: {result.stderr}"
    return result.stdout


def sync(slurm: LocalSlurm, url: str, ledger: Path, *extra: str) -> dict:
    out = run(
        slurm, *FLEETSIGHT, "health", "slurm-sync", "--url", url, "--ledger", str(ledger), "--json", *extra
    )
    return json.loads(out)


def prolog_finished(slurm: LocalSlurm, job: str) -> str | None:
    """The exit status of the prolog for a job, once it has run."""
    done = slurm.folder / "prolog.done"
    runs = dict(line.split() for line in done.read_text().splitlines()) if done.exists() else {}
    return runs.get(job)


def sinfo(slurm: LocalSlurm) -> dict[str, tuple[str, str]]:
    lines = run(slurm, "sinfo", "-N", "-h", "-o", "%N|%T|%E").splitlines()
    return {n: (s, r) for n, s, r in (line.split("|", 2) for line in lines)}


def real_get(slurm: LocalSlurm, what: str) -> dict:
    """The real slurmrestd's answer, over its UNIX socket (rest_auth/local)."""
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(slurm.rest_socket))) as client:
        response = client.get(f"{REAL_API}/{what}", timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def node_of(slurm: LocalSlurm, node: str) -> tuple[str, list[str], str]:
    """A node's state, state_flags and reason as 22.05's slurmrestd shows them."""
    item = next(n for n in real_get(slurm, "nodes")["nodes"] if n["name"] == node)
    return item["state"], item["state_flags"], item["reason"]


def shape_differences(real: dict, fake: dict) -> dict:
    """Keys only one side has, and keys whose JSON types differ (real first, then the twin)."""
    return {
        "only_in_real": sorted(set(real) - set(fake)),
        "only_in_twin": sorted(set(fake) - set(real)),
        "type_differs": {
            k: [type(real[k]).__name__, type(fake[k]).__name__]
            for k in sorted(set(real) & set(fake))
            if type(real[k]) is not type(fake[k])
        },
    }


def test_sync_drains_with_the_reason_and_dry_run_changes_nothing(
    alertmanager: str, slurm: LocalSlurm, health: str, tmp_path: Path
) -> None:
    post_alert(alertmanager, "GPUXidUncorrectable", "n0002", gpu="3", xid="79")
    wait_until(lambda: httpx.get(f"{health}/v1/drain-list").json()["nodes"], timeout=20, what="a drain")
    ledger = tmp_path / "ledger.json"
    plan = sync(slurm, health, ledger, "--dry-run")
    assert plan["dry_run"] and plan["commands"] == [
        "scontrol update nodename=n0002 state=drain 'reason=fleetsight: GPUXidUncorrectable (alertmanager)'"
    ]
    assert sinfo(slurm)["n0002"] == ("idle", "none") and not ledger.exists()

    sync(slurm, health, ledger)
    assert sinfo(slurm)["n0002"] == ("drained", "fleetsight: GPUXidUncorrectable (alertmanager)")
    print(run(slurm, "sinfo", "-R"))  # for the record (docs/health.md shows one)
    reasons = run(slurm, "sinfo", "-R", "-h", "-o", "%E|%N").strip().splitlines()
    assert reasons == ["fleetsight: GPUXidUncorrectable (alertmanager)|n0002"]
    wait_state(health, "n0002", "drained")  # the service reads the drain back from slurmrestd
    assert sync(slurm, health, ledger)["commands"] == []  # idempotent

    post_alert(alertmanager, "GPUXidUncorrectable", "n0002", ends_in=0, gpu="3", xid="79")
    wait_state(health, "n0002", "healthy")
    assert sync(slurm, health, ledger)["resume"] == ["n0002"]
    # Slurm shows a resumed node not-responding (idle*) until its slurmd's next ping
    wait_until(lambda: sinfo(slurm)["n0002"] == ("idle", "none"), timeout=20, what="n0002 idle in Slurm")


def test_an_operators_drain_is_never_resumed(
    alertmanager: str, slurm: LocalSlurm, health: str, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.json"
    run(slurm, "scontrol", "update", "nodename=n0003", "state=drain", "reason=bad DIMM, ticket 42")
    assert node_of(slurm, "n0003") == ("idle", ["DRAIN"], "bad DIMM, ticket 42")
    item = wait_state(health, "n0003", "drained")
    assert item["reasons"][0]["signal"] == "scheduler_drain" and "ticket 42" in item["reasons"][0]["summary"]

    # FleetSight drains n0004, then an operator takes it over with a reason of their own.
    post_alert(alertmanager, "NVSwitchFatal", "n0004", sxid="12028")
    wait_state(health, "n0004", "draining")  # wanted, not yet applied in Slurm
    assert [d["node"] for d in sync(slurm, health, ledger)["drain"]] == ["n0004"]
    wait_state(health, "n0004", "drained")
    run(slurm, "scontrol", "update", "nodename=n0004", "state=drain", "reason=keeping it for the vendor")
    post_alert(alertmanager, "NVSwitchFatal", "n0004", ends_in=0, sxid="12028")
    wait_until(lambda: not httpx.get(f"{health}/v1/drain-list").json()["nodes"], timeout=20, what="no drains")

    plan = sync(slurm, health, ledger)
    assert plan["resume"] == [] and plan["commands"] == []
    skipped = {s["node"]: s["why"] for s in plan["skipped"]}
    assert "drained again by someone else" in skipped["n0004"]
    print(run(slurm, "sinfo", "-R"))  # for the record (docs/health.md shows one)
    state = sinfo(slurm)
    assert state["n0003"] == ("drained", "bad DIMM, ticket 42")
    assert state["n0004"] == ("drained", "keeping it for the vendor")
    assert "n0004" not in json.loads(ledger.read_text())
    run(slurm, "scontrol", "update", "nodename=n0003,n0004", "state=resume")


def test_a_busy_node_is_draining_until_its_job_ends(
    alertmanager: str, slurm: LocalSlurm, health: str, tmp_path: Path
) -> None:
    job = run(
        slurm, "sbatch", "--parsable", "-N1", "-w", "n0005", "-o", "/dev/null", "--wrap", "sleep 600"
    ).strip()
    wait_until(lambda: prolog_finished(slurm, job) == "0", timeout=20, what="the job's prolog to pass")
    post_alert(alertmanager, "GPURowRemapFailed", "n0005", gpu="6")
    wait_until(lambda: httpx.get(f"{health}/v1/drain-list").json()["nodes"], timeout=20, what="a drain")
    sync(slurm, health, tmp_path / "ledger.json")
    assert sinfo(slurm)["n0005"] == ("draining", "fleetsight: GPURowRemapFailed (alertmanager)")
    assert node_of(slurm, "n0005")[:2] == ("allocated", ["DRAIN"])
    wait_state(health, "n0005", "draining")
    run(slurm, "scancel", job)
    item = wait_state(health, "n0005", "repair")  # drained, and the GPU needs an RMA
    assert item["reasons"][0]["signal"] == "GPURowRemapFailed"
    post_alert(alertmanager, "GPURowRemapFailed", "n0005", ends_in=0, gpu="6")
    wait_state(health, "n0005", "healthy")
    assert sync(slurm, health, tmp_path / "ledger.json")["resume"] == ["n0005"]


def test_the_prolog_script_asks_the_service_and_fails_open_or_closed(alertmanager: str, health: str) -> None:
    script = [sys.executable, str(REPO / "health" / "prolog.py")]

    def prolog(*args: str, node: str = "n0001") -> subprocess.CompletedProcess[str]:
        env = {"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": node}  # what slurmd passes; no venv needed
        return subprocess.run(
            [*script, *args], env=env, capture_output=True, text=True, timeout=30, check=False
        )

    assert prolog("--url", health).returncode == 0
    post_alert(alertmanager, "GPUFellOffBus", "n0006", gpu="4")
    wait_until(lambda: not node_state(health, "n0006")["fit"], timeout=20, what="n0006 unfit")
    refused = prolog("--url", health, node="n0006")
    assert refused.returncode == 1 and "n0006 is" in refused.stderr and "GPUFellOffBus" in refused.stderr
    dead = f"http://127.0.0.1:{free_port()}"
    assert prolog("--url", dead, "--timeout", "1").returncode == 0
    closed = prolog("--url", dead, "--timeout", "1", "--fail", "closed")
    assert closed.returncode == 2 and "fail-closed" in closed.stderr


def test_slurmd_runs_the_prolog_and_keeps_jobs_off_an_unfit_node(
    alertmanager: str, slurm: LocalSlurm, health: str
) -> None:
    """The real thing: slurm.conf Prolog= is the script; Slurm drains the node whose prolog refuses
    (n0006, unfit since the previous test) and runs jobs on fit nodes."""
    assert not node_state(health, "n0006")["fit"]
    assert run(slurm, "srun", "-N1", "-w", "n0001", "echo", "ran").strip() == "ran"
    job = run(
        slurm, "sbatch", "--parsable", "-N1", "-w", "n0006", "-o", "/dev/null", "--wrap", "true"
    ).strip()
    wait_until(lambda: sinfo(slurm)["n0006"][0].startswith("drain"), timeout=30, what="Slurm to drain n0006")
    assert "Prolog error" in sinfo(slurm)["n0006"][1]
    assert prolog_finished(slurm, job) == "1"
    assert "fleetsight-preflight: n0006 is" in (slurm.folder / "prolog.err").read_text()
    state = run(slurm, "squeue", "-h", "-j", job, "-o", "%T %r").split()
    assert state and state[0] == "PENDING"  # requeued, not run on the unfit node
    run(slurm, "scancel", job)
    post_alert(alertmanager, "GPUFellOffBus", "n0006", ends_in=0, gpu="4")
    run(slurm, "scontrol", "update", "nodename=n0006", "state=resume")  # Slurm's own drain: ours to lift
    wait_state(health, "n0006", "healthy")


def test_an_operators_drain_of_a_busy_node_is_draining_until_its_job_ends(
    slurm: LocalSlurm, health: str, tmp_path: Path
) -> None:
    """An operator drains a node that runs a job: slurmrestd says state "allocated" with flag DRAIN
    (sinfo: draining). The service reads it as the operator's drain in progress, drained once the job
    ends; the sync never touches it."""
    job = run(slurm, "sbatch", "--parsable", "-N1", "-w", "n0004", "-o", "/dev/null", "--wrap", "sleep 600")
    job = job.strip()
    wait_until(lambda: prolog_finished(slurm, job) == "0", timeout=20, what="the job's prolog to pass")
    run(slurm, "scontrol", "update", "nodename=n0004", "state=drain", "reason=fan noise, ticket 77")
    assert node_of(slurm, "n0004") == ("allocated", ["DRAIN"], "fan noise, ticket 77")
    assert sinfo(slurm)["n0004"] == ("draining", "fan noise, ticket 77")
    item = wait_state(health, "n0004", "draining")
    assert item["reasons"][0]["signal"] == "scheduler_drain" and "ticket 77" in item["reasons"][0]["summary"]
    assert sync(slurm, health, tmp_path / "ledger.json")["commands"] == []
    run(slurm, "scancel", job)
    assert wait_state(health, "n0004", "drained")["reasons"][0]["signal"] == "scheduler_drain"
    run(slurm, "scontrol", "update", "nodename=n0004", "state=resume")
    wait_state(health, "n0004", "healthy")


@pytest.fixture
def fresh_health(alertmanager: str, slurm: LocalSlurm, tmp_path: Path) -> Iterator[str]:
    """A service of its own: the module's has spent its breaker's hourly allowance on earlier tests."""
    with slurm_health(alertmanager, slurm, tmp_path / "health") as url:
        yield url


def test_hung_nodes_go_down_and_keep_their_drains(
    alertmanager: str, slurm: LocalSlurm, fresh_health: str, tmp_path: Path
) -> None:
    """Three slurmds stop answering (SIGSTOP, as on a hung host): n0001 drained by an operator, n0002
    drained by FleetSight, n0003 in service. After SlurmdTimeout Slurm sets them DOWN and keeps a drain
    and its reason (22.05: state "down", flags DRAIN and NOT_RESPONDING). The service keeps both drains
    with their owners' reasons and does not resume ours while the node is down, even once its alert
    clears; n0003 is unhealthy (scheduler_down), so the sync drains it. When the hosts reboot, Slurm
    returns the nodes with their drains and reasons (ReturnToService=2: IDLE+DRAIN) and the sync resumes
    its own two only."""
    health, ledger, hung = fresh_health, tmp_path / "ledger.json", ("n0001", "n0002", "n0003")
    run(slurm, "scontrol", "update", "nodename=n0001", "state=drain", "reason=vendor RMA 12")
    post_alert(alertmanager, "GPUXidUncorrectable", "n0002", gpu="1", xid="79")
    wait_state(health, "n0002", "draining")
    assert [d["node"] for d in sync(slurm, health, ledger)["drain"]] == ["n0002"]
    ours = "fleetsight: GPUXidUncorrectable (alertmanager)"
    try:
        for node in hung:
            slurm.hang(node)
        real = wait_until(
            lambda: (
                (n := {x["name"]: x for x in real_get(slurm, "nodes")["nodes"]})
                and all(n[h]["state"] == "down" for h in hung)
                and n
            ),
            timeout=150,
            what="Slurm to set the hung nodes DOWN (SlurmdTimeout=60)",
        )
        flags = {h: (real[h]["state_flags"], real[h]["reason"]) for h in hung}
        assert flags == {
            "n0001": (["DRAIN", "NOT_RESPONDING"], "vendor RMA 12"),
            "n0002": (["DRAIN", "NOT_RESPONDING"], ours),
            "n0003": (["NOT_RESPONDING"], "Not responding"),
        }
        # the same words and reason as the twin's crashed host past SlurmdTimeout (tests/twin)
        views = scheduler_views(REAL_API, slurm.rest_socket)
        assert views["n0003"] == SchedulerView(("DOWN", "NOT_RESPONDING"), "Not responding", False)
        item = wait_until(
            lambda: (
                (i := node_state(health, "n0001"))
                and [r["signal"] for r in i["reasons"]] == ["scheduler_drain", "scheduler_down"]
                and i
            ),
            timeout=20,
            what="the service to see n0001 down and drained",
        )
        assert item["state"] == "drained" and "vendor RMA 12" in item["reasons"][0]["summary"]

        post_alert(alertmanager, "GPUXidUncorrectable", "n0002", ends_in=0, gpu="1", xid="79")
        wait_until(
            lambda: [r["signal"] for r in node_state(health, "n0002")["reasons"]] == ["scheduler_down"],
            timeout=20,
            what="n0002's alert to clear, Slurm's DOWN left",
        )
        assert node_state(health, "n0002")["state"] == "drained"
        wait_state(health, "n0003", "draining")
        plan = sync(slurm, health, ledger)
        assert plan["resume"] == [] and [d["node"] for d in plan["drain"]] == ["n0003"]
        state = sinfo(slurm)
        assert state["n0003"] == ("drained*", "fleetsight: scheduler_down (scheduler)")
        assert state["n0001"] == ("drained*", "vendor RMA 12") and state["n0002"] == ("drained*", ours)
        print(run(slurm, "sinfo", "-R"))  # for the record (docs/health.md shows one)
    finally:
        for node in hung:  # a DOWN node stays DOWN until its slurmd registers again: power-cycle the hosts
            slurm.reboot(node)
    for node in ("n0002", "n0003"):
        wait_state(health, node, "healthy")
    assert sorted(sync(slurm, health, ledger)["resume"]) == ["n0002", "n0003"]
    assert sinfo(slurm)["n0001"] == ("drained", "vendor RMA 12")
    run(slurm, "scontrol", "update", "nodename=n0001", "state=resume")
    wait_until(
        lambda: all(sinfo(slurm)[h] == ("idle", "none") for h in hung), timeout=30, what="the nodes back idle"
    )


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The twin on live_short.yaml in real time: job 7301 on n0001-n0004, n0005 and n0006 idle."""
    port = free_port()
    scenario = Path(__file__).with_name("scenarios") / "live_short.yaml"
    out = tmp_path_factory.mktemp("twin")
    command = [*FLEETSIGHT, "twin", "run", "--scenario", str(scenario), "--out", str(out), "--serve"]
    command += ["--speed", "realtime", "--listen", f"127.0.0.1:{port}"]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: fetch_json(f"{url}/slurm/v0.0.40/jobs"), timeout=60, what="the twin's jobs endpoint"
        )
        yield url
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_twin_and_real_slurmrestd_answer_the_jobs_query_alike(
    slurm: LocalSlurm, twin: str, tmp_path: Path
) -> None:
    """The twin's slurmrestd-style endpoint next to the real one: what the health service reads must be
    there in both; the differences are written out for the twin's owner (docs/health.md lists them)."""
    try:
        run(slurm, "sbatch", "-N2", "-o", "/dev/null", "--wrap", "sleep 300")
        real = wait_until(
            lambda: [j for j in real_get(slurm, "jobs")["jobs"] if j["job_state"] == "RUNNING"],
            timeout=20,
            what="a running job in slurmrestd",
        )[0]
        fake = next(
            j for j in fetch_json(f"{twin}/slurm/v0.0.40/jobs")["jobs"] if "RUNNING" in j["job_state"]
        )
        used = (
            "job_id",
            "job_state",
            "nodes",
            "node_count",
            "name",
            "user_name",
            "partition",
            "state_reason",
        )
        assert all(k in real and k in fake for k in used)
        assert expand_hostlist(real["nodes"]) and expand_hostlist(fake["nodes"])
        differences = shape_differences(real, fake)
        (tmp_path / "slurmrestd-jobs-differences.json").write_text(json.dumps(differences, indent=1))
        print(json.dumps(differences))
    finally:
        run(slurm, "scancel", "--user", "root")


def test_twin_and_real_slurmrestd_answer_the_nodes_query_alike(
    slurm: LocalSlurm, twin: str, tmp_path: Path
) -> None:
    """/nodes from both (real: 22.05's v0.0.38, state a lower-case word plus state_flags; twin: 23.11's
    v0.0.40, state a list of upper-case words): the fields the service reads are in both, and its own
    parser gives the same state words, reason and busy flag for an idle node and a node with a job."""
    job = run(slurm, "sbatch", "--parsable", "-N1", "-w", "n0001", "-o", "/dev/null", "--wrap", "sleep 300")
    try:
        busy, idle = SchedulerView(("ALLOCATED",), "", True), SchedulerView(("IDLE",), "", False)
        real = wait_until(
            lambda: (
                (v := scheduler_views(REAL_API, slurm.rest_socket))["n0001"] == busy
                and idle in v.values()
                and v
            ),
            timeout=30,
            what="slurmrestd to show n0001 allocated and an idle node",
        )
        fake = scheduler_views(f"{twin}/slurm/v0.0.40")
        assert fake["n0001"] == busy and fake["n0005"] == idle  # job 7301 runs on n0001-n0004
        assert set(real) == set(NODES) and set(fake) == set(NODES)
        real_nodes = {n["name"]: n for n in real_get(slurm, "nodes")["nodes"]}
        fake_nodes = {n["name"]: n for n in fetch_json(f"{twin}/slurm/v0.0.40/nodes")["nodes"]}
        for item in (real_nodes["n0001"], fake_nodes["n0001"]):
            assert {"name", "state", "reason"} <= set(item)  # and state_flags where the version has it
        assert real_nodes["n0001"]["state_flags"] == [] and "state_flags" not in fake_nodes["n0001"]
        differences = shape_differences(real_nodes["n0001"], fake_nodes["n0001"])
        (tmp_path / "slurmrestd-nodes-differences.json").write_text(json.dumps(differences, indent=1))
        print(json.dumps(differences))
    finally:
        run(slurm, "scancel", job.strip())


def fetch_json(url: str) -> dict | None:
    try:
        response = httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None
