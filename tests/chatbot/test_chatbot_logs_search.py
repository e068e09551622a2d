"""The log-search part of the live context against a real OpenSearch with FleetSight's own index
template (``fleetsight logs apply``): the query is real DSL, the fields are the template's."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from chatbot.answer import Answerer, ChatConfig
from chatbot.live import LiveSources
from fleetsight.settings import REPO_ROOT
from support import StackEnv, free_port_base


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.000Z")


@pytest.fixture(scope="module")
def search_stack() -> Iterator[StackEnv]:
    """OpenSearch runs as an unprivileged user: its run folder must be reachable by it, which pytest's
    private temporary folders are not."""
    base = Path(tempfile.mkdtemp(prefix="fleetsight-chatbot-test-"))
    base.chmod(0o755)
    port_base = free_port_base()
    env = {**os.environ, "FLEETSIGHT_RUN_DIR": str(base / "run"), "FLEETSIGHT_PORT_BASE": str(port_base)}
    stack = StackEnv(base / "run", port_base, env)
    try:
        yield stack
    finally:
        stack.cli("down", "--timeout", "20", check=False)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def search_url(search_stack: StackEnv) -> Iterator[str]:
    search_stack.cli("up", "opensearch", timeout=240)
    url = search_stack.url("opensearch")
    search_stack.cli("logs", "apply", "--skip-kafka", "--url", url, timeout=120)
    now = datetime.now(UTC)
    index = f"fleetsight-logs-kernel-{now:%Y.%m.%d}"
    documents = [
        # n0007: an Xid 79 ten minutes ago, an error-level line, and an info line that must not show.
        {"@timestamp": iso(now - timedelta(minutes=10)), "host": {"name": "n0007"},
         "log": {"level": "warning"},
         "message": "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.",
         "nvidia": {"xid": {"code": 79, "pci_bdf": "0000:18:00.0"}}},
        {"@timestamp": iso(now - timedelta(minutes=5)), "host": {"name": "n0007"}, "log": {"level": "error"},
         "message": "LustreError: 11-0: scratch-OST0004-osc: operation ost_write failed: rc = -107"},
        {"@timestamp": iso(now - timedelta(minutes=1)), "host": {"name": "n0007"}, "log": {"level": "info"},
         "message": "systemd: Started Session 42 of user alice."},
        # Another node's error and an old one of n0007 (two days ago): neither is about n0007 today.
        {"@timestamp": iso(now - timedelta(minutes=2)), "host": {"name": "n0008"}, "log": {"level": "error"},
         "message": "NVRM: Xid 48 on n0008"},
        {"@timestamp": iso(now - timedelta(days=2)), "host": {"name": "n0007"}, "log": {"level": "error"},
         "message": "an error from two days ago"},
    ]  # fmt: skip
    for number, document in enumerate(documents):
        response = httpx.put(
            f"{url}/{index}/_doc/{number}", params={"refresh": "true"}, json=document, timeout=30
        )
        assert response.is_success, response.text
    yield url


def test_recent_errors_and_xids_of_the_node_come_as_evidence(search_url: str) -> None:
    sources = LiveSources(logs_url=search_url, timeout_s=5.0)
    answer = Answerer(ChatConfig(repo_root=REPO_ROOT, live=sources)).answer("n0007 lost a GPU, what now?")
    logs = [e for e in answer.evidence if e["source"] == "logs"]
    summaries = [e["summary"] for e in logs]
    assert len(logs) == 2, summaries
    assert summaries[0].startswith("n0007: LustreError")  # newest first
    assert summaries[1].startswith("n0007: Xid 79:")
    assert all(e["time"] and e["url"].startswith(search_url) for e in logs)
    assert answer.notes == []
    # The question alone is too vague to answer; with the node's Xid 79 it is the fallen-off-the-bus runbook.
    assert answer.cited_files[0] == "docs/runbooks/GPUFellOffBus.md"


def test_a_node_without_recent_errors_adds_no_log_evidence(search_url: str) -> None:
    sources = LiveSources(logs_url=search_url, timeout_s=5.0)
    answer = Answerer(ChatConfig(repo_root=REPO_ROOT, live=sources)).answer("n0099 GPU is running hot")
    assert [e for e in answer.evidence if e["source"] == "logs"] == [] and answer.notes == []
