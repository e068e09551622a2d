"""Retrieval and answers: sections, rebuilds when the docs change, and the question set's invariants
(every citation exists and holds its quote, out-of-scope questions declined, hit@3 over the questions
whose expected runbooks exist)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from chatbot.answer import MAX_QUESTION_CHARS, Answerer, ChatConfig, QuestionError
from chatbot.evaluate import QuestionSetError, citation_valid, evaluate, load_questions
from chatbot.index import DocIndex, split_sections, tokens
from fleetsight.settings import REPO_ROOT
from support import FLEETSIGHT

QUESTIONS = REPO_ROOT / "chatbot" / "eval" / "questions.yaml"

OST_RUNBOOK = """# LustreOSTSlow

**Severity:** warning

## What it means
Clients wait on average more than 10 ms per RPC to one OST.

## How to confirm
```
lctl get_param osc.*.rpc_stats
```

## What to do
1. Find the OST's server and check its disks.
2. Tell the storage team.
"""


@pytest.fixture(scope="module")
def answerer() -> Answerer:
    return Answerer(ChatConfig(repo_root=REPO_ROOT))


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_sections_follow_second_level_headings_and_keep_code_blocks_whole(tmp_path: Path) -> None:
    write(tmp_path / "docs/runbooks/LustreOSTSlow.md", OST_RUNBOOK + "```\n## not a heading\n```\n")
    sections = split_sections(tmp_path / "docs/runbooks/LustreOSTSlow.md", "docs/runbooks/LustreOSTSlow.md")
    assert [s.heading for s in sections] == ["LustreOSTSlow", "What it means", "How to confirm", "What to do"]
    assert all(s.page == "LustreOSTSlow" for s in sections)
    assert "lctl get_param osc.*.rpc_stats" in sections[2].text
    assert "## not a heading" in sections[3].text
    assert sections[3].anchor == "what-to-do"


def test_tokens_split_alert_names_and_stem_symptoms() -> None:
    assert {"gpu", "fell", "off", "bus"} <= set(tokens("GPUFellOffBus"))
    assert tokens("flapping") == tokens("flaps") == ["flap"]
    assert tokens("the link is down and the job hangs") == ["link", "down", "job", "hang"]


def test_index_rebuilds_when_a_runbook_appears_changes_or_goes(tmp_path: Path) -> None:
    runbooks = tmp_path / "docs" / "runbooks"
    write(runbooks / "NodeDown.md", "# NodeDown\n\n## What it means\nThe host crashed or hung.\n")
    index = DocIndex([runbooks], tmp_path, recheck_s=0)
    assert not index.search("object storage target slow rpc")
    write(runbooks / "LustreOSTSlow.md", OST_RUNBOOK)
    hits = index.search("object storage target slow rpc OST")
    assert hits and hits[0].section.file == "docs/runbooks/LustreOSTSlow.md"
    builds = index.builds
    write(runbooks / "LustreOSTSlow.md", OST_RUNBOOK.replace("storage team", "Lustre vendor escalation"))
    assert index.search("vendor escalation")[0].section.heading == "What to do"
    assert index.builds == builds + 1
    (runbooks / "LustreOSTSlow.md").unlink()
    assert all(h.section.file != "docs/runbooks/LustreOSTSlow.md" for h in index.search("OST rpc"))


def test_answer_quotes_steps_verbatim_and_cites_existing_sections(tmp_path: Path) -> None:
    write(tmp_path / "docs/runbooks/LustreOSTSlow.md", OST_RUNBOOK)
    answerer = Answerer(ChatConfig(repo_root=tmp_path))
    answer = answerer.answer("checkpoint writes are slow, one OST takes 10 ms per RPC")
    assert not answer.declined and answer.mode == "extractive"
    assert answer.cited_files == ["docs/runbooks/LustreOSTSlow.md"]
    assert "What to do" in [c.section for c in answer.citations]
    assert "1. Find the OST's server and check its disks." in answer.text
    for citation in answer.citations:
        assert citation_valid(tmp_path, citation.file, citation.section, citation.quote)
        assert citation.quote in answer.text


def test_nothing_relevant_is_declined_with_the_closest_runbooks(answerer: Answerer) -> None:
    answer = answerer.answer("write me a poem about GPUs")
    assert answer.declined and answer.mode == "declined"
    assert not answer.citations
    assert answer.closest and all((REPO_ROOT / f).is_file() for f in answer.closest)
    assert "will not guess" in answer.text


@pytest.mark.parametrize("question", ["", "   ", "x" * (MAX_QUESTION_CHARS + 1)])
def test_empty_or_oversized_questions_are_refused_with_a_reason(answerer: Answerer, question: str) -> None:
    with pytest.raises(QuestionError, match=r"empty|limit"):
        answerer.answer(question)


def test_question_set_is_big_enough_and_well_formed() -> None:
    entries = load_questions(QUESTIONS)
    assert len(entries) >= 40
    out_of_scope = [e for e in entries if not e.expect]
    assert len(out_of_scope) >= 5 and len(entries) - len(out_of_scope) >= 35
    for entry in entries:
        assert all(e.startswith("docs/runbooks/") and e.endswith(".md") for e in entry.expect), entry


def test_malformed_question_set_is_refused_naming_the_entry(tmp_path: Path) -> None:
    bad = tmp_path / "q.yaml"
    bad.write_text(yaml.safe_dump([{"question": "ok?", "expect": []}, {"question": "", "expect": []}]))
    with pytest.raises(QuestionSetError, match="entry 2"):
        load_questions(bad)


BM25_ONLY_EXACT_HIT_AT_1 = 42 / 45  # measured at 5e7c39b (issue 26's "today"), not tuned


def test_question_set_targets_on_the_runbooks_that_exist(answerer: Answerer) -> None:
    """The invariants hold whatever runbooks exist. On the questions that use the runbooks' words (all
    categories but "researchers' own words") hybrid keeps hit@3 >= 0.95 and is no worse than BM25 alone
    at hit@1 (issue 26)."""
    entries = load_questions(QUESTIONS)
    report = evaluate(answerer, entries)
    summary = report.summary()
    assert summary["citations"] > 0 and summary["citations_valid"] == 1.0, report.failures()
    assert summary["out_of_scope_declined"] >= 0.9, report.failures()
    assert summary["in_scope_scored"] >= 20, summary
    exact = [e for e in entries if e.expect and "own words" not in e.category]
    hybrid = evaluate(answerer, exact).summary()
    assert hybrid["hit_at_3"] >= 0.95, report.failures()
    # "No worse than today": the BM25-only chatbot this replaced put the right runbook first on 42 of
    # these 45 questions. (BM25 alone now gets 44/45: docs added since rank for one of them; hybrid
    # loses "cannot scrape the exporter ... node is up" to NodeDown, a known MiniLM confusion.)
    assert hybrid["hit_at_1"] >= BM25_ONLY_EXACT_HIT_AT_1, hybrid
    for result in report.results:
        if result.in_scope and not result.answer.declined:
            assert result.answer.citations, result.entry.question


def test_evaluate_command_prints_the_four_figures_as_json() -> None:
    import subprocess

    result = subprocess.run(
        [*FLEETSIGHT, "chatbot", "evaluate", "--questions", str(QUESTIONS), "--json"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=os.environ,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    for key in ("hit_at_1", "hit_at_3", "citations_valid", "out_of_scope_declined"):
        assert 0.0 <= figures[key] <= 1.0
    assert figures["questions"] == len(load_questions(QUESTIONS))


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        # Not in the question set the threshold was calibrated on.
        ("what is a good name for my cat", None),
        ("can you recommend a GPU for gaming", None),
        ("how much does an H100 cost", None),
        ("who is on call today", None),
        ("is n0007 ok? its IB port is down", "docs/runbooks/InfiniBandPortDown.md"),
        ("gpu-node-07 shows ECC errors", "docs/runbooks/GPUXidUncorrectable.md"),
    ],
)
def test_held_out_questions_are_declined_or_answered(
    answerer: Answerer, question: str, expected: str | None
) -> None:
    answer = answerer.answer(question, live=False)
    if expected is None:
        assert answer.declined, answer.cited_files
    else:
        assert expected in answer.cited_files[:3]
