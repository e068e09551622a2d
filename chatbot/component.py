"""The chatbot in the local stack: the API, chat page and Slack endpoint, with live context from the
stack's health and anomaly services and its log search (each optional: it answers from the runbooks
when they are not running)."""

from __future__ import annotations

import sys
from pathlib import Path

from fleetsight.components import Component, http_ok, scrape_own_port
from fleetsight.settings import Settings
from fleetsight.setup import InstallStep


def optional_url(settings: Settings, port_name: str) -> list[str]:
    try:
        return [settings.url(port_name)]
    except KeyError:  # that component is not part of this checkout
        return []


def command(settings: Settings) -> list[str]:
    args = [
        sys.executable,
        "-m",
        "fleetsight.cli",
        "chatbot",
        "serve",
        "--listen",
        f"{settings.host}:{settings.port('chatbot')}",
    ]
    for option, port_name in (
        ("--health-url", "health"),
        ("--anomaly-url", "anomaly"),
        ("--logs-url", "opensearch"),
    ):
        for url in optional_url(settings, port_name):
            args += [option, url]
    # The local stack listens on loopback only: asking is open there (production configures tokens).
    return [*args, "--public-url", settings.url("chatbot"), "--open-asks"]


COMPONENTS = [
    Component(
        name="chatbot",
        description="Runbook chatbot: answers with citations and live state (API, chat page, Slack)",
        command=command,
        ready=lambda s: http_ok(s.url("chatbot", "/healthz")),
        urls=lambda s: {"chat": s.url("chatbot", "/"), "api docs": s.url("chatbot", "/docs")},
        scrape_configs=scrape_own_port("fleetsight-chatbot", "chatbot"),
        ready_timeout_s=30.0,
    ),
]

PORTS = {"chatbot": 142}
CLI = {
    "chatbot": (".cli", "the runbook chatbot: serve it, evaluate it on a question set"),
    "chat": (".cli_chat", "ask the runbook chatbot a question from the terminal"),
}
# The headless Chromium that tests the chat page is the "chromium" step dashboards/component.py already
# declares (a step may be declared once).
START_PRIORITY = 70


def _embeddings_current(settings: Settings) -> bool:
    from .install import embeddings_current  # numpy and the index: only when setup asks

    return embeddings_current(settings)


def _embed_runbooks(settings: Settings, log: Path) -> None:
    from .install import embed_runbooks

    embed_runbooks(settings, log)


# The runbooks are embedded by `fleetsight setup`. Every `fleetsight` command loads this declaration, and
# a production install without the chatbot extra has no numpy: the step's code is imported on use.
INSTALL_STEPS = [
    InstallStep(
        name="chatbot-embeddings",
        description="the runbooks' embeddings for the chatbot's dense retrieval (.cache/chatbot/)",
        needed_by="chatbot",
        check=_embeddings_current,
        install=_embed_runbooks,
        eta="~35 s cold on 2 cores; only changed sections later",
    )
]
