"""An optional language model behind an OpenAI-compatible chat-completions endpoint (vLLM, Ollama,
llama.cpp server, ...): ``POST {base_url}/chat/completions``.

The model only sees the retrieved passages and must cite them as [n]. Its answer is refused (and the
chatbot falls back to quoting the runbooks) when the endpoint fails or times out, when it cites no
passage or one that does not exist, or when it writes a command (a `code span` or a fenced line) that
none of the passages contains: the chatbot never hands out an invented command.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from .live import shared_client

if TYPE_CHECKING:
    from .answer import Citation

CITE = re.compile(r"\[(\d+)\]")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCED = re.compile(r"```[^\n]*\n(.*?)```", re.DOTALL)
SYSTEM_PROMPT = (
    "You are FleetSight's runbook assistant for a GPU training cluster. Answer ONLY from the numbered "
    "passages and the live facts given. Cite every statement with its passage number in square brackets, "
    "e.g. [1]. Copy commands exactly as they appear in the passages; never write a command that is not in "
    "them. If the passages do not answer the question, say so. Be brief: a few sentences and the steps."
)


class LLMError(RuntimeError):
    """The model could not be used for this answer; the message says why."""


@dataclass(frozen=True)
class LLMConfig:
    url: str  # base URL, e.g. http://127.0.0.1:8000/v1
    model: str
    api_key: str | None = None
    timeout_s: float = 20.0
    max_tokens: int = 600

    @classmethod
    def from_env(cls) -> LLMConfig | None:
        """FLEETSIGHT_CHATBOT_LLM_URL / _MODEL / _KEY (or _KEY_FILE) / _TIMEOUT; None without a URL."""
        url = os.environ.get("FLEETSIGHT_CHATBOT_LLM_URL")
        if not url:
            return None
        key = os.environ.get("FLEETSIGHT_CHATBOT_LLM_KEY")
        key_file = os.environ.get("FLEETSIGHT_CHATBOT_LLM_KEY_FILE")
        if not key and key_file:
            key = open(key_file, encoding="utf-8").read().strip()  # noqa: SIM115 - read once
        return cls(
            url=url.rstrip("/"),
            model=os.environ.get("FLEETSIGHT_CHATBOT_LLM_MODEL", "default"),
            api_key=key,
            timeout_s=float(os.environ.get("FLEETSIGHT_CHATBOT_LLM_TIMEOUT", "20")),
        )


def build_messages(
    question: str, passages: list[tuple[Citation, str]], live: list[str]
) -> list[dict[str, str]]:
    blocks = [f"[{c.n}] {c.file} — {c.section}\n{text}" for c, text in passages]
    facts = "\n".join(live) if live else "none"
    user = "Passages:\n\n" + "\n\n".join(blocks) + f"\n\nLive facts:\n{facts}\n\nQuestion: {question}"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def invented_commands(text: str, passages: list[tuple[Citation, str]]) -> list[str]:
    """Code the model wrote that no passage contains (whitespace-insensitive)."""
    corpus = re.sub(r"\s+", " ", " ".join(p for _, p in passages))
    snippets = [
        *CODE_SPAN.findall(text),
        *(line for block in FENCED.findall(text) for line in block.splitlines()),
    ]
    return [s for s in snippets if s.strip() and re.sub(r"\s+", " ", s.strip()) not in corpus]


def ask_llm(
    config: LLMConfig, question: str, passages: list[tuple[Citation, str]], live: list[str]
) -> tuple[str, set[int]]:
    """(the model's answer, the passage numbers it cites); raises LLMError when it is not usable."""
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    body: dict[str, Any] = {
        "model": config.model,
        "messages": build_messages(question, passages, live),
        "temperature": 0,
        "max_tokens": config.max_tokens,
    }
    try:
        response = shared_client(config.timeout_s).post(
            f"{config.url}/chat/completions", json=body, headers=headers
        )
    except httpx.TimeoutException as exc:
        raise LLMError(f"the endpoint {config.url} timed out after {config.timeout_s:g}s") from exc
    except httpx.HTTPError as exc:
        raise LLMError(f"the endpoint {config.url} is unreachable ({type(exc).__name__})") from exc
    if not response.is_success:
        raise LLMError(f"the endpoint {config.url} answered HTTP {response.status_code}")
    try:
        text = response.json()["choices"][0]["message"]["content"].strip()
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise LLMError("the endpoint's reply is not a chat completion") from exc
    numbers = {c.n for c, _ in passages}
    cited = {int(n) for n in CITE.findall(text)}
    if not cited:
        raise LLMError("the model cited no passage")
    if cited - numbers:
        raise LLMError(f"the model cited passages that do not exist: {sorted(cited - numbers)}")
    invented = invented_commands(text, passages)
    if invented:
        raise LLMError(f"the model wrote commands the runbooks do not contain: {invented[:2]}")
    return text, cited
