"""Live context from real HTTP servers speaking the health, anomaly and log-search routes (and the
cases where they do not answer), and the optional language model behind a real OpenAI-compatible
endpoint: used when it answers well, refused with an extractive fallback when it does not."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from chatbot_helpers import (
    ClusterState,
    ModelBehaviour,
    anomaly_app,
    health_app,
    logs_app,
    openai_app,
    psu_failure_state,
    serve_in_thread,
)
from fastapi import FastAPI, Request

from chatbot.answer import Answerer, ChatConfig
from chatbot.evaluate import citation_valid
from chatbot.live import LiveSources, find_jobs, find_nodes
from chatbot.llm import LLMConfig
from chatbot.service import create_app
from chatbot.slack import sign
from fleetsight.settings import REPO_ROOT
from support import free_port, wait_until


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[ClusterState, LiveSources]]:
    state = psu_failure_state()
    with (
        serve_in_thread(health_app(state)) as health,
        serve_in_thread(anomaly_app(state)) as anomaly,
        serve_in_thread(logs_app(state)) as logs,
    ):
        yield state, LiveSources(health_url=health, anomaly_url=anomaly, logs_url=logs, timeout_s=1.0)


@pytest.fixture(scope="module")
def model() -> Iterator[tuple[ModelBehaviour, str]]:
    behaviour = ModelBehaviour()
    with serve_in_thread(openai_app(behaviour)) as url:
        yield behaviour, f"{url}/v1"


def test_nodes_and_job_ids_are_recognised_in_questions() -> None:
    assert find_jobs("why is job 4711 slow?") == ["4711"]
    assert find_jobs("jobid=12345_7 died") == ["12345_7"]
    assert find_jobs("my loss went NaN") == []
    assert find_nodes("is n0007 healthy? and gpu-node-07") == ["n0007", "gpu-node-07"]
    assert find_nodes("what does Xid 79 mean on an H100 with PCIe gen5 x16") == []
    assert find_nodes("ssh into node r12c3 fails") == ["r12c3"]


def test_slow_job_answer_names_the_straggler_its_health_and_the_runbook(
    cluster: tuple[ClusterState, LiveSources],
) -> None:
    """The issue's example: job 4711 slow -> n0007 flagged (power brake, PSU2 failed) -> PSUFailed."""
    state, sources = cluster
    answer = Answerer(ChatConfig(repo_root=REPO_ROOT, live=sources)).answer("why is job 4711 slow?")
    assert not answer.declined
    by_source = {e["source"]: e for e in answer.evidence}
    assert by_source["anomaly"]["subject"] == "job 4711" and "n0007" in by_source["anomaly"]["summary"]
    assert by_source["anomaly"]["time"] == "2026-11-23T10:03:10Z"
    assert "PSU2 failed" in by_source["health"]["summary"] and by_source["health"]["url"].endswith(
        "/v1/nodes/n0007"
    )
    assert "PSU2 LossOfInput" in by_source["logs"]["summary"]
    assert "docs/runbooks/PSUFailed.md" in answer.cited_files[:3]
    assert "docs/runbooks/StragglerNode.md" in answer.cited_files[:3]
    assert "Live (anomaly at 2026-11-23T10:03:10Z): job 4711: node n0007" in answer.text
    assert all(citation_valid(REPO_ROOT, c.file, c.section, c.quote) for c in answer.citations)
    assert {"anomaly 4711", "health n0007"} <= set(state.requests)


def test_a_healthy_node_and_an_unknown_job_are_reported_as_such(
    cluster: tuple[ClusterState, LiveSources],
) -> None:
    _, sources = cluster
    answerer = Answerer(ChatConfig(repo_root=REPO_ROOT, live=sources))
    answer = answerer.answer("job 999 on n0003 hangs in all-reduce until NCCL times out")
    assert "anomaly service: job 999 is not running (no recent data)" in answer.notes
    assert any(e["summary"] == "n0003 is healthy" for e in answer.evidence)
    assert "docs/runbooks/NCCLTimeout.md" in answer.cited_files
    unknown = answerer.answer("is n0999 broken? the GPU fell off the bus")
    assert "health service does not know node n0999" in unknown.notes
    # Nothing in the runbooks for the question itself: the live state is the answer, said as such.
    state_only = answerer.answer("is n0003 ok?")
    assert state_only.declined and state_only.text.startswith("Live (health")
    assert "n0003 is healthy" in state_only.text and "could not find" not in state_only.text


def test_unreachable_services_are_named_and_the_runbooks_still_answer() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    sources = LiveSources(health_url=dead, anomaly_url=dead, logs_url=dead, timeout_s=1.0)
    answer = Answerer(ChatConfig(repo_root=REPO_ROOT, live=sources)).answer("why is job 4711 slow?")
    assert not answer.declined and answer.citations
    assert any(n.startswith(f"anomaly service unreachable at {dead}") for n in answer.notes)
    assert "live state not included" in answer.text
    # The job was asked of the health service (its faults) and the anomaly service (its stragglers);
    # both down, no node was learnt: the logs were not asked, and the health service only once.
    assert [n.split(" unreachable")[0] for n in answer.notes] == ["health service", "anomaly service"]


def test_a_health_service_that_times_out_is_reported_as_timing_out(
    cluster: tuple[ClusterState, LiveSources],
) -> None:
    state, sources = cluster
    state.delay_s = 3.0
    try:
        answer = Answerer(ChatConfig(repo_root=REPO_ROOT, live=sources)).answer("n0007 GPU power brake is on")
    finally:
        state.delay_s = 0.0
    assert any(n.startswith("health service timed out") for n in answer.notes)
    assert answer.citations and "docs/runbooks/GPUPowerBrakeActive.md" in answer.cited_files


def llm_answerer(url: str, timeout_s: float = 5.0) -> Answerer:
    return Answerer(ChatConfig(repo_root=REPO_ROOT, llm=LLMConfig(url, "test-model", "sk-test", timeout_s)))


def test_model_answer_is_used_with_the_passages_it_cites(model: tuple[ModelBehaviour, str]) -> None:
    behaviour, url = model
    behaviour.mode = "answer"
    answer = llm_answerer(url).answer("what does Xid 79 mean for my job")
    assert answer.mode == "llm" and "[1]" in answer.text
    assert [c.n for c in answer.citations] == [1, 2]
    request = behaviour.requests[-1]
    assert request["authorization"] == "Bearer sk-test" and request["body"]["model"] == "test-model"
    prompt = request["body"]["messages"][1]["content"]
    assert "[1] docs/runbooks/GPUFellOffBus.md" in prompt  # the model sees the numbered passages


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("slow", "timed out after 0.5s"),
        ("invent", "commands the runbooks do not contain"),
        ("bad_citation", "do not exist"),
        ("error", "HTTP 500"),
    ],
)
def test_model_failures_fall_back_to_quoting_and_say_so(
    model: tuple[ModelBehaviour, str], mode: str, reason: str
) -> None:
    behaviour, url = model
    behaviour.mode = mode
    answer = llm_answerer(url, timeout_s=0.5).answer("what does Xid 79 mean for my job")
    assert answer.mode == "extractive-fallback"
    assert any(reason in note and "language model not used" in note for note in answer.notes), answer.notes
    assert "language model not used" in answer.text
    assert answer.cited_files[0] == "docs/runbooks/GPUFellOffBus.md"
    assert all(citation_valid(REPO_ROOT, c.file, c.section, c.quote) for c in answer.citations)


def test_unreachable_model_falls_back_too() -> None:
    answer = llm_answerer(f"http://127.0.0.1:{free_port()}/v1").answer(
        "symbol errors keep rising on an IB port"
    )
    assert answer.mode == "extractive-fallback" and "unreachable" in answer.notes[-1]


def test_slack_with_a_model_acknowledges_at_once_and_posts_the_answer_to_response_url(
    model: tuple[ModelBehaviour, str],
) -> None:
    """A model may take longer than Slack's 3 s: the command is acknowledged, the answer follows."""
    behaviour, url = model
    behaviour.mode = "answer"
    posted: list[dict[str, Any]] = []
    receiver = FastAPI()

    @receiver.post("/commands/T1/1/abc")
    async def response_url(request: Request) -> dict[str, bool]:
        posted.append(await request.json())
        return {"ok": True}

    config = ChatConfig(repo_root=REPO_ROOT, llm=LLMConfig(url, "test-model", None, 5.0))
    with serve_in_thread(receiver) as slack_url, serve_in_thread(create_app(config, "s3cret")) as chatbot:
        body = urlencode(
            {"text": "what does Xid 79 mean for my job", "response_url": f"{slack_url}/commands/T1/1/abc"}
        )
        now = str(int(time.time()))
        headers = {
            "X-Slack-Request-Timestamp": now,
            "X-Slack-Signature": sign("s3cret", now, body.encode()),
            "Content-Type": "application/x-www-form-urlencoded",
        }
        ack = httpx.post(f"{chatbot}/slack/command", content=body, headers=headers, timeout=10)
        assert ack.status_code == 200 and ack.json()["response_type"] == "ephemeral"
        wait_until(lambda: posted, timeout=20, what="the answer posted to response_url")
    assert posted[0]["response_type"] == "in_channel"
    assert "fell off the bus" in posted[0]["text"] and "GPUFellOffBus.md" in posted[0]["text"]


def test_a_health_api_that_needs_a_token_gets_it_or_is_reported(
    cluster: tuple[ClusterState, LiveSources],
) -> None:
    state, sources = cluster
    state.read_token = "r3ad"
    try:
        refused = Answerer(ChatConfig(repo_root=REPO_ROOT, live=sources)).answer("is n0007 ok? PSU failed")
        with_token = dataclasses.replace(sources, health_token="r3ad")
        allowed = Answerer(ChatConfig(repo_root=REPO_ROOT, live=with_token)).answer("is n0007 ok? PSU failed")
    finally:
        state.read_token = None
    assert any("HTTP 401" in n and "FLEETSIGHT_CHATBOT_HEALTH_TOKEN" in n for n in refused.notes), (
        refused.notes
    )
    assert any(e["source"] == "health" and "PSU2 failed" in e["summary"] for e in allowed.evidence)


def test_a_vague_question_is_answered_from_what_the_node_reports(
    cluster: tuple[ClusterState, LiveSources],
) -> None:
    """ "is n0004 ok?" says nothing by itself; the health reason (dcgm not scraped) finds the runbooks.
    The reason's own runbook is not written: it is not pointed at."""
    _, sources = cluster
    answer = Answerer(ChatConfig(repo_root=REPO_ROOT, live=sources)).answer("is n0004 ok?")
    assert not answer.declined
    assert (
        "Live (health at 2026-11-23T07:29:46Z): n0004 is degraded: Prometheus cannot scrape dcgm"
        in answer.text
    )
    assert "exporter_unreachable" not in answer.text
    assert {"docs/runbooks/ExporterDown.md", "docs/runbooks/NodeDown.md"} & set(answer.cited_files[:2])


def test_a_health_answer_of_the_wrong_shape_is_reported_not_fatal(
    cluster: tuple[ClusterState, LiveSources],
) -> None:
    _, sources = cluster
    answer = Answerer(ChatConfig(repo_root=REPO_ROOT, live=sources)).answer("n0666 IB port down")
    assert any(n.startswith("health service at http") and "unreadable" in n for n in answer.notes), (
        answer.notes
    )
    assert "docs/runbooks/InfiniBandPortDown.md" in answer.cited_files
