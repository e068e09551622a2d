"""The service as it runs in the stack (``fleetsight chatbot serve`` in its own process): the JSON API,
the cited files, Slack's signed slash command, and the chat page in a real headless Chromium."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import httpx
import pytest
from chatbot_helpers import anomaly_app, health_app, psu_failure_state, serve_in_thread
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from browser import console_errors, headless_chromium
from chatbot.answer import MAX_QUESTION_CHARS
from chatbot.evaluate import citation_valid
from chatbot.slack import sign
from fleetsight.procs import kill_group
from fleetsight.settings import REPO_ROOT
from support import FLEETSIGHT, StackEnv, free_port, wait_until

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
SCREENSHOT = os.environ.get("FLEETSIGHT_CHATBOT_SCREENSHOT")  # set to refresh docs/images/chatbot.png


@pytest.fixture(scope="module")
def chatbot_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    state = psu_failure_state()
    port = free_port()
    log = tmp_path_factory.mktemp("chatbot") / "chatbot.log"
    with serve_in_thread(health_app(state)) as health, serve_in_thread(anomaly_app(state)) as anomaly:
        env = {**os.environ, "FLEETSIGHT_SLACK_SIGNING_SECRET": SECRET}
        env.pop("FLEETSIGHT_CHATBOT_LLM_URL", None)
        with log.open("w") as out:
            process = subprocess.Popen(
                [*FLEETSIGHT, "chatbot", "serve", "--listen", f"127.0.0.1:{port}", "--health-url", health,
                 "--anomaly-url", anomaly, "--public-url", f"http://127.0.0.1:{port}", "--open-asks",
                 "--rate-limit", "off"],
                cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            if process.poll() is not None:
                pytest.fail(f"chatbot exited {process.returncode}:\n{log.read_text()}")
            try:
                return httpx.get(f"{url}/healthz", timeout=1).is_success
            except httpx.HTTPError:
                return False

        wait_until(ready, timeout=60, what="chatbot service ready")
        try:
            yield url
        finally:
            process.terminate()  # uvicorn stops on SIGTERM; the whole group if it does not
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                kill_group(process.pid)
                process.wait()


def test_ask_returns_answer_citations_and_evidence(chatbot_url: str) -> None:
    response = httpx.post(f"{chatbot_url}/v1/ask", json={"question": "why is job 4711 slow?"}, timeout=10)
    assert response.status_code == 200
    body = response.json()
    assert body["mode"] == "extractive" and not body["declined"]
    assert {"anomaly", "health"} <= {e["source"] for e in body["evidence"]}
    assert "docs/runbooks/PSUFailed.md" in [c["file"] for c in body["citations"]]
    for citation in body["citations"]:
        assert citation_valid(REPO_ROOT, citation["file"], citation["section"], citation["quote"])
    assert "/v1/ask" in httpx.get(f"{chatbot_url}/openapi.json", timeout=5).json()["paths"]


@pytest.mark.parametrize(
    ("question", "status", "detail"),
    [("", 400, "empty"), ("  ", 400, "empty"), ("why " * MAX_QUESTION_CHARS, 413, "limit")],
)
def test_ask_refuses_empty_and_oversized_questions(
    chatbot_url: str, question: str, status: int, detail: str
) -> None:
    response = httpx.post(f"{chatbot_url}/v1/ask", json={"question": question}, timeout=10)
    assert response.status_code == status and detail in response.json()["detail"]


def test_declined_answer_lists_closest_runbooks(chatbot_url: str) -> None:
    body = httpx.post(
        f"{chatbot_url}/v1/ask", json={"question": "write me a poem about GPUs"}, timeout=10
    ).json()
    assert body["declined"] and body["citations"] == [] and body["closest"]
    nothing = httpx.post(
        f"{chatbot_url}/v1/ask", json={"question": "what is the capital of France"}, timeout=10
    )
    assert nothing.json()["closest"] == [] and "No runbook shares a word" in nothing.json()["answer"]


def test_cited_files_are_served_and_nothing_else(chatbot_url: str) -> None:
    page = httpx.get(f"{chatbot_url}/files/docs/runbooks/PSUFailed.md", timeout=5)
    assert page.status_code == 200 and "id='what-to-do'" in page.text
    for path in (
        "/files/pyproject.toml",
        "/files/docs/../pyproject.toml",
        "/files/secrets/thanos-s3.env.example",
    ):
        assert httpx.get(f"{chatbot_url}{path}", timeout=5).status_code == 404


def slack_post(url: str, body: bytes, timestamp: str, signature: str | None = None) -> httpx.Response:
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        "X-Slack-Request-Timestamp": timestamp,
        "X-Slack-Signature": signature or sign(SECRET, timestamp, body),
    }
    return httpx.post(f"{url}/slack/command", content=body, headers=headers, timeout=10)


def slack_form(text: str) -> bytes:
    return urlencode({"command": "/fleetsight", "text": text, "user_id": "U1", "channel_id": "C1"}).encode()


def test_slack_command_with_a_valid_signature_answers_in_the_channel(chatbot_url: str) -> None:
    response = slack_post(chatbot_url, slack_form("what does Xid 79 mean for my job"), str(int(time.time())))
    assert response.status_code == 200
    body = response.json()
    assert body["response_type"] == "in_channel"
    assert f"<{chatbot_url}/files/docs/runbooks/GPUFellOffBus.md#what-it-means|" in body["text"]


@pytest.mark.parametrize("case", ["bad signature", "stale", "no headers", "other secret"])
def test_slack_command_refuses_bad_or_stale_signatures(chatbot_url: str, case: str) -> None:
    body = slack_form("my loss went NaN")
    now = str(int(time.time()))
    if case == "bad signature":
        response = slack_post(chatbot_url, body, now, signature="v0=" + "0" * 64)
    elif case == "stale":
        response = slack_post(chatbot_url, body, str(int(time.time()) - 6 * 60))
    elif case == "other secret":
        response = slack_post(chatbot_url, body, now, signature=sign("another-app-secret", now, body))
    else:
        response = httpx.post(f"{chatbot_url}/slack/command", content=body, timeout=10)
    assert response.status_code == 401
    assert "signature" in response.json()["detail"].lower()


def test_slack_command_refuses_empty_and_oversized_questions(chatbot_url: str) -> None:
    now = str(int(time.time()))
    empty = slack_post(chatbot_url, slack_form("  "), now)
    assert empty.status_code == 400 and "empty question" in empty.json()["detail"]
    long = slack_post(chatbot_url, slack_form("x" * (MAX_QUESTION_CHARS + 1)), now)
    assert long.status_code == 413 and "characters" in long.json()["detail"]


def test_chat_page_in_a_real_browser_shows_answer_and_citation_links(
    chatbot_url: str, tmp_path: Path
) -> None:
    with headless_chromium(width=1100, height=1300) as browser:
        browser.get(chatbot_url + "/")
        wait = WebDriverWait(browser, 20)
        for question in ("write me a poem about GPUs", "why is job 4711 slow?"):
            field = wait.until(expected_conditions.element_to_be_clickable((By.ID, "question")))
            field.send_keys(question)
            before = len(browser.find_elements(By.CSS_SELECTOR, ".exchange"))
            browser.find_element(By.ID, "ask").click()
            wait.until(lambda b, n=before: len(b.find_elements(By.CSS_SELECTOR, ".exchange")) > n)
        latest = browser.find_elements(By.CSS_SELECTOR, ".exchange")[0]
        assert latest.find_element(By.CSS_SELECTOR, ".question").text == "why is job 4711 slow?"
        assert "n0007" in latest.find_element(By.CSS_SELECTOR, ".live").text
        links = latest.find_elements(By.CSS_SELECTOR, "a.citation")
        assert links and any("PSUFailed.md" in link.get_attribute("href") for link in links)
        declined = browser.find_elements(By.CSS_SELECTOR, ".exchange.declined")
        assert declined and declined[0].find_elements(By.CSS_SELECTOR, "a.closest")
        png = browser.get_screenshot_as_png()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        (Path(SCREENSHOT) if SCREENSHOT else tmp_path / "chatbot.png").write_bytes(png)
        # A citation link opens the runbook at the cited section.
        href = links[0].get_attribute("href")
        browser.get(href)
        anchor = href.rsplit("#", 1)[1]
        assert browser.find_element(By.ID, anchor).text
        assert console_errors(browser) == []


def test_chat_command_answers_in_the_terminal_in_process_and_through_the_service(chatbot_url: str) -> None:
    local = subprocess.run(
        [*FLEETSIGHT, "chat", "--no-live", "what does Xid 79 mean for my job"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert local.returncode == 0, local.stderr
    assert "Sources:\n  [1] docs/runbooks/GPUFellOffBus.md#" in local.stdout
    remote = subprocess.run(
        [*FLEETSIGHT, "chat", "--url", chatbot_url, "--json", "why", "is", "job", "4711", "slow?"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert remote.returncode == 0, remote.stderr
    assert any(e["source"] == "anomaly" for e in json.loads(remote.stdout)["evidence"])
    empty = subprocess.run(
        [*FLEETSIGHT, "chat", " "], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert empty.returncode != 0 and "the question is empty" in empty.stderr


def test_fleetsight_up_starts_the_chatbot_with_its_url_in_the_status(stack_env: StackEnv) -> None:
    """Nothing else running: it answers from the runbooks and says the live services are unreachable."""
    stack_env.cli("up", "chatbot", timeout=120)
    url = stack_env.url("chatbot")
    assert url in stack_env.cli("status").stdout.replace("\n", "")
    body = httpx.post(
        f"{url}/v1/ask", json={"question": "is n0007 ok? its IB port is down"}, timeout=10
    ).json()
    assert "docs/runbooks/InfiniBandPortDown.md" in [c["file"] for c in body["citations"]]
    assert any("health service unreachable" in note for note in body["notes"])
    errors = metric_samples(url)
    assert errors['fleetsight_chatbot_live_source_errors_total{source="health"}'] == 1


def metric_samples(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_metrics_count_answers_slack_outcomes_and_the_index(chatbot_url: str) -> None:
    before = metric_samples(chatbot_url)
    httpx.post(f"{chatbot_url}/v1/ask", json={"question": "symbol errors on an IB port"}, timeout=10)
    httpx.post(f"{chatbot_url}/v1/ask", json={"question": "write me a poem about GPUs"}, timeout=10)
    now = str(int(time.time()))
    slack_post(chatbot_url, slack_form("my loss went NaN"), now, signature="v0=" + "0" * 64)
    slack_post(chatbot_url, slack_form(" "), now)
    slack_post(chatbot_url, slack_form("my loss went NaN"), now)
    after = metric_samples(chatbot_url)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert delta('fleetsight_chatbot_answers_total{mode="extractive"}') == 2
    assert delta('fleetsight_chatbot_answers_total{mode="declined"}') == 1
    assert delta("fleetsight_chatbot_answer_duration_seconds_count") == 3
    for outcome in ("refused", "invalid", "answered"):
        assert delta(f'fleetsight_chatbot_slack_requests_total{{outcome="{outcome}"}}') == 1
    assert (
        after["fleetsight_chatbot_index_sections"] > 100
        and after["fleetsight_chatbot_index_builds_total"] >= 1
    )
