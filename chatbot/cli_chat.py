"""``fleetsight chat "question"``: ask from the terminal, in-process or through a running service."""

from __future__ import annotations

import json
import os
from typing import Any

import click
import httpx

from fleetsight.settings import Settings

TOKEN_ENV = "FLEETSIGHT_CHATBOT_TOKEN"  # a token with scope ask, for --url (never on the command line)


def local_url(settings: Settings, port_name: str) -> str | None:
    """The local stack's URL of a service, or None when no component declares it."""
    try:
        return settings.url(port_name)
    except KeyError:
        return None


def print_answer(body: dict[str, Any]) -> None:
    click.echo(body["answer"])
    if body["citations"]:
        click.echo("\nSources:")
        for citation in body["citations"]:
            click.echo(f"  [{citation['n']}] {citation['file']}#{citation['anchor']} ({citation['section']})")
    for note in body.get("notes", []):
        if f"Note: {note}" not in body["answer"]:
            click.echo(f"note: {note}", err=True)


@click.command(name="chat", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("question", nargs=-1, required=True)
@click.option(
    "--url", help="Ask a running chatbot service (e.g. http://127.0.0.1:19142) instead of in-process."
)
@click.option(
    "--no-live", is_flag=True, help="Answer from the runbooks only (no health/anomaly/log look-ups)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the whole answer as JSON.")
def cli(question: tuple[str, ...], url: str | None, no_live: bool, as_json: bool) -> None:
    """Ask the runbook chatbot a question; the answer cites the runbooks it quotes.

    In-process, live state comes from the local stack's health and anomaly services (when they run).
    With --url, a service that needs a token gets $FLEETSIGHT_CHATBOT_TOKEN (scope ask).

    \b
    Examples:
      fleetsight chat "what does Xid 79 mean for my job"
      fleetsight chat why is job 4711 slow
      fleetsight chat --url http://chatbot:19142 --json "my loss went NaN"
    """
    text = " ".join(question)
    if url:
        try:
            token = os.environ.get(TOKEN_ENV)
            response = httpx.post(
                f"{url.rstrip('/')}/v1/ask",
                json={"question": text, "live": not no_live},
                headers={"Authorization": f"Bearer {token}"} if token else {},
                timeout=60,
            )
        except httpx.HTTPError as exc:
            raise click.ClickException(f"the chatbot at {url} did not answer: {exc}") from exc
        if not response.is_success:
            raise click.ClickException(
                f"HTTP {response.status_code}: {response.json().get('detail', response.text)}"
            )
        body = response.json()
    else:
        from .answer import Answerer, QuestionError
        from .config import chat_config

        settings = Settings()
        config = chat_config(
            health_url=local_url(settings, "health"),
            anomaly_url=local_url(settings, "anomaly"),
            logs_url=local_url(settings, "opensearch"),
            live_timeout=1.0,
        )
        try:
            body = Answerer(config).answer(text, live=not no_live).as_dict()
        except QuestionError as exc:
            raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(body, indent=2))
    else:
        print_answer(body)
