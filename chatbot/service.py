"""The chatbot service: ``POST /v1/ask`` (JSON), a web chat page at ``/``, the cited files at
``/files/<path>``, and Slack's slash command at ``POST /slack/command``.

Nothing here writes: every route reads (the page, the files, the status) or asks (an answer built from
the runbooks and live reads). Asking needs a token with scope ``ask`` unless the deployment opens it,
reads need scope ``read`` unless open (chatbot/access.py); every caller's asks are rate-limited, every
answer has a deadline, and bodies are capped before they are read (fleetsight/auth.py)."""

from __future__ import annotations

import html
import logging
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import anyio
import httpx
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field

from fleetsight import auth

from . import slack
from .access import ASK, Access, RateLimiter, retry_after
from .answer import MAX_QUESTION_CHARS, Answer, Answerer, ChatConfig, QuestionError
from .index import split_sections
from .live import shared_client
from .metrics import ChatMetrics

log = logging.getLogger("chatbot.service")

STATIC = Path(__file__).resolve().parent / "static"
# A slash command's whole form body is small; refuse bigger ones before parsing them.
MAX_SLACK_BODY = 16 * 1024
# What the chatbot's API answers besides success (its OpenAPI schema, for clients and the fuzz).
RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"description": "The question is empty"},
    **auth.ERROR_RESPONSES,
    429: {"description": "This caller asked too often; Retry-After says when to ask again"},
    504: {"description": "The answer took longer than the service's deadline"},
}


class AskRequest(BaseModel):
    question: str = Field(description=f"The question, 1 to {MAX_QUESTION_CHARS} characters")
    live: bool = Field(True, description="Add live state (health, stragglers, logs) for nodes and jobs named")


class AskResponse(BaseModel):
    question: str
    answer: str
    declined: bool
    mode: str = Field(description="extractive, llm, extractive-fallback or declined")
    citations: list[dict[str, Any]] = Field(description="n, file, section, anchor, quote, score")
    evidence: list[dict[str, Any]] = Field(description="source, url, subject, summary, time, runbook")
    notes: list[str]
    closest: list[str] = Field(description="when declined: the closest runbooks")
    took_ms: float


def render_file(path: Path, relative: str, title: str) -> str:
    """A cited file as a small HTML page with one anchor per section (the citation links' targets)."""
    parts = [f"<!doctype html><meta charset=utf-8><title>{html.escape(title)}</title>"]
    parts.append('<link rel=icon href="data:,"><link rel=stylesheet href=/static/chat.css><main class=file>')
    parts.append(f"<p><a href=/>&larr; chat</a> · <code>{html.escape(relative)}</code></p>")
    for section in split_sections(path, relative):
        tag = "h1" if section.heading == section.page else "h2"
        parts.append(f"<{tag} id='{html.escape(section.anchor)}'>{html.escape(section.heading)}</{tag}>")
        parts.append(f"<pre>{html.escape(section.text)}</pre>")
    parts.append("</main>")
    return "\n".join(parts)


def post_to_response_url(url: str, payload: dict[str, Any]) -> None:
    try:
        httpx.post(url, json=payload, timeout=10).raise_for_status()
    except httpx.HTTPError as exc:
        log.warning("event=slack_response_failed error=%r", type(exc).__name__)


def create_app(
    config: ChatConfig,
    slack_secret: str | None = None,
    public_url: str | None = None,
    access: Access | None = None,
) -> FastAPI:
    """The service around one :class:`Answerer` (its index is built here, at start-up). ``access``
    defaults to the command's defaults: reads open, asks need a token, 20 asks a minute per caller."""
    access = access or Access()
    withheld = tuple(v for v in (slack_secret, *access.tokens) if v)
    config = replace(config, withheld=(*config.withheld, *withheld))
    answerer = Answerer(config)
    # Build the HTTP clients now: the first one loads the TLS trust store (~0.5 s), not a question's job.
    shared_client(config.live.timeout_s)
    if config.llm is not None:
        shared_client(config.llm.timeout_s)
    app = FastAPI(
        title="FleetSight chatbot",
        version="1",
        description="Answers from the runbooks and the cluster's live state, always with citations.",
        responses=RESPONSES,
    )
    app.add_middleware(auth.BodyLimit)
    app.state.answerer = answerer
    metrics = ChatMetrics(answerer.index)
    guard = access.guard()
    limiter = RateLimiter(access.rate) if access.rate else None
    reader = [Depends(guard.require(auth.READ))]
    ask_scope = guard.require(ASK)

    def limit(caller: str) -> float:
        """0, or the seconds this caller must wait (counted in the metrics)."""
        wait = limiter.take(caller) if limiter else 0.0
        if wait:
            metrics.rate_limited.inc()
        return wait

    async def asker(request: Request) -> str:
        """An ask with scope ``ask`` (or open asks), within the caller's rate (token, else address)."""
        await ask_scope(request)
        caller = auth.caller_identity(request)
        wait = limit(caller)
        if wait:
            raise HTTPException(
                429,
                f"too many questions from this caller: at most {access.rate} (ask again in "
                f"{retry_after(wait)} s)",
                {"Retry-After": retry_after(wait)},
            )
        return caller

    def answer(question: str, live: bool = True) -> Answer:
        result = answerer.answer(question, live=live)
        metrics.record(result)
        return result

    def ask_or_4xx(question: str, live: bool = True) -> dict[str, Any]:
        try:
            return answer(question, live=live).as_dict()
        except QuestionError as exc:
            status = 413 if len(question) > MAX_QUESTION_CHARS else 400
            raise HTTPException(status, str(exc)) from exc

    @app.get("/", include_in_schema=False)
    def chat_page() -> HTMLResponse:
        return HTMLResponse((STATIC / "chat.html").read_text(encoding="utf-8"))

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> FileResponse:
        path = (STATIC / name).resolve()
        if path.parent != STATIC or not path.is_file():
            raise HTTPException(404, "no such file")
        return FileResponse(path)

    # A read (with --token-reads, Prometheus scrapes with a read token: authorization.credentials_file).
    @app.get("/metrics", include_in_schema=False, dependencies=reader)
    def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post(
        "/v1/ask",
        response_model=AskResponse,
        summary="Ask a question; the answer with citations (scope: ask)",
        dependencies=[Depends(asker)],
    )
    async def ask(body: AskRequest) -> dict[str, Any]:
        # The answer runs in a worker thread under a deadline; a thread past it is left to finish on
        # its own (its live look-ups and model call have their own timeouts), the caller gets 504.
        try:
            with anyio.fail_after(access.ask_timeout_s):
                return await anyio.to_thread.run_sync(
                    ask_or_4xx, body.question, body.live, abandon_on_cancel=True
                )
        except TimeoutError:
            log.warning("event=ask_timeout deadline_s=%g", access.ask_timeout_s)
            raise HTTPException(
                504, f"the answer took longer than {access.ask_timeout_s:g} s; ask again, or without live"
            ) from None

    @app.get(
        "/v1/status",
        summary="The index (files, sections, builds) and the configured sources (scope: read)",
        dependencies=reader,
    )
    def status() -> dict[str, Any]:
        index = answerer.index
        index.refresh()
        live = config.live
        return {
            "files": len({s.file for s in index.sections}),
            "sections": len(index.sections),
            "index_builds": index.builds,
            "index_build_seconds": round(index.build_seconds, 4),
            "live": {"health": live.health_url, "anomaly": live.anomaly_url, "logs": live.logs_url},
            "llm": {"url": config.llm.url, "model": config.llm.model} if config.llm else None,
            "slack": slack_secret is not None,
        }

    @app.get("/files/{file:path}", include_in_schema=False, dependencies=reader)
    def cited_file(file: str) -> HTMLResponse:
        """Only files the index holds are served (no path walking)."""
        sections = answerer.index.file_sections(file)
        if not sections:
            raise HTTPException(404, f"{file} is not one of the chatbot's documents")
        return HTMLResponse(render_file(config.repo_root / file, file, sections[0].page))

    @app.post("/slack/command", summary="Slack slash command (signed by Slack; answers in the channel)")
    async def slack_command(request: Request) -> JSONResponse:
        if slack_secret is None:
            raise HTTPException(503, "Slack is not configured: set FLEETSIGHT_SLACK_SIGNING_SECRET(_FILE)")
        body = await request.body()
        if len(body) > MAX_SLACK_BODY:
            raise HTTPException(413, f"request body over {MAX_SLACK_BODY} bytes")
        try:
            slack.verify(slack_secret, dict(request.headers), body)
        except slack.SignatureError as exc:
            metrics.slack.labels("refused").inc()
            log.warning("event=slack_refused reason=%r", str(exc))
            raise HTTPException(401, f"Slack signature check failed: {exc}") from exc
        form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", errors="replace")).items()}
        # Slack's caller is its workspace user (the request's address is Slack's); a user over the
        # limit is told so in Slack, ephemerally (Slack shows a bare 429 as "failed").
        wait = limit(f"slack:{form.get('team_id', '')}:{form.get('user_id', '')}")
        if wait:
            text = f"Too many questions: ask again in {retry_after(wait)} s."
            return JSONResponse({"response_type": "ephemeral", "text": text})
        question = form.get("text", "").strip()
        if not question or len(question) > MAX_QUESTION_CHARS:
            metrics.slack.labels("invalid").inc()
        if not question:
            raise HTTPException(
                400, "empty question: type it after the command, e.g. /fleetsight my loss went NaN"
            )
        if len(question) > MAX_QUESTION_CHARS:
            raise HTTPException(413, f"question over {MAX_QUESTION_CHARS} characters: ask about one symptom")
        response_url = form.get("response_url", "")
        if config.llm is not None and response_url.startswith(("https://", "http://")):
            # A model may take longer than Slack's 3 s: acknowledge now, answer through response_url.
            def later() -> None:
                try:
                    reply = answer(question)
                except Exception:  # a thread's failure would go unseen: log it, the service goes on
                    log.exception("event=slack_answer_failed")
                    return
                post_to_response_url(response_url, slack.message(reply, public_url))

            metrics.slack.labels("answered").inc()
            threading.Thread(target=later, daemon=True).start()
            return JSONResponse({"response_type": "ephemeral", "text": f"Looking into: {question}"})
        metrics.slack.labels("answered").inc()
        return JSONResponse(slack.message(answer(question), public_url))

    return app
