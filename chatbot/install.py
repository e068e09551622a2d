"""The chatbot's install step: embed the runbooks once at setup time, so the service's first start
does not spend its readiness window (30 s) embedding them (about 35 s on 2 busy cores, cold)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from fleetsight.settings import REPO_ROOT, Settings
from fleetsight.setup import run_logged

from .index import (
    VectorCache,
    chunk_key,
    chunk_text,
    default_sources,
    embedded,
    markdown_files,
    split_sections,
)

CACHE_DIR = REPO_ROOT / ".cache" / "chatbot"


def runbook_chunks(repo_root: Path = REPO_ROOT) -> list[str]:
    """The texts the index embeds for the checkout's docs, as it would build them."""
    texts = []
    for path in markdown_files(default_sources(repo_root)):
        relative = str(path.relative_to(repo_root.resolve()))
        texts.extend(chunk_text(s) for s in split_sections(path, relative) if embedded(s))
    return texts


def embeddings_current(_settings: Settings) -> bool:
    """Fast: every chunk of today's runbooks has a row in the cache (no model loaded)."""
    path = VectorCache(CACHE_DIR).path
    try:
        with np.load(path) as stored:
            keys = set(stored["keys"].tolist())
    except (OSError, ValueError, KeyError):
        return False
    return all(chunk_key(text) in keys for text in runbook_chunks())


def embed_runbooks(_settings: Settings, log: Path) -> None:
    code = "from chatbot.answer import Answerer, ChatConfig; from fleetsight.settings import REPO_ROOT; "
    code += "print(Answerer(ChatConfig(repo_root=REPO_ROOT)).index.vector_cache.encoded, 'sections embedded')"
    run_logged([sys.executable, "-c", code], log, cwd=REPO_ROOT)
