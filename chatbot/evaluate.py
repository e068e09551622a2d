"""``fleetsight chatbot evaluate``: hit@1, hit@3, citation validity and declines on a question set.

A question set is a YAML list of ``{question: str, expect: [docs/runbooks/<Name>.md, ...]}``; an empty
``expect`` means out of scope (the right answer is to decline). hit@k counts an in-scope question as
hit when one of its expected files is among the first k files the answer cites. A citation is valid
when its file exists, has the section it names, and that section contains the quoted text verbatim.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .answer import Answer, Answerer
from .index import split_sections


class QuestionSetError(ValueError):
    """The question file is malformed; the message names the entry."""


CATEGORY = re.compile(r"^#\s*---\s*(.*?)\s*-*\s*$")
OUT_OF_SCOPE = "out of scope"


@dataclass(frozen=True)
class Entry:
    question: str
    expect: tuple[str, ...]
    category: str = ""


def categories(text: str) -> list[str]:
    """The category of each entry, in order: the last ``# --- name ---`` comment above it."""
    out, current = [], "questions"
    for line in text.splitlines():
        match = CATEGORY.match(line)
        if match:
            current = match.group(1) or current
        elif line.lstrip().startswith("- question:"):
            out.append(current)
    return out


def load_questions(path: Path) -> list[Entry]:
    try:
        text = path.read_text(encoding="utf-8")
        raw = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as exc:
        raise QuestionSetError(f"{path}: cannot read the question set: {exc}") from exc
    if not isinstance(raw, list) or not raw:
        raise QuestionSetError(f"{path}: expected a non-empty YAML list of {{question, expect}} entries")
    entries = []
    named = categories(text)
    for number, item in enumerate(raw, 1):
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("question"), str)
            or not item["question"].strip()
        ):
            raise QuestionSetError(f"{path}: entry {number} needs a non-empty string 'question'")
        expect = item.get("expect", [])
        if not isinstance(expect, list) or not all(isinstance(e, str) for e in expect):
            raise QuestionSetError(
                f"{path}: entry {number} ('{item['question']}'): 'expect' must be a list of paths"
            )
        category = (
            OUT_OF_SCOPE if not expect else (named[number - 1] if number <= len(named) else "questions")
        )
        entries.append(Entry(item["question"].strip(), tuple(expect), category))
    return entries


def citation_valid(repo_root: Path, file: str, section: str, quote: str) -> bool:
    """The file exists, has that section, and the section contains the quote verbatim."""
    path = repo_root / file
    if not path.is_file() or not quote.strip():
        return False
    return any(s.heading == section and quote in s.text for s in split_sections(path, file))


@dataclass
class Result:
    entry: Entry
    answer: Answer
    valid_citations: int
    in_scope: bool
    expected_present: bool  # at least one expected file exists (in-scope questions only)

    def hit(self, k: int) -> bool:
        return any(f in self.entry.expect for f in self.answer.cited_files[:k])


@dataclass
class Report:
    results: list[Result] = field(default_factory=list)

    def _share(self, hits: int, total: int) -> float | None:
        return round(hits / total, 4) if total else None

    def by_category(self) -> dict[str, Report]:
        groups: dict[str, Report] = {}
        for result in self.results:
            groups.setdefault(result.entry.category, Report()).results.append(result)
        return groups

    def summary(self) -> dict[str, Any]:
        scored = [r for r in self.results if r.in_scope and r.expected_present]
        out_of_scope = [r for r in self.results if not r.in_scope]
        citations = sum(len(r.answer.citations) for r in self.results)
        valid = sum(r.valid_citations for r in self.results)
        times = sorted(r.answer.took_ms for r in self.results)
        return {
            "questions": len(self.results),
            "in_scope": sum(r.in_scope for r in self.results),
            "in_scope_scored": len(scored),
            "in_scope_missing_runbooks": sum(r.in_scope and not r.expected_present for r in self.results),
            "out_of_scope": len(out_of_scope),
            "hit_at_1": self._share(sum(r.hit(1) for r in scored), len(scored)),
            "hit_at_3": self._share(sum(r.hit(3) for r in scored), len(scored)),
            "citations": citations,
            "citations_valid": self._share(valid, citations) if citations else 1.0,
            "out_of_scope_declined": self._share(
                sum(r.answer.declined for r in out_of_scope), len(out_of_scope)
            ),
            "in_scope_declined": sum(r.in_scope and r.answer.declined for r in self.results),
            "answer_ms_p50": round(times[len(times) // 2], 1) if times else None,
            "answer_ms_max": round(times[-1], 1) if times else None,
        }

    def first_misses(self) -> list[dict[str, Any]]:
        """Answered in-scope questions whose first cited file is not an expected one (hit@1 misses)."""
        return [
            {"question": r.entry.question, "expect": list(r.entry.expect), "cited": r.answer.cited_files[:3]}
            for r in self.results
            if r.in_scope and r.expected_present and r.hit(3) and not r.hit(1)
        ]

    def failures(self) -> list[dict[str, Any]]:
        out = []
        for r in self.results:
            wrong = (
                (r.in_scope and r.expected_present and not r.hit(3))
                or (not r.in_scope and not r.answer.declined)
                or r.valid_citations < len(r.answer.citations)
            )
            if wrong:
                out.append(
                    {
                        "question": r.entry.question,
                        "expect": list(r.entry.expect),
                        "cited": r.answer.cited_files,
                        "declined": r.answer.declined,
                        "invalid_citations": len(r.answer.citations) - r.valid_citations,
                    }
                )
        return out


def evaluate(answerer: Answerer, entries: list[Entry]) -> Report:
    """Answer every question (without live context: the set is about the runbooks) and score it."""
    root = answerer.config.repo_root
    report = Report()
    for entry in entries:
        answer = answerer.answer(entry.question, live=False)
        valid = sum(citation_valid(root, c.file, c.section, c.quote) for c in answer.citations)
        present = any((root / e).is_file() for e in entry.expect)
        report.results.append(Result(entry, answer, valid, bool(entry.expect), present))
    return report
