"""Answers: retrieve the best runbook sections, then quote them (extractive, the default) or have a
language model write an answer constrained to them; always with citations that exist and contain what
is quoted, and a decline (with the closest runbooks) when nothing relevant is found.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .citation import Citation
from .embed import shared_encoder
from .index import DocIndex, Hit, Section, default_sources, tokens
from .live import LiveContext, LiveSources, find_jobs, find_nodes, gather
from .llm import LLMConfig, LLMError, ask_llm, injected
from .scope import NOT_COVERED_MARGIN, Scope

log = logging.getLogger("chatbot.answer")

MAX_QUESTION_CHARS = 2000
MAX_FILES = 3  # runbooks cited per answer
MAX_QUOTE_LINES = 14  # lines quoted from one section
# Below this score the best section is not about the question: decline. The score is BM25 in units of
# the corpus's largest IDF (a word only one section has), so that it means the same with 20 runbooks
# or 200. Calibrated on chatbot/eval/questions.yaml (see docs/chatbot.md): out-of-scope questions
# score up to about 0.55, in-scope ones from about 0.7 up.
MIN_SCORE = 0.6
# Retrieval modes: BM25 alone (exact tokens: Xid numbers, error strings, alert names), the embedding
# model alone (a researcher's own words), or both fused (the default).
MODES = ("lexical", "dense", "hybrid")
FUSIONS = ("sum", "rrf")
# Dense: the cosine of the question with the best runbook section below which it is out of scope.
DENSE_MIN_SCORE = 0.35
# Hybrid (score sum): sections rank by BM25 in max-IDF units plus DENSE_WEIGHT times the cosine. The
# decision to answer weighs the cosine less (DECLINE_DENSE_WEIGHT): an off-topic question that names
# GPUs ("a poem about GPUs") is close to every GPU page in meaning but shares few of their words.
# Decline when the best section's BM25 + DECLINE_DENSE_WEIGHT x cosine is below HYBRID_MIN_SCORE.
# All three calibrated on chatbot/eval/questions.yaml only (docs/chatbot.md). The decision threshold
# drifts with the corpus (BM25 in max-IDF units is not scale-free: a common word's IDF grows against
# the largest as sections are added): 1.13 when calibrated, 1.148 re-derived the same way on 2026-11-29.
DENSE_WEIGHT = 4.0
DECLINE_DENSE_WEIGHT = 1.5
HYBRID_MIN_SCORE = 1.148
RRF_K = 60  # the usual constant of reciprocal rank fusion
# An Xid/SXid number is an exact code: the embedding model does not know that Xid 79 is "fell off the
# bus", and its closeness to every Xid-listing page outweighs BM25's match on the number. Questions
# naming one rank by BM25 alone (hybrid still decides whether to answer).
EXACT_CODE = re.compile(r"\bs?xid\s*\d+", re.IGNORECASE)
SEARCH_DEPTH = 20
# The sections whose steps an answer quotes, in order of preference, after the best matching one (the
# alert runbooks say "What to do", the log-alert runbooks "Act").
ACTION_SECTIONS = ("What to do", "Act", "How to confirm", "Confirm")
# What a runbook's metadata-only lead text is replaced by when it is the best match.
MEANING_SECTIONS = ("What it means", "Impact on running jobs")
MIN_SENTENCE_CHARS = 25  # a "See also" quote is a sentence, not a list number or a fragment
# A symptom as people say it -> the words the runbooks use for it. Keys are matched on stems.
SYMPTOMS = {
    "disappeared": "fell off bus missing",
    "vanished": "fell off bus missing",
    "missing": "fell off bus",
    "hot": "thermal temperature",
    "overheating": "thermal temperature",
    "slow": "straggler slower",
    "slower": "straggler power brake",
    "hangs": "timeout hung",
    "stuck": "timeout hung",
    "timed": "timeout",
    "nan": "loss nan",
    "inf": "loss nan",
    "exploded": "loss nan diverged",
    "responding": "node down crashed hung",
    "unresponsive": "node down crashed hung",
    "ssh": "node down",
    "evicted": "eviction",
    "ecc": "uncorrectable xid",
    "ib": "infiniband",
    "flaps": "flapping",
    "inside": "nvlink nvswitch",
    "intra": "nvlink nvswitch",
    "inter": "infiniband network port rate",
    "memcpy": "host device bandwidth pcie",
    "cudamemcpy": "host device bandwidth pcie",
    "util": "utilisation",  # nvidia-smi's "GPU-Util"
    "allreduce": "all reduce",
}
SYNONYMS = {token: words for key, words in SYMPTOMS.items() for token in tokens(key)[:1]}
# Runbooks are the answers; the other docs explain FleetSight itself and rank after them.
DOC_WEIGHT = 0.75
SECOND_SECTION_WEIGHT = 0.5


def rrf(*scores: np.ndarray) -> np.ndarray:
    """Reciprocal rank fusion of score vectors over the same sections (unmatched sections add nothing)."""
    fused = np.zeros_like(scores[0])
    for score in scores:
        ranks = np.empty(len(score), dtype=np.int64)
        ranks[np.argsort(-score, kind="stable")] = np.arange(1, len(score) + 1)
        fused += np.where(score > 0, 1.0 / (RRF_K + ranks), 0.0).astype(fused.dtype)
    return fused


class QuestionError(ValueError):
    """The question cannot be answered as asked (empty, too long); the message says why."""


@dataclass
class Answer:
    question: str
    text: str
    declined: bool
    mode: str  # "extractive", "llm", "extractive-fallback" or "declined"
    citations: list[Citation] = field(default_factory=list)
    evidence: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    closest: list[str] = field(default_factory=list)
    took_ms: float = 0.0
    live_failures: list[str] = field(default_factory=list)  # for the service's metrics, not the reply

    @property
    def cited_files(self) -> list[str]:
        return list(dict.fromkeys(c.file for c in self.citations))

    def as_dict(self) -> dict[str, Any]:
        return {
            "question": self.question,
            "answer": self.text,
            "declined": self.declined,
            "mode": self.mode,
            "citations": [c.as_dict() for c in self.citations],
            "evidence": self.evidence,
            "notes": self.notes,
            "closest": self.closest,
            "took_ms": round(self.took_ms, 1),
        }


@dataclass(frozen=True)
class ChatConfig:
    repo_root: Path
    sources: tuple[Path, ...] = ()
    live: LiveSources = field(default_factory=LiveSources)
    llm: LLMConfig | None = None
    min_score: float = MIN_SCORE
    mode: str = "hybrid"
    fusion: str = "sum"
    dense_min_score: float = DENSE_MIN_SCORE
    dense_weight: float = DENSE_WEIGHT
    decline_dense_weight: float = DECLINE_DENSE_WEIGHT
    hybrid_min_score: float = HYBRID_MIN_SCORE
    # Dense and hybrid: decline a question closer to a near-domain topic the docs do not cover than to
    # any runbook section by more than this (chatbot/scope.py); None: no such check.
    not_covered_margin: float | None = NOT_COVERED_MARGIN
    # Secrets the service holds besides the model's key and the health token (its API tokens, Slack's
    # signing secret): an answer that contains one is refused (chatbot/llm.py).
    withheld: tuple[str, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r}: use one of {', '.join(MODES)}")
        if self.fusion not in FUSIONS:
            raise ValueError(f"fusion {self.fusion!r}: use one of {', '.join(FUSIONS)}")

    def source_paths(self) -> list[Path]:
        return list(self.sources) or default_sources(self.repo_root)


def expand(question: str) -> str:
    """The question plus the runbooks' words for the symptoms it names."""
    extra = [SYNONYMS[t] for t in dict.fromkeys(tokens(question)) if t in SYNONYMS]
    return " ".join([question, *extra])


def rank_files(hits: list[Hit], preferred: list[str]) -> list[tuple[str, Hit]]:
    """Files by their best section's score plus half their second best; runbooks the live sources
    named come first."""
    best: dict[str, Hit] = {}
    for hit in hits:
        if hit.section.file not in best:
            best[hit.section.file] = hit
    # A page where a second section also matches is more likely the page the question is about.
    second: dict[str, float] = {}
    for hit in hits:
        if hit is not best[hit.section.file] and hit.section.file not in second:
            second[hit.section.file] = hit.score if hit.second is None else hit.second
    ordered = sorted(
        best.items(), key=lambda item: -(item[1].score + SECOND_SECTION_WEIGHT * second.get(item[0], 0.0))
    )
    return sorted(
        ordered, key=lambda item: preferred.index(item[0]) if item[0] in preferred else len(preferred)
    )


def quote_lines(section: Section, question_tokens: set[str], limit: int = MAX_QUOTE_LINES) -> str:
    """A contiguous run of the section's lines (so the quote is verbatim): the whole section when it is
    short, else the window of ``limit`` lines that shares most words with the question."""
    lines = section.text.strip("\n").splitlines()
    if len(lines) <= limit:
        return "\n".join(lines)
    weights = [len(question_tokens & set(tokens(line))) for line in lines]
    start = max(range(len(lines) - limit + 1), key=lambda i: sum(weights[i : i + limit]))
    # Do not cut a code block in half: a fence opened in the window is closed inside it or dropped.
    window = lines[start : start + limit]
    if sum(1 for line in window if line.lstrip().startswith("```")) % 2:
        last_fence = max(i for i, line in enumerate(window) if line.lstrip().startswith("```"))
        window = window[:last_fence] or window
    return "\n".join(window).strip("\n")


def best_line(lines: list[str], question_tokens: set[str]) -> str:
    """The line sharing most words with the question, fences and table rulers excluded."""
    candidates = [
        line for line in lines if line.strip() and not re.match(r"^\s*(```|~~~|\|[\s\-:|]+\|\s*$)", line)
    ]
    if not candidates:
        return lines[0].strip() if lines else ""
    return max(candidates, key=lambda line: len(question_tokens & set(tokens(line)))).strip()


def first_sentence(section: Section, question_tokens: set[str], max_lines: int = 4) -> str:
    """The section's opening sentence, verbatim (it may run over a few lines); for a section that opens
    with a table or a code block, the line of it that shares most words with the question."""
    lines = section.text.strip("\n").splitlines()
    if not lines or lines[0].lstrip().startswith(("|", "```", "~~~")):
        return best_line(lines, question_tokens)
    text = "\n".join(lines[:max_lines])
    for match in re.finditer(r"[.!?](?=\s|$)", text):
        before = text[: match.start()].rstrip()
        # Not a list number ("1."), nor an abbreviation ("e.g."), nor a fragment.
        if len(before) >= MIN_SENTENCE_CHARS and not re.search(r"(\b\d+|\be\.g|\bi\.e|\betc)$", before):
            return text[: match.start() + 1].strip()
    return lines[0].strip()


class Answerer:
    """Turns a question into an :class:`Answer`. One per service; thread-safe."""

    def __init__(self, config: ChatConfig) -> None:
        self.config = config
        self.index = DocIndex(config.source_paths(), config.repo_root, dense=config.mode != "lexical")
        self.scope = Scope()

    def check_question(self, question: str) -> str:
        question = question.strip()
        if not question:
            raise QuestionError(
                "the question is empty: ask something, e.g. 'what does Xid 79 mean for my job'"
            )
        if len(question) > MAX_QUESTION_CHARS:
            raise QuestionError(
                f"the question is {len(question)} characters long; the limit is {MAX_QUESTION_CHARS}: "
                "ask about one symptom at a time"
            )
        return question

    def search(self, question: str) -> list[Hit]:
        """The best sections for the question, best first (see :meth:`retrieve`)."""
        return self.retrieve(question)[0]

    def retrieve(self, question: str) -> tuple[list[Hit], bool]:
        """The best sections for the question (node names and job ids left out: they are not words of
        the runbooks) in the configured mode, runbooks before the other docs; and whether the best is
        relevant enough to answer from (else: decline)."""
        words = question
        for name in [*find_nodes(question, self.config.live.node_pattern), *find_jobs(question)]:
            words = re.sub(rf"\b{re.escape(name)}\b", " ", words, flags=re.IGNORECASE)
        if self.config.mode == "lexical":
            found = self.index.search(expand(words), k=SEARCH_DEPTH)
            weighed = [h if h.section.is_runbook else Hit(h.section, h.score * DOC_WEIGHT) for h in found]
            hits = sorted(weighed, key=lambda h: -h.score)
            return hits, bool(hits) and hits[0].score / self.index.max_idf >= self.config.min_score
        sections = self.index.sections
        vector = shared_encoder().encode([words])[0]
        cosine = self.index.similarities(words, vector)
        covered = self.covered(vector, cosine)
        if self.config.mode == "dense":
            scores, relevant = cosine, cosine.max(initial=0.0) >= self.config.dense_min_score
        else:
            lexical = self.index.scores(expand(words)) / self.index.max_idf
            lexical *= np.array([1.0 if s.is_runbook else DOC_WEIGHT for s in sections], dtype=np.float32)
            summed = lexical + self.config.dense_weight * cosine
            # Rank fusion has no scale to decline on: the calibrated sum decides in both fusions.
            evidence = lexical + self.config.decline_dense_weight * cosine
            relevant = evidence.max(initial=0.0) >= self.config.hybrid_min_score
            scores = rrf(lexical, cosine) if self.config.fusion == "rrf" else summed
            if EXACT_CODE.search(words):
                scores = lexical
        order = np.argsort(-scores, kind="stable")[:SEARCH_DEPTH]
        lexical_part = lexical if self.config.mode == "hybrid" else scores
        hits = [Hit(sections[i], float(scores[i]), float(lexical_part[i])) for i in order if scores[i] > 0]
        return hits, bool(relevant) and covered

    def covered(self, vector: np.ndarray, cosine: np.ndarray) -> bool:
        """False when the question is about a near-domain topic the docs do not cover (a training
        recipe, a model format): its words can still clear the score threshold (chatbot/scope.py)."""
        margin = self.config.not_covered_margin
        if margin is None:
            return True
        topic = self.scope.uncovered(vector, float(cosine.max(initial=0.0)), margin)
        if topic is not None:
            log.info("event=not_covered topic=%r", topic.split(":")[0])
        return topic is None

    def answer(self, question: str, live: bool = True) -> Answer:
        started = time.perf_counter()
        question = self.check_question(question)
        context = gather(question, self.config.live) if live else LiveContext()
        hits, relevant = self.retrieve(question)
        if not relevant and context.evidence:
            # The words alone say too little ("n0007 lost a GPU"), but what the cluster reports about it
            # does (an Xid 79 in its log): search with both.
            hits, relevant = self.retrieve(" ".join([question, *(e.summary for e in context.evidence)]))
        preferred = [r for r in context.runbooks if any(s.file == r for s in self.index.file_sections(r))]
        if not relevant and not preferred:
            result = self.decline(question, hits, context)
        else:
            result = self.extractive(question, hits, preferred, context)
            if self.config.llm is not None:
                result = self.with_llm(result, context)
        result.took_ms = (time.perf_counter() - started) * 1000
        result.live_failures = list(context.failed)
        log.info(
            "event=answer mode=%s declined=%s files=%s took_ms=%.1f",
            result.mode,
            result.declined,
            ",".join(result.cited_files) or "-",
            result.took_ms,
        )
        return result

    # ------------------------------------------------------------------ extractive
    def extractive(
        self, question: str, hits: list[Hit], preferred: list[str], context: LiveContext
    ) -> Answer:
        question_tokens = set(tokens(expand(question)))
        citations: list[Citation] = []
        ranked = rank_files(hits, preferred)
        for file in preferred:  # a runbook a live source named, even if the words did not find it
            if file not in [f for f, _ in ranked]:
                sections = self.index.file_sections(file)
                ranked.insert(0, (file, Hit(sections[0], 0.0)))
        lines: list[str] = []
        for rank, (file, hit) in enumerate(ranked[:MAX_FILES]):
            section = self.substantive(hit.section)
            if rank == 0:
                chosen = [section]
                for name in ACTION_SECTIONS:
                    extra = self.index.section(file, name)
                    if extra and extra not in chosen:
                        chosen.append(extra)
                        break
                for part in chosen:
                    quote = quote_lines(part, question_tokens)
                    citations.append(self._cite(citations, part, quote, hit.score))
                    lines.append(f"**{part.page} — {part.heading}** [{citations[-1].n}]\n{quote}")
            else:
                quote = first_sentence(section, question_tokens)
                citations.append(self._cite(citations, section, quote, hit.score))
                lines.append(f"See also **{section.page} — {section.heading}** [{citations[-1].n}]: {quote}")
        intro = self.live_summary(context)
        text = "\n\n".join([*intro, *lines])
        return Answer(
            question=question,
            text=text,
            declined=False,
            mode="extractive",
            citations=citations,
            evidence=[e.as_dict() for e in context.evidence],
            notes=list(context.notes),
        )

    def substantive(self, section: Section) -> Section:
        """A runbook's lead text is its metadata line (severity, team, rule): quote what it means instead."""
        if section.is_runbook and section.heading == section.page:
            for name in MEANING_SECTIONS:
                meaning = self.index.section(section.file, name)
                if meaning is not None:
                    return meaning
        return section

    @staticmethod
    def _cite(citations: list[Citation], section: Section, quote: str, score: float) -> Citation:
        return Citation(len(citations) + 1, section.file, section.heading, section.anchor, quote, score)

    def live_summary(self, context: LiveContext) -> list[str]:
        """The live facts first ("node n0007 is flagged as a straggler ..."), each with source and time;
        a runbook a source names is pointed at only when it exists."""
        out = []
        for item in context.evidence:
            when = f" at {item.time}" if item.time else ""
            exists = item.runbook and self.index.file_sections(item.runbook)
            runbook = f" -> runbook {Path(item.runbook).stem}" if item.runbook and exists else ""
            out.append(f"Live ({item.source}{when}): {item.summary}{runbook}")
        out.extend(f"Note: {note}" for note in context.notes)
        return ["\n".join(out)] if out else []

    # ------------------------------------------------------------------ declining
    def decline(self, question: str, hits: list[Hit], context: LiveContext) -> Answer:
        # Closest by shared words: every section is at some cosine from any question, so "the capital
        # of France" would otherwise list three runbooks as close.
        worded = [h for h in hits if h.second is None or h.second > 0]
        ranked = [file for file, _ in rank_files(worded, [])]
        runbooks_first = sorted(ranked, key=lambda f: "/runbooks/" not in f"/{f}")
        closest = runbooks_first[:MAX_FILES]
        nearest = (
            f"The closest runbooks are: {', '.join(Path(f).stem for f in closest)}."
            if closest
            else "No runbook shares a word with the question."
        )
        if context.evidence:  # "is n0003 ok?": the live state above is the answer; no runbook adds to it
            text = f"That is what the cluster reports now; no runbook matches the question itself. {nearest}"
        else:
            text = (
                f"I could not find anything about this in the runbooks, so I will not guess. {nearest} "
                "Ask about a symptom on the cluster (a GPU error, a slow or failed job, a node, the network "
                "or storage)."
            )
        return Answer(
            question=question,
            text="\n\n".join([*self.live_summary(context), text]),
            declined=True,
            mode="declined",
            evidence=[e.as_dict() for e in context.evidence],
            notes=list(context.notes),
            closest=closest,
        )

    # ------------------------------------------------------------------ language model
    def with_llm(self, extractive: Answer, context: LiveContext) -> Answer:
        """Have the model write the answer from the cited passages; fall back to the quotes on any
        failure, saying so."""
        assert self.config.llm is not None
        passages = []
        for citation in extractive.citations:
            section = self.index.section(citation.file, citation.section)
            passages.append((citation, section.text if section else citation.quote))
        live = self.live_summary(context)
        suspicious = injected(passages, live)
        try:
            if suspicious:  # instructions planted in the data: the model does not get to read them
                log.warning("event=possible_prompt_injection where=%r", suspicious)
                raise LLMError(f"text that reads as instructions to a model in {'; '.join(suspicious)}")
            secrets_held = (self.config.live.health_token or "", *self.config.withheld)
            text, used = ask_llm(self.config.llm, extractive.question, passages, live, secrets_held)
        except LLMError as exc:
            extractive.mode = "extractive-fallback"
            extractive.notes.append(
                f"language model not used: {exc}; this answer quotes the runbooks instead"
            )
            extractive.text = "\n\n".join([extractive.text, f"Note: language model not used ({exc})."])
            return extractive
        kept = [c for c in extractive.citations if c.n in used] or extractive.citations
        return Answer(
            question=extractive.question,
            text=text,
            declined=False,
            mode="llm",
            citations=kept,
            evidence=extractive.evidence,
            notes=extractive.notes,
        )
