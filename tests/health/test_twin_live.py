"""The health service on the live stack with the twin, in real time: the twin's faults go through the
node agent and dcgm-exporter endpoints, Prometheus with the project's rules, and the Alertmanager, into
the health service, which must move the faulty node to the right state with the right reason and back
once the fault clears. The fastest fault only (about 2.5 minutes); every fault kind is measured by
bench/health_twin_faults.py (docs/health.md has its table)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from health_helpers import fast_policy

from chatbot.answer import Answer, Answerer, ChatConfig
from chatbot.evaluate import citation_valid
from chatbot.live import LiveSources
from evaluation.health import Timeline, TwinStack
from fleetsight.settings import REPO_ROOT
from support import free_port_base, wait_until

SCENARIO = Path(__file__).with_name("scenarios") / "live_short.yaml"
AROUND = ("slack-sink", "alertmanager", "exporter-node", "prometheus")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("health-live")
    policy = folder / "policy.yml"
    # 6 nodes in racks of 3: the breaker is tested elsewhere (test_breaker.py); never in the way here
    breaker = {"max_cluster_fraction": 1.0, "max_unit_fraction": 1.0}
    quick = fast_policy(refresh={"interval": "1s"}, hysteresis={"clean_for": "5s"}, circuit_breaker=breaker)
    policy.write_text(yaml.safe_dump(quick))
    stack = TwinStack(folder, SCENARIO, free_port_base(), policy, around=AROUND)
    try:
        stack.start()
        problems = stack.problems()
        assert not problems, f"the stack did not start: {problems}"
        url = stack.settings.url("health", "/v1/nodes")
        samples: dict[str, Timeline] = {}
        # The chatbot asks this twin-fed health service once, while n0002 is out with PSUFailed.
        live_sources = LiveSources(health_url=stack.settings.url("health", ""))
        chatbot = Answerer(ChatConfig(repo_root=REPO_ROOT, live=live_sources))
        answers: list[Answer] = []

        def watch() -> bool:
            body = httpx.get(url, timeout=5).json()
            now = time.time()
            for item in body["nodes"]:
                signals = [r["signal"] for r in item["reasons"] if "last_seen" not in r]
                samples.setdefault(item["node"], Timeline()).samples.append((now, item["state"], signals))
                if item["node"] == "n0002" and "PSUFailed" in signals and not answers:
                    answers.append(chatbot.answer("is n0002 ok? my job on it crawls"))
            faults = stack.faults()
            # Over once n0002 is healthy after the fault's end (healthy before it never counts).
            over = len(faults) == 1 and time.time() > max(f.end for f in faults)
            last = {node: timeline.samples[-1][1] for node, timeline in samples.items()}
            back = bool(faults) and all(last.get(f.node) == "healthy" for f in faults)
            return over and back

        wait_until(watch, timeout=300, interval=1.0, what="the fault to come and go through the stack")
        yield {
            "faults": {f.kind: f for f in stack.faults()},
            "samples": samples,
            "stack": stack,
            "answers": answers,
        }
    finally:
        stack.stop()


def states_of(live: dict[str, Any], node: str, after: float) -> list[tuple[float, str, list[str]]]:
    return [s for s in live["samples"][node].samples if s[0] >= after]


def test_a_psu_failure_drains_its_node_with_psufailed_and_it_comes_back(live: dict[str, Any]) -> None:
    fault = live["faults"]["psu_failure"]
    seen = states_of(live, "n0002", fault.onset)
    bad = [(t, state, signals) for t, state, signals in seen if state != "healthy"]
    assert bad, "n0002 never left healthy"
    assert {state for _, state, _ in bad} <= {"draining", "drained", "repair"}  # busy in job 7301: draining
    assert any("PSUFailed" in signals for _, _, signals in bad)
    assert bad[0][0] - fault.onset < 100  # within the fault
    assert seen[-1][1] == "healthy"


def test_nodes_without_a_fault_stay_healthy(live: dict[str, Any]) -> None:
    for node in ("n0001", "n0003", "n0004", "n0005", "n0006"):
        assert {state for _, state, _ in live["samples"][node].samples} == {"healthy"}, node
    events = httpx.get(live["stack"].settings.url("health", "/v1/events")).json()["events"]
    assert {e["node"] for e in events} == {"n0002"}
    assert [e["to"] for e in events][-1] == "healthy"


def test_the_chatbot_answers_from_the_live_health_state(live: dict[str, Any]) -> None:
    """Asked while n0002 was out, the chatbot gives the health service's state and reason as evidence
    and cites the runbook that the reason names first."""
    assert live["answers"], "n0002 never showed PSUFailed, so the chatbot was not asked"
    answer = live["answers"][0]
    health = [e for e in answer.evidence if e["source"] == "health"]
    assert health and all(e["subject"] == "n0002" for e in health), answer.evidence
    assert any("PSU" in e["summary"] for e in health), health
    assert answer.cited_files[0] == "docs/runbooks/PSUFailed.md", answer.cited_files
    assert all(citation_valid(REPO_ROOT, c.file, c.section, c.quote) for c in answer.citations)
    assert not answer.notes, answer.notes  # the service answered: nothing to excuse
