"""What each check's tool printed, judged: a :class:`Verdict` (outcome, one-line summary, evidence).

Three outcomes (issue 41, "blind is not broken"). *passed* and *failed* are what the tool measured: a
test that says it failed, a bandwidth under its floor, a row remap pending. *unknown* is a check that
could not observe the node, with its ``reason`` (BLIND_REASONS): every parser takes the tool's raw text,
and output that is empty, truncated, not the tool's format, or holds a status word the parser does not
know, and a ``dcgmi diag`` that says it could not run (its ``runtime_error``), are unknown
("unreadable"), never a failure and never a pass. A check that cannot read its evidence has neither
shown the node healthy nor shown it broken.

No parser raises: each public one is wrapped so that an exception it did not expect (a shape of the
document nobody foresaw) becomes an unknown whose summary names the exception's type, not a traceback
in the runner. ``dcgm_diag`` is written to need no such rescue; ``parser.__wrapped__`` is the bare
function, which the tests hold to that."""

from __future__ import annotations

import functools
import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from prometheus_client.parser import text_string_to_metric_families

from fleetsight.dcgm import names_of

HEAD = 400  # characters of unreadable output kept as evidence

OUTCOMES = ("passed", "failed", "unknown")
# Why a check could not observe (an unknown's ``reason``): a small fixed set, so that it can be a label.
BLIND_REASONS = (
    "tool_missing",  # the command is not installed on the node (or not in the image)
    "timeout",  # the tool or the page did not answer in time
    "unreachable",  # connection refused, no route, DNS
    "unauthorised",  # 401/403, a missing or unreadable credentials file
    "tls",  # the certificate or the protocol does not match (an exporter's TLS set up differently)
    "not_published",  # the page is there but the fields the check reads are not (counters file)
    "unreadable",  # output that is not the tool's format, truncated, or words the parser does not know
    "not_run",  # the check cannot run this way (a pair check asked for on one node)
)


@dataclass
class Verdict:
    """``outcome`` is passed, failed or unknown; an unknown (the check could not observe the node) says
    why in ``reason`` (one of BLIND_REASONS) and never counts against the node."""

    outcome: str
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)
    reason: str = ""

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome {self.outcome!r} is not one of {', '.join(OUTCOMES)}")
        if (self.outcome == "unknown") != bool(self.reason):
            raise ValueError("an unknown names its reason, and only an unknown has one")

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"

    @classmethod
    def judged(cls, passed: bool, summary: str, evidence: dict[str, Any] | None = None) -> Verdict:
        """A verdict on what the tool saw: passed or failed."""
        return cls("passed" if passed else "failed", summary, evidence or {})

    @classmethod
    def blind(cls, reason: str, summary: str, evidence: dict[str, Any] | None = None) -> Verdict:
        if reason not in BLIND_REASONS:
            raise ValueError(f"reason {reason!r} is not one of {', '.join(BLIND_REASONS)}")
        return cls("unknown", summary, evidence or {}, reason)


def unreadable(what: str, why: str, text: str) -> Verdict:
    return Verdict.blind("unreadable", f"{what}: unreadable output ({why})", {"output_head": text[:HEAD]})


# ---------------------------------------------------------------------------------- no traceback
ParserT = TypeVar("ParserT", bound=Callable[..., Verdict])


def never_raises(what: str) -> Callable[[ParserT], ParserT]:
    """A parser that returns an unknown ("unreadable", the exception's type in the summary) where it
    would have raised. The bare parser stays reachable as ``__wrapped__``."""

    def wrap(parse: ParserT) -> ParserT:
        @functools.wraps(parse)
        def guarded(*args: Any, **kwargs: Any) -> Verdict:
            try:
                return parse(*args, **kwargs)
            except Exception as exc:  # the whole point: whatever the output held, a verdict comes back
                text = "\n".join(a for a in args if isinstance(a, str))
                detail = " ".join(str(exc).split())[:200]
                return Verdict.blind(
                    "unreadable",
                    f"{what}: unreadable output (the parser met {type(exc).__name__}: {detail})",
                    {"output_head": text[:HEAD], "parser_error": type(exc).__name__},
                )

        return cast(ParserT, guarded)

    return wrap


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


# ---------------------------------------------------------------------------------- dcgmi diag -j
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


# ---------------------------------------------------------------------------------- ib_write_bw
BW_HEADER = re.compile(r"BW average\[(Gb/sec|MB/sec)\]")


def ib_write_bw_gbits(text: str) -> float:
    """The average bandwidth of the largest message size, in Gb/s; ValueError when absent. perftest
    can print a warning line between the header and the figures ("Conflicting CPU frequency values
    detected"): only rows of numbers count, and only rows with every column of the header (#bytes,
    #iterations, then one per bracketed unit), so that a row cut short is not read as a figure."""
    header = BW_HEADER.search(text)
    if header is None:
        raise ValueError("no 'BW average[...]' header")
    line_start = text.rfind("\n", 0, header.start()) + 1
    line_end = text.find("\n", header.end())
    header_line = text[line_start : len(text) if line_end < 0 else line_end]
    columns = max(4, header_line.count("#") + header_line.count("["))
    rows = []
    for line in text[header.end() :].splitlines():
        parts = line.split()
        if len(parts) >= columns and parts[0].isdigit() and parts[1].isdigit():
            try:
                rows.append(float(parts[3]))
            except ValueError:
                continue
    if not rows or not math.isfinite(rows[-1]):
        raise ValueError("no result row after the header (truncated?)")
    value = rows[-1]
    return value if header.group(1) == "Gb/sec" else value * 8 / 1000  # MB/sec: 10^6 bytes


# perftest's words when the TCP handshake (management network) worked but the RDMA queue pair could not
# be brought up over the InfiniBand link: the tool and the partner answered, the link did not. That is
# evidence against the link (a port down on either end), not a blind spot.
LINK_FAILURES = ("Unable to Connect the HCA's through the link", "to RTR")


@never_raises("ib_write_bw")
def ib_write_bw(text: str, params: dict[str, Any]) -> Verdict:
    try:
        gbits = ib_write_bw_gbits(text)
    except ValueError as exc:
        if BW_HEADER.search(text) is None and any(words in text for words in LINK_FAILURES):
            evidence = {"output_head": text[:HEAD]}
            return Verdict.judged(False, "ib_write_bw: the link did not come up (queue pair)", evidence)
        return unreadable("ib_write_bw", str(exc), text)
    limit = float(params.get("min_gbits", 0))
    evidence = {"gbits": round(gbits, 2), "min_gbits": limit}
    if gbits < limit:
        return Verdict.judged(False, f"ib_write_bw {gbits:.1f} Gb/s < {limit:.0f}", evidence)
    return Verdict.judged(True, f"ib_write_bw {gbits:.1f} Gb/s", evidence)


# ---------------------------------------------------------------------------------- FleetSight's probe
# One line per GPU, then a closing line, so that a probe killed half-way is told from a short one:
#   fleetsight-probe v1 test=gemm gpu=0 dtype=bf16 tflops=702.4 seconds=30.0
#   fleetsight-probe v1 test=hbm gpu=0 bytes_per_second=2.93e12 seconds=30.0
#   fleetsight-probe v1 done gpus=8
PROBE_PREFIX = "fleetsight-probe v1 "


def _probe_fields(line: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in line[len(PROBE_PREFIX) :].split() if "=" in item)


@never_raises("probe")
def probe_lines(text: str, params: dict[str, Any]) -> Verdict:
    """The probe's lines (checks/gpu_probe.py). No closing line (killed, truncated), a count that does
    not match it, or a figure that is not a finite number: unknown. A GPU under the floor: failed."""
    metric, expected = str(params["metric"]), float(params["expected"])
    floor = expected * float(params["min_ratio"])
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith(PROBE_PREFIX)]
    done = [line for line in lines if line.split()[2:3] == ["done"]]
    if not done:
        return unreadable("probe", "no closing 'done' line (killed or truncated)", text)
    values: dict[str, float] = {}
    for line in lines:
        fields = _probe_fields(line)
        if "gpu" in fields and metric in fields:
            try:
                value = float(fields[metric])
            except ValueError:
                value = math.nan
            if not math.isfinite(value):
                return unreadable("probe", f"{metric}={fields[metric]!r} is not a number", text)
            values[fields["gpu"]] = value
    wanted = _probe_fields(done[-1]).get("gpus", "")
    if not wanted.isdigit():
        return unreadable("probe", f"the closing line names no GPU count ({done[-1]!r})", text)
    if not values or len(values) != int(wanted):
        return unreadable("probe", f"{len(values)} GPU results, the probe said {wanted}", text)
    slow = {gpu: v for gpu, v in values.items() if v < floor}
    evidence = {"metric": metric, "values": values, "expected": expected, "floor": floor}
    if slow:
        evidence["below_floor"] = slow
        worst = min(slow, key=slow.__getitem__)
        return Verdict.judged(False, f"GPU {worst} {metric} {slow[worst]:.4g} < {floor:.4g}", evidence)
    return Verdict.judged(True, f"{len(values)} GPUs >= {floor:.4g} {metric}", evidence)


# ---------------------------------------------------------------------------------- metric pages
def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of a Prometheus text page; ValueError when it is not one."""
    try:
        families = list(text_string_to_metric_families(text))
        return [(s.name, s.labels, s.value) for family in families for s in family.samples]
    except Exception as exc:  # the parser raises several types on bad text
        raise ValueError(f"not a Prometheus text page: {exc}") from exc


def _page(text: str) -> list[tuple[str, dict[str, str], float]]:
    """A page a check can read: an empty answer is no page (unreadable), not a page without the fields."""
    if not text.strip():
        raise ValueError("empty page")
    return samples(text)


def _by_gpu(page: list[tuple[str, dict[str, str], float]], field_name: str) -> dict[str, float]:
    """The field's value per GPU; under either name of one field the larger counts, and a number over a
    NaN (a NaN stays only where it is all there is)."""
    names = set(names_of(field_name))
    values: dict[str, float] = {}
    for name, labels, value in page:
        if name in names:
            gpu = labels.get("gpu", "?")
            old = values.get(gpu)
            if old is None or (math.isfinite(value) and (not math.isfinite(old) or value > old)):
                values[gpu] = value
    return values


def _not_numbers(*fields: dict[str, float]) -> list[str]:
    return sorted({gpu for values in fields for gpu, v in values.items() if not math.isfinite(v)})


def _shown(values: dict[str, float]) -> dict[str, float | None]:
    """Values as evidence (posted as JSON): a NaN or an infinity as null."""
    return {key: v if math.isfinite(v) else None for key, v in values.items()}


@never_raises("dcgm-exporter")
def row_remap(text: str, params: dict[str, Any]) -> Verdict:
    try:
        page = _page(text)
    except ValueError as exc:
        return unreadable("dcgm-exporter", str(exc), text)
    pending = _by_gpu(page, "DCGM_FI_DEV_ROW_REMAP_PENDING")
    failed = _by_gpu(page, "DCGM_FI_DEV_ROW_REMAP_FAILURE")
    rows = _by_gpu(page, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS")
    if not pending and not failed:
        return Verdict.blind("not_published", "row remap fields are not published (counters file?)")
    evidence = {
        "pending": _shown(pending),
        "failed": _shown(failed),
        "uncorrectable_remapped_rows": _shown(rows),
    }
    bad = sorted({g for g, v in pending.items() if v > 0} | {g for g, v in failed.items() if v > 0})
    if bad:
        return Verdict.judged(False, f"row remap pending or failed on GPU {', '.join(bad)}", evidence)
    if nan := _not_numbers(pending, failed):
        return unreadable("dcgm-exporter", f"row remap value not a number on GPU {', '.join(nan)}", text)
    return Verdict.judged(True, f"no pending or failed row remaps on {len(pending or failed)} GPUs", evidence)


@never_raises("dcgm-exporter")
def clock_events(text: str, params: dict[str, Any]) -> Verdict:
    try:
        page = _page(text)
    except ValueError as exc:
        return unreadable("dcgm-exporter", str(exc), text)
    reasons = _by_gpu(page, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
    if not reasons:
        return Verdict.blind(
            "not_published", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS is not published (counters file?)"
        )
    bad_bits = {int(bit): str(name) for bit, name in (params.get("bad_bits") or {}).items() if int(bit) > 0}
    readable = {gpu: int(value) for gpu, value in reasons.items() if math.isfinite(value)}
    found = {
        gpu: [name for bit, name in bad_bits.items() if value // bit % 2 == 1]
        for gpu, value in readable.items()
    }
    found = {gpu: names for gpu, names in found.items() if names}
    evidence = {"reasons": readable, "bad": found}
    if found:
        gpu = sorted(found)[0]
        more = f" (and {len(found) - 1} more GPUs)" if len(found) > 1 else ""
        return Verdict.judged(False, f"GPU {gpu}: {', '.join(found[gpu])}{more}", evidence)
    if nan := _not_numbers(reasons):
        return unreadable("dcgm-exporter", f"clock event reasons not a number on GPU {', '.join(nan)}", text)
    return Verdict.judged(True, f"no slowdown reasons on {len(reasons)} GPUs", evidence)


def _rise(old: float, new: float) -> float:
    if not math.isfinite(old):
        return math.nan
    return new - old if new >= old else new


@never_raises("dcgm-exporter")
def link_errors(before: str, after: str, params: dict[str, Any]) -> Verdict:
    try:
        first, second = _page(before), _page(after)
    except ValueError as exc:
        return unreadable("dcgm-exporter", str(exc), before + after)
    limits: dict[str, float] = {str(k): float(v) for k, v in (params.get("max_increase") or {}).items()}
    published, over, missing, nan = {}, {}, [], []
    for field_name, limit in limits.items():
        old, new = _by_gpu(first, field_name), _by_gpu(second, field_name)
        if not new:
            missing.append(field_name)
            continue
        # a counter that went down was reset (driver reload): count from zero; a GPU without a finite
        # first value has no window (NaN: unreadable, unless another counter rose)
        rise = {g: _rise(old.get(g, math.nan), v) for g, v in new.items()}
        published[field_name] = rise
        over.update({f"{field_name} GPU {g}": r for g, r in rise.items() if r > limit})
        nan += [f"{field_name} GPU {g}" for g, r in rise.items() if not math.isfinite(r)]
    evidence = {
        "increase": {k: _shown(v) for k, v in published.items()},
        "not_published": missing,
        "limits": limits,
    }
    if not published:
        return Verdict.blind(
            "not_published", "no NVLink/PCIe error counter is published (counters file?)", evidence
        )
    if over:
        first_key = sorted(over)[0]
        return Verdict.judged(False, f"{first_key} rose by {over[first_key]:.0f} in the window", evidence)
    if nan:
        return unreadable("dcgm-exporter", f"not a number: {', '.join(nan[:3])}", before + after)
    return Verdict.judged(True, f"{len(published)} error counters steady over the window", evidence)


@never_raises("node agent")
def h2d_bandwidth(text: str, params: dict[str, Any], now: float | None = None) -> Verdict:
    try:
        page = _page(text)
    except ValueError as exc:
        return unreadable("node agent", str(exc), text)
    now = time.time() if now is None else now
    values = {
        labels.get("gpu", "?"): value
        for name, labels, value in page
        if name == "fleetsight_pcie_host_to_device_bandwidth_bytes_per_second"
    }
    stamp_name = "fleetsight_pcie_host_to_device_bandwidth_timestamp_seconds"
    stamps = [v for name, _, v in page if name == stamp_name and math.isfinite(v)]
    if not values:
        return Verdict.blind(
            "not_published", "the node agent publishes no host-to-device bandwidth (probe off?)"
        )
    age = now - max(stamps) if stamps else math.inf
    floor = float(params["min_bytes_per_second"])
    evidence = {
        "bytes_per_second": _shown(values),
        "age_seconds": round(age, 1) if math.isfinite(age) else None,
        "floor": floor,
    }
    if not age <= float(params["max_age_seconds"]):
        return Verdict.blind(
            "not_published", f"the last host-to-device measurement is {age:.0f} s old", evidence
        )
    slow = {g: v for g, v in values.items() if v < floor}
    if slow:
        gpu = min(slow, key=slow.__getitem__)
        summary = f"GPU {gpu} host-to-device {slow[gpu] / 1e9:.1f} GB/s < {floor / 1e9:.0f}"
        return Verdict.judged(False, summary, evidence)
    if nan := _not_numbers(values):
        return unreadable(
            "node agent", f"host-to-device bandwidth not a number on GPU {', '.join(nan)}", text
        )
    return Verdict.judged(True, f"{len(values)} GPUs >= {floor / 1e9:.0f} GB/s host-to-device", evidence)


ONE_SHOT: dict[str, Callable[[str, dict[str, Any]], Verdict]] = {
    "dcgm_diag": dcgm_diag,
    "ib_write_bw": ib_write_bw,
    "probe_lines": probe_lines,
    "row_remap": row_remap,
    "clock_events": clock_events,
    "h2d_bandwidth": h2d_bandwidth,
}
