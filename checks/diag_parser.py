"""``dcgmi diag -r N -j``, DCGM 3.x and 4.x, judged (tests/fixtures/dcgmi/PROVENANCE.md): the JSON
document found in what dcgmi printed, every test's status words over every iteration, a verdict.

Its own module because DCGM's diagnostic documents are the one tool output with a schema of their own
across versions (roots, iterations, entity or GPU ids, warnings); ``dcgm_diag`` is written to need no
rescue from :func:`~checks.outcomes.never_raises`, and ``dcgm_diag.__wrapped__`` is the bare function,
which the tests hold to that.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, cast

from .outcomes import HEAD, Verdict, never_raises, unreadable


def _text(value: Any, limit: int = 200) -> str:
    """A JSON scalar as the words it stands for; anything else shortened, never an exception."""
    if value is None:
        return ""
    if isinstance(value, str):
        text = value
    elif isinstance(value, bool | int | float):
        text = str(value)
    else:
        text = json.dumps(value, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# The document's root: DCGM 4 "DCGM Diagnostic", DCGM 3 "DCGM GPU Diagnostic" (NvvsJsonStrings.h
# NVVS_NAME). `dcgmi diag -i N` wraps one document per run in {"iterations": [...], "Overall Result": ...}.
DIAG_ROOTS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")
# Status words, read case-insensitively. dcgmi writes Pass, Skip and Fail in both majors, and writes a
# warning as "Fail" (dcgmi/Diag.cpp HelperDisplayDiagResult); nvvs's own document says PASS, WARN, SKIP,
# FAIL (nvvs/include/JsonResult.hpp); 4.5 added "Not Run", which dcgmi leaves out of its JSON. Skip and
# not run: the test does not apply to this node, which is no evidence against it.
PASSING = {"pass", "warn", "skip", "not run"}
FAILING = {"fail"}
SKIPPING = {"skip", "not run"}
MAX_CANDIDATES = 64  # where a JSON object may start, tried at most


def _is_diag(value: Any) -> bool:
    return isinstance(value, dict) and (
        any(isinstance(value.get(root), dict) for root in DIAG_ROOTS)
        or isinstance(value.get("iterations"), list)
    )


def _json_document(text: str) -> dict[str, Any]:
    """The diag's JSON object in what dcgmi printed. Text may come before it ("Successfully ran
    diagnostic for group.", a log line) or after it; a document cut short is told from one that is not
    JSON at all only by the message."""
    first = text.find("{")
    if first < 0:
        raise ValueError("no JSON object")
    decoder = json.JSONDecoder()
    found: Any = None
    error: Exception | None = None
    try:
        found, _ = decoder.raw_decode(text, first)
    except (ValueError, RecursionError) as exc:
        error = exc
    if _is_diag(found):
        return cast(dict[str, Any], found)
    # A line before the document that holds a brace of its own: try the lines that open an object in
    # their first column (jsoncpp writes the root there and indents everything inside it), and only
    # one that runs to the end of the output, so that one iteration of `-i N` inside a document cut
    # short is never taken for the document.
    for tries, line in enumerate(re.finditer(r"^\{", text, re.MULTILINE)):
        if tries >= MAX_CANDIDATES:
            break
        if line.start() <= first:
            continue
        try:
            value, end = decoder.raw_decode(text, line.start())
        except (ValueError, RecursionError):
            continue
        if _is_diag(value) and "}" not in text[end:]:
            return cast(dict[str, Any], value)
    if isinstance(found, dict):
        return found
    raise ValueError(f"truncated or not JSON: {_text(error)}")


def _entries(value: Any) -> tuple[list[dict[str, Any]], int]:
    """The objects of a JSON list, and how many of its items were neither an object nor null. Nulls are
    skipped: nvvs and dcgmi 3.x leave one where a test or a GPU did not run. One object where a list
    was expected stands for itself."""
    if value is None:
        return [], 0
    if isinstance(value, dict):
        return [value], 0
    if isinstance(value, list):
        items = [v for v in value if isinstance(v, dict)]
        return items, sum(1 for v in value if v is not None and not isinstance(v, dict))
    return [], 1


def _word(status: Any) -> str | None:
    """passed, failed, skipped, or None for a word (or a value) the parser does not know."""
    if not isinstance(status, str):
        return None
    word = " ".join(status.split()).lower()
    if word in FAILING:
        return "failed"
    if word in SKIPPING:
        return "skipped"
    return "passed" if word in PASSING else None


def _entity(result: dict[str, Any]) -> str:
    """DCGM 4 names an entity (entity_group, entity_id); DCGM 3 a GPU (gpu_id in 3.3, gpu_ids before,
    and in nvvs's own document, a number or a list like "0,1,2,3")."""
    if "entity_id" in result or "entity_group" in result:
        return (
            f"{_text(result.get('entity_group'), 20) or 'GPU'} {_text(result.get('entity_id'), 40)}".strip()
        )
    for key in ("gpu_id", "gpu_ids"):
        if key in result:
            return f"GPU {_text(result[key], 40)}".strip()
    return "node"


def _warning_text(warning: Any) -> str:
    if isinstance(warning, dict):  # DCGM 3.3's Deployment tests put the text under "warnings"
        for key in ("warning", "warnings", "message"):
            if isinstance(warning.get(key), str):
                return _text(warning[key], HEAD)
    return _text(warning, HEAD)


def _error_id(value: Any) -> Any:
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return value if isinstance(value, int | float | str) and not isinstance(value, bool) else _text(value)


def _diag_failure(category: str, test: str, result: dict[str, Any], entity: str | None) -> dict[str, Any]:
    """What a failed result (or a failed test summary, ``entity`` None) says: DCGM 4 and 3.3 give a list
    of warning objects, 3.0-3.2 one string."""
    warnings = result.get("warnings")
    listed = warnings if isinstance(warnings, list) else [] if warnings is None else [warnings]
    return {
        "category": category,
        "test": test,
        "entity": entity or "summary",
        "error_ids": [
            _error_id(w["error_id"]) for w in listed if isinstance(w, dict) and w.get("error_id") is not None
        ],
        "warnings": [_warning_text(w) for w in listed if w is not None][:5],
    }


@dataclass
class _Diag:
    """What the documents of one `dcgmi diag` run said, over every iteration."""

    tests: int = 0  # tests that gave at least one status word the parser knows
    skipped: list[str] = field(default_factory=list)  # tests whose every word was skip
    failures: list[dict[str, Any]] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    runtime_errors: list[str] = field(default_factory=list)

    def read(self, root: dict[str, Any]) -> None:
        if root.get("runtime_error"):
            self.runtime_errors.append(_text(root["runtime_error"], 300))
        categories, bad = _entries(root.get("test_categories"))
        if bad:
            self.unknown.append(f"test_categories: {bad} entries that are not objects")
        for category in categories:
            tests, bad = _entries(category.get("tests"))
            if bad:
                self.unknown.append(
                    f"{_text(category.get('category'), 40)}: {bad} tests that are not objects"
                )
            for test in tests:
                self._test(_text(category.get("category"), 60), test)

    def _test(self, category: str, test: dict[str, Any]) -> None:
        name = _text(test.get("name"), 80) or "?"
        results, bad = _entries(test.get("results"))
        if bad:
            self.unknown.append(f"{name}: {bad} results that are not objects")
        words: list[str] = []
        failed = False
        for result in results:
            if "status" not in result:
                self.unknown.append(f"{name}: a result without a status")
                continue
            word = _word(result["status"])
            if word is None:
                self.unknown.append(f"{name}: {_text(result['status'], 40)!r}")
                continue
            words.append(word)
            if word == "failed":
                failed = True
                self.failures.append(_diag_failure(category, name, result, _entity(result)))
        summary = test.get("test_summary")
        if isinstance(summary, dict) and "status" in summary:
            word = _word(summary["status"])
            if word is None:
                self.unknown.append(f"{name} summary: {_text(summary['status'], 40)!r}")
            else:
                words.append(word)
                if word == "failed" and not failed:  # e.g. an error that belongs to no one entity
                    self.failures.append(_diag_failure(category, name, summary, None))
        elif summary is not None:
            self.unknown.append(f"{name}: a test_summary without a status")
        if words:
            self.tests += 1
            if all(w == "skipped" for w in words):
                self.skipped.append(name)


def _diag_version(data: dict[str, Any], root: dict[str, Any]) -> str | None:
    """DCGM 4 in metadata, dcgmi 3.x at the top, nvvs and dcgmi's error document inside the root."""
    meta = data.get("metadata")
    for holder in (meta if isinstance(meta, dict) else {}, data, root):
        version = holder.get("version")
        if isinstance(version, str | int | float) and not isinstance(version, bool) and str(version):
            return str(version)
    return None


def _diag_roots(data: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """(documents, their roots, how many runs had no readable document): the document itself, or each
    iteration of `dcgmi diag -i N`."""
    iterations = data.get("iterations")
    runs = iterations if isinstance(iterations, list) else [data]
    documents = [d for d in runs if isinstance(d, dict)]  # a null: a run that printed no document
    pairs = [(d, next((d[r] for r in DIAG_ROOTS if isinstance(d.get(r), dict)), None)) for d in documents]
    kept = [(d, r) for d, r in pairs if r is not None]
    return [d for d, _ in kept], [r for _, r in kept], len(runs) - len(kept)


def _names(failures: list[dict[str, Any]], most: int = 4) -> str:
    names = sorted({f"{f['test']} ({f['entity']})" for f in failures})
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


@never_raises("dcgmi diag")
def dcgm_diag(text: str, params: dict[str, Any]) -> Verdict:
    """`dcgmi diag -r N -j`, DCGM 3.x and 4.x (tests/fixtures/dcgmi/PROVENANCE.md). A test's fail
    (of any GPU, or of its summary) fails the check; pass, warn and skip pass it; a document that says
    the diag could not run, is cut short, or holds a word this parser does not know, is unknown."""
    try:
        data = _json_document(text)
    except ValueError as exc:
        return unreadable("dcgmi diag", str(exc), text)
    documents, roots, unread = _diag_roots(data)
    if not roots:
        return unreadable("dcgmi diag", f"no {DIAG_ROOTS[0]!r} (nor {DIAG_ROOTS[1]!r}) object", text)
    diag = _Diag()
    if unread:
        diag.unknown.append(f"iterations: {unread} runs without a diag document")
    for root in roots:
        diag.read(root)
    evidence: dict[str, Any] = {
        "dcgm_version": _diag_version(documents[0], roots[0]),
        "tests": diag.tests,
        "failures": diag.failures,
    }
    if len(roots) > 1 or "iterations" in data:
        evidence["iterations"] = len(roots)
    overall = data.get("Overall Result")  # only with iterations: Pass, or Fail and dcgmi's error string
    if diag.failures:
        if diag.unknown:
            evidence["unknown_status"] = diag.unknown[:20]
        return Verdict.judged(False, f"dcgmi diag failed: {_names(diag.failures)}", evidence)
    if diag.runtime_errors:
        evidence["runtime_error"] = diag.runtime_errors[0]
        return Verdict.blind("unreadable", f"dcgmi diag could not run: {diag.runtime_errors[0]}", evidence)
    if diag.unknown:
        evidence["unknown_status"] = diag.unknown[:20]
        understood = ", ".join(diag.unknown[:3])
        return Verdict.blind("unreadable", f"dcgmi diag: status words not understood: {understood}", evidence)
    if overall is not None and _word(overall) != "passed":
        evidence["overall_result"] = _text(overall, 40)
        why = _text(data.get("warning") or data.get("Warning"), 200)
        summary = f"dcgmi diag: Overall Result {_text(overall, 40)!r} but no test failed" + (
            f" ({why})" if why else ""
        )
        return Verdict.blind("unreadable", summary, evidence)
    if diag.tests == 0:
        return Verdict.blind("unreadable", "dcgmi diag: no test results in the output", evidence)
    evidence["skipped"] = diag.skipped
    skipped = f", {len(diag.skipped)} of them skipped" if diag.skipped else ""
    return Verdict.judged(True, f"dcgmi diag: {diag.tests} tests passed{skipped}", evidence)
