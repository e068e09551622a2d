"""End to end on the local stack: the twin's kernel and job logs go through rsyslog, Kafka and the
ingest pipelines into OpenSearch, parsed, and `fleetsight logs search` answers from them."""

from __future__ import annotations

import subprocess

import httpx
from logs_helpers import LogStack

from support import FLEETSIGHT, REPO_ROOT, wait_until

# What the test scenario's faults make the twin write (tests/pipelines/logs_scenario.yaml).
TWIN_ACTIONS = {
    "xid",
    "nvswitch_fatal",
    "sxid",
    "lustre_error",
    "lustre_timeout",
    "lustre_connection_lost",
    "ib_link_down",
    "ib_link_up",
    "ib_port_state",
    "training_progress",
    "cuda_error",
    "nccl_timeout",
    "bmc_sel",
}


def action_counts(stack: LogStack) -> dict[str, int]:
    httpx.post(f"{stack.search_url}/fleetsight-logs-*/_refresh", timeout=30)
    response = httpx.post(
        f"{stack.search_url}/fleetsight-logs-*/_search?allow_no_indices=true",
        json={"size": 0, "aggs": {"actions": {"terms": {"field": "event.action", "size": 100}}}},
        timeout=30,
    )
    buckets = response.json().get("aggregations", {}).get("actions", {}).get("buckets", [])
    return {bucket["key"]: bucket["doc_count"] for bucket in buckets}


def actions_indexed(stack: LogStack) -> set[str]:
    return set(action_counts(stack))


def first(stack: LogStack, action: str, node: str | None = None) -> dict:
    filters = [{"term": {"event.action": action}}] + ([{"term": {"host.name": node}}] if node else [])
    response = httpx.post(
        f"{stack.search_url}/fleetsight-logs-*/_search",
        json={"size": 1, "query": {"bool": {"filter": filters}}},
        timeout=30,
    )
    return response.json()["hits"]["hits"][0]["_source"]


def test_the_twins_logs_arrive_parsed(log_stack: LogStack) -> None:
    wait_until(
        lambda: actions_indexed(log_stack) >= TWIN_ACTIONS,
        timeout=240,
        interval=2,
        what=f"every kind of event the twin writes: {sorted(TWIN_ACTIONS)}",
    )
    print(
        "\nparsed events from the twin:",
        ", ".join(f"{k} {v}" for k, v in sorted(action_counts(log_stack).items())),
    )
    xid = first(log_stack, "xid")
    assert xid["host"]["name"] == "n0002"
    assert xid["nvidia"]["xid"]["code"] == 79
    assert xid["nvidia"]["xid"]["category"] == "fallen_off_bus"
    assert xid["fleetsight"]["cluster"] == log_stack.settings.cluster == "logs-e2e"  # the stack's one name
    assert xid["event"]["id"] == f"n0002:{xid['log']['file']['path']}:{xid['log']['offset']}"
    fatal = first(log_stack, "nvswitch_fatal")
    assert (fatal["host"]["name"], fatal["nvidia"]["sxid"]["switch"]) == ("n0004", 1)
    progress = first(log_stack, "training_progress")
    assert progress["fleetsight"]["hpc_job"] in {"5101", "5102"}
    assert progress["training"]["loss"] > 0 and progress["training"]["step"] >= 0
    # The Xid 79 on n0002 kills the rank on that GPU: a CUDA error in job 5101's log on n0002.
    cuda = first(log_stack, "cuda_error", node="n0002")
    assert cuda["fleetsight"]["hpc_job"] == "5101"
    assert cuda["cuda"]["error"] == "unspecified launch failure"


def first_in(stack: LogStack, index: str, action: str) -> dict:
    response = httpx.post(
        f"{stack.search_url}/{index}/_search?allow_no_indices=true",
        json={"size": 1, "query": {"term": {"event.action": action}}, "sort": [{"@timestamp": "asc"}]},
        timeout=30,
    )
    hits = response.json().get("hits", {}).get("hits", [])
    return hits[0]["_source"] if hits else {}


def test_fabric_manager_and_bmc_sel_lines_arrive_parsed(log_stack: LogStack) -> None:
    """The NVSwitch fatal error is in Fabric Manager's log too, and the PSU failure in the BMC's SEL
    (asserted, then deasserted when the PSU is back), each in its class's index."""
    fm_index, sel_index = "fleetsight-logs-fabricmanager-*", "fleetsight-logs-bmc-*"
    fm = wait_until(lambda: first_in(log_stack, fm_index, "nvswitch_fatal"), timeout=240, what="FM line")
    assert fm["host"]["name"] == "n0004" and fm["event"]["dataset"] == "fleetsight.fabricmanager"
    assert (fm["nvidia"]["sxid"]["code"], fm["nvidia"]["sxid"]["switch"], fm["nvidia"]["sxid"]["fatal"]) == (
        24007,
        1,
        True,
    )
    assert fm["nvidia"]["sxid"]["pci_bdf"].startswith("00000000:")
    sel = wait_until(lambda: first_in(log_stack, sel_index, "bmc_sel"), timeout=240, what="SEL line")
    assert sel["host"]["name"] == "n0005"
    assert (sel["bmc"]["sel"]["sensor_type"], sel["bmc"]["sel"]["sensor"]) == ("Power Supply", "PSU1")
    assert (sel["bmc"]["sel"]["event"], sel["bmc"]["sel"]["direction"]) == ("Failure detected", "Asserted")
    assert sel["log"]["level"] == "error"


def search(stack: LogStack, *args: str) -> str:
    result = subprocess.run(
        [*FLEETSIGHT, "logs", "search", *args],
        env={**stack.env(), "COLUMNS": "200"},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_logs_search_answers_simple_questions(log_stack: LogStack) -> None:
    wait_until(
        lambda: {"xid", "cuda_error"} <= actions_indexed(log_stack), timeout=240, what="Xid and CUDA events"
    )
    xids = search(log_stack, "--node", "n0002", "--xid")
    assert "Xid 79 on 0000:" in xids and "fallen_off_bus -> reboot_node" in xids, xids
    assert "n0002" in xids
    errors = search(log_stack, "--job", "5101", "--errors", "--limit", "200")
    assert "cuda_error" in errors and "nccl_timeout" in errors, errors
    assert "5101/" in errors
    nothing = search(log_stack, "--node", "no-such-node")
    assert "0 event(s)" in nothing


def test_logs_search_rejects_a_bad_duration(log_stack: LogStack) -> None:
    result = subprocess.run(
        [*FLEETSIGHT, "logs", "search", "--since", "yesterday"],
        env=log_stack.env(),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "--since 'yesterday'" in result.stderr
