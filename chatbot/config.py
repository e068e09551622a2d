"""Building a :class:`~chatbot.answer.ChatConfig` from command-line options and the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from fleetsight.secrets import SecretFileError, read_secret_file
from fleetsight.settings import REPO_ROOT

from .answer import ChatConfig
from .live import LiveSources
from .llm import LLMConfig

HEALTH_TOKEN_ENV = "FLEETSIGHT_CHATBOT_HEALTH_TOKEN"
# The log search's login, for an Elasticsearch with security on (docker-compose.yml: fleetsight-reader);
# the password only ever from a file.
LOGS_USER_ENV = "FLEETSIGHT_CHATBOT_LOGS_USER"
LOGS_PASSWORD_FILE_ENV = "FLEETSIGHT_CHATBOT_LOGS_PASSWORD_FILE"
LOGS_CA_FILE_ENV = "FLEETSIGHT_CHATBOT_LOGS_CA_FILE"


class ConfigError(ValueError):
    """A setting that cannot work, with what to change."""


def logs_login(environ: Mapping[str, str] = os.environ) -> tuple[str, str] | None:
    user = environ.get(LOGS_USER_ENV)
    if not user:
        return None
    path = environ.get(LOGS_PASSWORD_FILE_ENV)
    if not path:
        raise ConfigError(f"{LOGS_USER_ENV} is set: {LOGS_PASSWORD_FILE_ENV} must name its password file")
    try:
        return user, read_secret_file(path, LOGS_PASSWORD_FILE_ENV)
    except SecretFileError as exc:
        raise ConfigError(str(exc)) from None


def logs_ca_file(environ: Mapping[str, str] = os.environ) -> str | None:
    path = environ.get(LOGS_CA_FILE_ENV)
    if path and not Path(path).is_file():
        raise ConfigError(f"{LOGS_CA_FILE_ENV} {path}: no such file")
    return path or None


def chat_config(
    docs: tuple[Path, ...] = (),
    health_url: str | None = None,
    anomaly_url: str | None = None,
    logs_url: str | None = None,
    llm_url: str | None = None,
    llm_model: str | None = None,
    llm_timeout: float | None = None,
    live_timeout: float = 1.5,
    repo_root: Path = REPO_ROOT,
) -> ChatConfig:
    """Options win over the environment (FLEETSIGHT_CHATBOT_LLM_*); the key only ever comes from the
    environment or a file (FLEETSIGHT_CHATBOT_LLM_KEY / _KEY_FILE)."""
    llm = LLMConfig.from_env()
    if llm_url:
        base = llm or LLMConfig(url=llm_url, model="default")
        llm = LLMConfig(
            url=llm_url.rstrip("/"),
            model=llm_model or base.model,
            api_key=base.api_key,
            timeout_s=llm_timeout if llm_timeout is not None else base.timeout_s,
        )
    elif llm is not None and (llm_model or llm_timeout is not None):
        llm = LLMConfig(llm.url, llm_model or llm.model, llm.api_key, llm_timeout or llm.timeout_s)
    live = LiveSources(
        health_url=health_url.rstrip("/") if health_url else None,
        anomaly_url=anomaly_url.rstrip("/") if anomaly_url else None,
        logs_url=logs_url.rstrip("/") if logs_url else None,
        health_token=os.environ.get(HEALTH_TOKEN_ENV) or None,
        logs_login=logs_login() if logs_url else None,
        logs_ca_file=logs_ca_file() if logs_url else None,
        timeout_s=live_timeout,
    )
    return ChatConfig(repo_root=repo_root, sources=tuple(docs), live=live, llm=llm)
