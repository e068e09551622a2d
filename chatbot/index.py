"""The search index over the runbooks and docs: one entry per ``##`` section, BM25 (bm25s) ranked,
and the runbook sections' embeddings (chatbot/embed.py) for dense retrieval.

Built at start-up from the Markdown files and rebuilt when any of them changes (checked at most every
``recheck_s`` seconds, by file names, sizes and modification times), so the chatbot needs nothing else
running and follows the docs as they are written. BM25 tokens are lower-cased words, CamelCase alert
names split into their words, with a light suffix stemmer. Embeddings come from a model shipped in a
PyPI package (nothing fetched) and are cached on disk per section text (:class:`VectorCache`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import bm25s
import numpy as np

from .embed import MODEL_ID, WEIGHTS_SHA256, shared_encoder

log = logging.getLogger("chatbot.index")

HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
WORD = re.compile(r"[A-Za-z][A-Za-z0-9]*|\d+(?:\.\d+)?")
CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
# Words too common in questions and runbooks to tell sections apart.
STOPWORDS = frozenset(
    """a an and are as at be been but by can could do does did for from had has have how i if in into is
    it its me my of on or our so that the their them then there these they this to was we were what when
    where which who why will with would you your should shall may might must not no yes just get got
    any all some about after again also am because before being both each few more most other own same
    than too very s t don now over under once here only until while he she his her him
    us ours mine what's whats im ive id ok please tell know want need help""".split()  # noqa: SIM905 - a word list reads best as text
)
# READMEs are tables of contents that would outrank the pages they list; the chatbot's own page quotes
# example questions and would answer them with itself.
SKIPPED_FILES = frozenset({"readme.md", "chatbot.md"})
# How much a title counts against the body: the alert name says a lot about its page.
TITLE_WEIGHT = 3
HEADING_WEIGHT = 2


def stem(word: str) -> str:
    """A light suffix stemmer (no PyStemmer here): enough for plurals and -ing/-ed forms."""
    for suffix, keep, shortest in (
        ("ies", "y", 3),
        ("ing", "", 4),
        ("ed", "", 4),
        ("es", "", 3),
        ("s", "", 3),
    ):
        if word.endswith(suffix) and len(word) - len(suffix) >= shortest:
            if suffix == "es" and not word.endswith(("ches", "shes", "sses", "xes")):
                continue
            if suffix == "s" and word.endswith(("ss", "us", "is")):
                continue
            base = word[: len(word) - len(suffix)] + keep
            # flapping -> flapp -> flap (but stalled -> stall, missed -> miss)
            if suffix in ("ing", "ed") and base[-1] == base[-2] and base[-1] not in "lsz":
                base = base[:-1]
            return base
    return word


def tokens(text: str) -> list[str]:
    """Words of text: CamelCase and snake/kebab parts split, lower-cased, stemmed, stopwords dropped."""
    out: list[str] = []
    for raw in WORD.findall(text):
        parts = CAMEL.findall(raw) if not raw.isdigit() else [raw]
        # Split CamelCase names (GPUFellOffBus) into their words too, but not NaN or PSU2.
        split = len(parts) > 1 and all(len(p) >= 2 for p in parts if not p.isdigit())
        pieces = [raw.lower(), *(p.lower() for p in parts)] if split else [raw.lower()]
        for piece in pieces:
            if piece in STOPWORDS or (len(piece) < 2 and not piece.isdigit()):
                continue
            out.append(stem(piece))
    return out


@dataclass(frozen=True)
class Section:
    """One ``##`` section of one file (or the text before the first one, under the page title)."""

    file: str  # repository-relative path, e.g. docs/runbooks/PSUFailed.md
    page: str  # the page's title (its ``#`` heading, or the file name)
    heading: str  # the section's heading; the page title for the lead text
    text: str  # the section's body, exactly as in the file (the heading line excluded)
    start_line: int  # 1-based line of the heading in the file

    @property
    def anchor(self) -> str:
        """GitHub-style anchor of the heading."""
        slug = re.sub(r"[^\w\- ]", "", self.heading.lower()).strip().replace(" ", "-")
        return slug

    @property
    def is_runbook(self) -> bool:
        return "/runbooks/" in f"/{self.file}"


def split_sections(path: Path, relative: str) -> list[Section]:
    """The sections of one Markdown file; ``###`` and deeper stay inside their ``##`` section."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    page = path.stem
    sections: list[Section] = []
    heading, start, body = page, 1, []
    in_fence = False

    def flush() -> None:
        text = "\n".join(body).strip("\n")
        if text.strip():
            sections.append(Section(relative, page, heading, text, start))

    for number, line in enumerate(lines, 1):
        if FENCE.match(line):
            in_fence = not in_fence
        match = None if in_fence else HEADING.match(line)
        if match and len(match.group(1)) == 1 and page == path.stem:
            page = heading = match.group(2)
            start = number
            continue
        if match and len(match.group(1)) == 2:
            flush()
            heading, start, body = match.group(2), number, []
            continue
        body.append(line)
    flush()
    return sections


def default_sources(repo_root: Path) -> list[Path]:
    """What the chatbot reads by default: the runbooks and the operator docs."""
    return [repo_root / "docs" / "runbooks", repo_root / "docs"]


def markdown_files(sources: Iterable[Path]) -> list[Path]:
    """The Markdown files of the sources, folders read one level deep (see SKIPPED_FILES)."""
    found: dict[Path, None] = {}
    for source in sources:
        candidates = [source] if source.is_file() else sorted(source.glob("*.md"))
        for path in candidates:
            if path.suffix == ".md" and path.name.lower() not in SKIPPED_FILES:
                found[path.resolve()] = None
    return list(found)


@dataclass(frozen=True)
class Hit:
    section: Section
    score: float  # BM25, cosine or fused, by the search that made it
    # What a page's second matching section adds to its rank (rank_files): the score itself, or in
    # hybrid only its BM25 part (a cosine is far from 0 for every section, so with it a second section
    # would favour long pages over the matching one: "Xid 79" ranked GPUXidUncorrectable first).
    second: float | None = None


# Sections not embedded: a runbook's lead text is its metadata line, and "Related alerts" names other
# runbooks' symptoms, so both match questions about other pages.
NOT_EMBEDDED = frozenset({"related alerts"})


def embedded(section: Section) -> bool:
    return (
        section.is_runbook and section.heading != section.page and section.heading.lower() not in NOT_EMBEDDED
    )


def chunk_text(section: Section) -> str:
    """What is embedded for a section: its page's name in words (GPUFellOffBus -> GPU Fell Off Bus),
    its heading, then its text."""
    title = " ".join(CAMEL.findall(section.page)) if " " not in section.page else section.page
    return f"{title}. {section.heading}. {section.text}"


def chunk_key(text: str) -> str:
    return hashlib.sha256(f"{MODEL_ID}\0{WEIGHTS_SHA256}\0{text}".encode()).hexdigest()


class VectorCache:
    """Embeddings of the runbook chunks on disk, one file keyed by model, one row per chunk keyed by the
    hash of (model, weights, chunk text): a changed runbook re-embeds only its changed sections, an
    unchanged tree re-embeds nothing (a cold build is tens of seconds on 2 busy cores)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / f"embeddings-{WEIGHTS_SHA256[:16]}.npz"
        self.encoded = 0  # chunks encoded by the last build (0: all came from the cache)
        self.encoded_total = 0

    def _load(self) -> dict[str, np.ndarray]:
        try:
            with np.load(self.path) as stored:
                return dict(zip(stored["keys"].tolist(), stored["vectors"], strict=True))
        except (OSError, ValueError, KeyError) as exc:
            if self.path.exists():
                log.warning("event=embedding_cache_unreadable path=%s error=%r", self.path, str(exc))
            return {}

    def vectors(self, texts: list[str]) -> np.ndarray:
        keys = [chunk_key(t) for t in texts]
        known = self._load()
        missing = [i for i, k in enumerate(keys) if k not in known]
        self.encoded = len(missing)
        self.encoded_total += len(missing)
        if missing:
            fresh = shared_encoder().encode([texts[i] for i in missing])
            known.update({keys[i]: fresh[row] for row, i in enumerate(missing)})
            self._save({k: known[k] for k in keys})
        return np.stack([known[k] for k in keys]) if keys else np.zeros((0, 384), dtype=np.float32)

    def _save(self, rows: dict[str, np.ndarray]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(partial, keys=np.array(list(rows)), vectors=np.stack(list(rows.values())))
        partial.replace(self.path)  # atomic: a concurrent reader sees the old file or the new one


class DocIndex:
    """BM25 over sections, rebuilt when the files change. Thread-safe."""

    def __init__(
        self,
        sources: list[Path],
        repo_root: Path,
        recheck_s: float = 2.0,
        dense: bool = True,
        cache_dir: Path | None = None,
    ) -> None:
        self.sources = sources
        self.dense = dense
        self.vector_cache = VectorCache(cache_dir or repo_root / ".cache" / "chatbot")
        self._vectors = np.zeros((0, 384), dtype=np.float32)
        self._runbook_rows: list[int] = []
        self.repo_root = repo_root.resolve()
        self.recheck_s = recheck_s
        self.sections: list[Section] = []
        self.builds = 0
        self.build_seconds = 0.0
        self._signature: tuple[tuple[str, int, int], ...] = ()
        self._checked = 0.0
        self._lock = threading.Lock()
        self._bm25: bm25s.BM25 | None = None
        self._vocab: dict[str, int] = {}
        self._idf: dict[str, float] = {}
        self.refresh(force=True)

    # ------------------------------------------------------------------ building
    def _relative(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.repo_root))
        except ValueError:
            return str(path)

    def _current_signature(self) -> tuple[tuple[str, int, int], ...]:
        entries = []
        for path in markdown_files(self.sources):
            try:
                stat = path.stat()
            except FileNotFoundError:  # removed between the listing and the stat
                continue
            entries.append((str(path), stat.st_mtime_ns, stat.st_size))
        return tuple(entries)

    def refresh(self, force: bool = False) -> bool:
        """Rebuild when the files changed since the last build; True when it rebuilt."""
        now = time.monotonic()
        if not force and now - self._checked < self.recheck_s:
            return False
        with self._lock:
            self._checked = now
            signature = self._current_signature()
            if not force and signature == self._signature:
                return False
            self._build(signature)
            return True

    def _build(self, signature: tuple[tuple[str, int, int], ...]) -> None:
        started = time.perf_counter()
        sections: list[Section] = []
        for name, _, _ in signature:
            path = Path(name)
            try:
                sections.extend(split_sections(path, self._relative(path)))
            except OSError as exc:  # a file that vanished or is unreadable: index the rest
                log.warning("event=index_skip file=%s error=%r", path, str(exc))
        documents = [self._document_tokens(s) for s in sections]
        vocab: dict[str, int] = {}
        for doc in documents:
            for token in doc:
                vocab.setdefault(token, len(vocab))
        bm25 = bm25s.BM25(k1=1.2, b=0.75)
        if sections:
            ids = [[vocab[t] for t in doc] or [0] for doc in documents]
            bm25.index(bm25s.tokenization.Tokenized(ids=ids, vocab=vocab), show_progress=False)
        count = max(len(sections), 1)
        frequency: dict[str, int] = {}
        for doc in documents:
            for token in set(doc):
                frequency[token] = frequency.get(token, 0) + 1
        self._idf = {t: float(np.log(1 + (count - f + 0.5) / (f + 0.5))) for t, f in frequency.items()}
        # Dense vectors for the runbook sections only: they are the answers; the other docs explain
        # FleetSight itself and are found by their words.
        rows = [i for i, s in enumerate(sections) if embedded(s)] if self.dense else []
        vectors = self.vector_cache.vectors([chunk_text(sections[i]) for i in rows]) if rows else None
        self._vocab, self._bm25, self.sections, self._signature = vocab, bm25, sections, signature
        self._runbook_rows = rows
        self._vectors = vectors if vectors is not None else np.zeros((0, 384), dtype=np.float32)
        self.builds += 1
        self.build_seconds = time.perf_counter() - started
        log.info(
            "event=index_built files=%d sections=%d seconds=%.3f",
            len(signature),
            len(sections),
            self.build_seconds,
        )

    @staticmethod
    def _document_tokens(section: Section) -> list[str]:
        title = tokens(section.page)
        if section.is_runbook:  # a runbook's title is its alert name: weigh it more
            title = title * TITLE_WEIGHT
        heading = tokens(section.heading) * HEADING_WEIGHT if section.heading != section.page else []
        return [*title, *heading, *tokens(section.text)]

    # ------------------------------------------------------------------ searching
    def idf(self, token: str) -> float:
        return self._idf.get(token, 0.0)

    @property
    def max_idf(self) -> float:
        """The IDF of a word only one section has: the unit BM25 scores grow in with the corpus."""
        return max(self._idf.values(), default=1.0)

    def search(self, question: str, k: int = 10) -> list[Hit]:
        """The k best sections for question, best first (none when no word of it is known)."""
        self.refresh()
        with self._lock:
            bm25, vocab, sections = self._bm25, self._vocab, self.sections
        query = [t for t in tokens(question) if t in vocab]
        if not sections or not query or bm25 is None:
            return []
        ids = [[vocab[t] for t in query]]
        k = min(k, len(sections))
        found, scores = bm25.retrieve(ids, k=k, show_progress=False, n_threads=1)
        return [
            Hit(sections[int(doc_id)], float(score))
            for doc_id, score in zip(found[0], scores[0], strict=True)
            if score > 0
        ]

    def scores(self, question: str) -> np.ndarray:
        """BM25 of every section (0 where no word matches), in self.sections order."""
        self.refresh()
        with self._lock:
            bm25, vocab, count = self._bm25, self._vocab, len(self.sections)
        query = [t for t in tokens(question) if t in vocab]
        if not count or not query or bm25 is None:
            return np.zeros(count, dtype=np.float32)
        found, scores = bm25.retrieve([[vocab[t] for t in query]], k=count, show_progress=False, n_threads=1)
        out = np.zeros(count, dtype=np.float32)
        out[found[0]] = scores[0]
        return out

    def similarities(self, question: str, vector: np.ndarray | None = None) -> np.ndarray:
        """Cosine of the question with every section (0 for sections that are not embedded); ``vector``:
        the question already encoded (the caller needs it for more than this)."""
        self.refresh()
        with self._lock:
            vectors, rows, count = self._vectors, self._runbook_rows, len(self.sections)
        out = np.zeros(count, dtype=np.float32)
        if rows:
            out[rows] = vectors @ (shared_encoder().encode([question])[0] if vector is None else vector)
        return out

    def section(self, file: str, heading: str) -> Section | None:
        with self._lock:
            for section in self.sections:
                if section.file == file and section.heading == heading:
                    return section
        return None

    def file_sections(self, file: str) -> list[Section]:
        with self._lock:
            return [s for s in self.sections if s.file == file]
