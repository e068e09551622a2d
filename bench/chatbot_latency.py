"""Answer time of the runbook chatbot without a language model: p50/p95/p99/max per question.

Each printed as one line of figures:

- ``lexical`` / ``dense`` / ``hybrid``: the answer alone (retrieval in that mode and the extractive
  answer), runbooks only, over the development question set (issue 26: p99 < 300 ms on 2 cores);
- ``in-process+live``: with live context from real HTTP servers speaking the health, anomaly and
  log-search routes on loopback (the tests' stand-ins), for questions that name a node or a job;
- ``http``: end to end through ``POST /v1/ask`` of a running service (``--url``), when given.

    .venv/bin/python bench/chatbot_latency.py                  # ~1 min on 2 busy cores
    .venv/bin/python bench/chatbot_latency.py --rounds 20 --url http://127.0.0.1:19142

The targets: p95 < 1 s without a language model (issue 12), p99 < 300 ms per mode (issue 26).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests" / "chatbot"), str(REPO / "tests"), str(REPO)]

from chatbot_helpers import anomaly_app, health_app, logs_app, psu_failure_state, serve_in_thread  # noqa: E402

from chatbot.answer import MODES, Answerer, ChatConfig  # noqa: E402
from chatbot.evaluate import load_questions  # noqa: E402
from chatbot.live import LiveSources  # noqa: E402

QUESTIONS = REPO / "chatbot" / "eval" / "questions.yaml"
LIVE_QUESTIONS = [
    "why is job 4711 slow?",
    "is n0007 healthy? its GPU power brake is on",
    "job 4711 on n0003 hangs in all-reduce until NCCL times out",
]


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def measure(name: str, questions: list[str], rounds: int, ask: Callable[[str], object]) -> None:
    ask(questions[0])  # warm-up: first-use costs (imports, connections) are not the steady state
    times = []
    for _ in range(rounds):
        for question in questions:
            started = time.perf_counter()
            ask(question)
            times.append((time.perf_counter() - started) * 1000)
    print(
        f"{name:18} answers={len(times):5d}  p50={statistics.median(times):7.1f} ms  "
        f"p95={percentile(times, 0.95):7.1f} ms  p99={percentile(times, 0.99):7.1f} ms  "
        f"max={max(times):7.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="passes over the question set")
    parser.add_argument("--url", help="a running chatbot service to measure over HTTP too")
    args = parser.parse_args()

    questions = [entry.question for entry in load_questions(QUESTIONS)]
    started = time.perf_counter()
    answerer = Answerer(ChatConfig(repo_root=REPO))
    index = answerer.index
    print(
        f"index: {len({s.file for s in index.sections})} files, {len(index.sections)} sections, "
        f"built in {(time.perf_counter() - started) * 1000:.0f} ms (answerer start-up included)"
    )
    for mode in MODES:
        moded = Answerer(ChatConfig(repo_root=REPO, mode=mode))
        measure(mode, questions, args.rounds, lambda q, a=moded: a.answer(q, live=False))

    state = psu_failure_state()
    with (
        serve_in_thread(health_app(state)) as health,
        serve_in_thread(anomaly_app(state)) as anomaly,
        serve_in_thread(logs_app(state)) as logs,
    ):
        live = Answerer(ChatConfig(repo_root=REPO, live=LiveSources(health, anomaly, logs, timeout_s=1.0)))
        measure("in-process+live", LIVE_QUESTIONS, args.rounds * 5, live.answer)

    if args.url:
        with httpx.Client(base_url=args.url, timeout=10) as client:
            measure("http", questions, args.rounds, lambda q: client.post("/v1/ask", json={"question": q}))


if __name__ == "__main__":
    main()
