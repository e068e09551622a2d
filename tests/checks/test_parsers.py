"""The checks' parsers on real tool output (tests/fixtures/dcgmi/PROVENANCE.md) and on what breaks:
truncated, garbage, unknown status words, shapes nobody planned for. A measured failure is *failed*;
output the parser cannot read (or a diag that says it could not run) is *unknown* with its reason,
never a failure, never a pass, and never a crash."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from checks import diag_parser, outcomes, parsers
from checks.catalog import CatalogError, load_catalog
from checks.plan import port_verdicts, round_robin
from checks.service import load_policy
from twin import checks as twin_checks

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dcgmi"
GB10 = (FIXTURES / "dgx-spark-gb10-r1.json").read_text()
EXCERPT = (FIXTURES / "dcgm-issue-215-r3-excerpt.txt").read_text()


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_real_gb10_level1_document_fails_with_dcgms_own_reason() -> None:
    verdict = diag_parser.dcgm_diag("Successfully ran diagnostic for group.\n" + GB10, {})
    assert verdict.outcome == "failed" and not verdict.reason
    assert verdict.summary == "dcgmi diag failed: software (GPU 0)"
    failure = verdict.evidence["failures"][0]
    assert failure["error_ids"] == [29] and "Persistence mode" in failure["warnings"][0]
    assert verdict.evidence["dcgm_version"] == "4.2.3"


def test_real_level3_test_object_passes_inside_a_document_and_is_unknown_alone() -> None:
    test = json.loads(EXCERPT.strip().rstrip(","))
    document = {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [test]}]}}
    assert diag_parser.dcgm_diag(json.dumps(document), {}).outcome == "passed"
    alone = diag_parser.dcgm_diag(EXCERPT, {})  # as pasted in the issue: a truncated capture, no document
    assert (alone.outcome, alone.reason) == ("unknown", "unreadable")
    assert "no 'DCGM Diagnostic'" in alone.summary


# Every capture or document under tests/fixtures/dcgmi/ (PROVENANCE.md: where each comes from) and what
# the check makes of it: (file, outcome, the summary after "dcgmi diag", the DCGM version it names).
DIAG_FIXTURES = [
    ("dgx-spark-gb10-r1.json", "failed", " failed: software (GPU 0)", "4.2.3"),
    ("dcgm-issue-215-r3-excerpt.txt", "unknown", ": unreadable output (no 'DCGM Diagnostic'", None),
    ("nvvs-3.1.0-real-output.txt", "passed", ": 10 tests passed", "3.1.0"),
    (
        "nvvs-3.3.9-per-gpu-sm-stress-fail.json",
        "failed",
        " failed: sm_stress (GPU 0), sm_stress (GPU 2), sm_stress (GPU 3)",
        "1.7",
    ),
    ("dcgmi-3.1.8-r2-pcie-width-fail.json", "failed", " failed: PCIe (GPU 1)", "3.1.8"),
    (
        "dcgmi-3.3.9-r1-persistence-warn-written-fail.json",
        "failed",
        " failed: Persistence Mode (GPU 0)",
        "3.3.9",
    ),
    ("dcgmi-3.3.9-r3-pass-skip.json", "passed", ": 15 tests passed, 1 of them skipped", "3.3.9"),
    ("dcgmi-3.3.9-r1-i2-iterations-pass.json", "passed", ": 18 tests passed", "3.3.9"),
    (
        "dcgmi-3.3.9-runtime-error.json",
        "unknown",
        " could not run: Error: Diagnostic can only be performed on a homogeneous group of GPUs.",
        "3.3.9",
    ),
    ("dcgmi-4.2.3-r3-pass-skip.json", "passed", ": 8 tests passed, 1 of them skipped", "4.2.3"),
    ("dcgmi-4.2.3-memtest-thermal-fail.json", "failed", " failed: memtest (GPU 0)", "4.2.3"),
    (
        "dcgmi-4.2.3-runtime-error.json",
        "unknown",
        " could not run: Error: Diagnostic could not be run while DCGM is paused.",
        "4.2.3",
    ),
    ("dcgmi-4.2.3-host-engine-down.txt", "unknown", ": unreadable output (no JSON object)", None),
]


def test_every_fixture_is_listed_with_its_provenance() -> None:
    provenance = fixture("PROVENANCE.md")
    names = {p.name for p in FIXTURES.iterdir() if p.name != "PROVENANCE.md"}
    assert names == {name for name, *_ in DIAG_FIXTURES}
    for name in names:
        assert f"`{name}`" in provenance, name


@pytest.mark.parametrize(("name", "outcome", "summary", "version"), DIAG_FIXTURES)
def test_each_dcgm_3_and_4_document_gives_its_outcome(
    name: str, outcome: str, summary: str, version: str | None
) -> None:
    verdict = diag_parser.dcgm_diag(fixture(name), {})
    assert verdict.outcome == outcome, verdict
    assert verdict.reason == ("unreadable" if outcome == "unknown" else "")
    if outcome == "unknown":
        assert verdict.summary.startswith("dcgmi diag" + summary), verdict.summary
    else:
        assert verdict.summary == "dcgmi diag" + summary
    if version is not None:
        assert verdict.evidence["dcgm_version"] == version
    if outcome == "failed":  # every failure names its test and its entity
        assert all(f["test"] and f["entity"] for f in verdict.evidence["failures"])


def test_the_failures_carry_dcgms_own_error_ids_and_words() -> None:
    """Error ids as each writer spells them: DCGM 4 and 3.3 a list of warning objects (3.3's Deployment
    tests with the text under "warnings"), 3.0-3.2 one string and no id; nvvs's own document as
    NVIDIA's TestDiagManager expects (sm_stress failed on GPUs 0, 2 and 3, not 1)."""
    cases = {
        "dcgmi-3.3.9-r1-persistence-warn-written-fail.json": (
            [29],
            "Persistence mode for GPU 0 is disabled.",
        ),
        "dcgmi-3.1.8-r2-pcie-width-fail.json": ([], "GPU 1 is running at PCI link width 8X"),
        "dcgmi-4.2.3-memtest-thermal-fail.json": ([42], "Temperature 1000 of GPU 0 exceeded"),
        "nvvs-3.3.9-per-gpu-sm-stress-fail.json": ([50], "Max stress level of 2128.7"),
    }
    for name, (error_ids, words) in cases.items():
        first = diag_parser.dcgm_diag(fixture(name), {}).evidence["failures"][0]
        assert first["error_ids"] == error_ids and first["warnings"][0].startswith(words), name
    stress_fail = fixture("nvvs-3.3.9-per-gpu-sm-stress-fail.json")
    stressed = diag_parser.dcgm_diag(stress_fail, {}).evidence["failures"]
    assert [f["entity"] for f in stressed] == ["GPU 0", "GPU 2", "GPU 3"]


def test_the_dcgm4_memtest_document_is_the_one_nvidias_own_test_asserts() -> None:
    """NVIDIA/DCGM testing/python3/tests/test_dcgm_diag.py (v4.2.3) helper_per_gpu_responses_dcgmi:
    what `dcgmi diag -r memtest -j` prints with an over-temperature injected on the first GPU."""
    output = json.loads(fixture("dcgmi-4.2.3-memtest-thermal-fail.json"))
    categories = output["DCGM Diagnostic"]["test_categories"]
    assert len(categories) == 2 and categories[1]["category"] == "Stress"
    test = categories[1]["tests"][0]
    assert test["name"] == "memtest" and len(test["results"]) >= 2
    assert test["test_summary"]["status"] == "Fail"
    first, second = test["results"][0], test["results"][1]
    assert (first["entity_group"], first["entity_id"], first["status"]) == ("GPU", 0, "Fail")
    warning = first["warnings"][0]  # DCGM_FR_TEMP_VIOLATION, DCGM_FR_EC_HARDWARE_THERMAL, DCGM_ERROR_MONITOR
    assert (warning["error_id"], warning["error_category"], warning["error_severity"]) == (42, 9, 1)
    assert second["status"] == "Pass"


# The required keys of DCGM 3.3's schema (NVIDIA/DCGM testing/python3/dcgm_diag_schema.json at v3.3.9),
# transcribed: the top level's, a test's, a result's.
DIAG3_TOP = (
    "DCGM GPU Diagnostic",
    "Driver Version Detected",
    "GPU Device IDs",
    "GPU Device Serials",
    "version",
)


def schema3_problems(document: dict) -> list[str]:  # type: ignore[type-arg]
    problems = [f"lacks {k}" for k in DIAG3_TOP if k not in document]
    for category in document.get("DCGM GPU Diagnostic", {}).get("test_categories", []):
        problems += [f"category lacks {k}" for k in ("category", "tests") if k not in category]
        for test in category.get("tests", []):
            problems += [f"test lacks {k}" for k in ("name", "results") if k not in test]
            problems += ["result lacks status" for r in test.get("results", []) if "status" not in r]
    return problems


def test_the_documents_built_from_dcgmis_writers_have_their_schemas_keys() -> None:
    for name in ("dcgmi-4.2.3-r3-pass-skip.json", "dcgmi-4.2.3-memtest-thermal-fail.json"):
        assert schema_problems(json.loads(fixture(name))) == [], name
    for name in ("dcgmi-3.3.9-r3-pass-skip.json", "dcgmi-3.3.9-r1-persistence-warn-written-fail.json"):
        assert schema3_problems(json.loads(fixture(name))) == [], name
    for iteration in json.loads(fixture("dcgmi-3.3.9-r1-i2-iterations-pass.json"))["iterations"]:
        assert schema3_problems(iteration) == []


# The required keys of NVIDIA/DCGM testing/python3/dcgm_diag_schema.json (the document `dcgmi diag -j`
# prints at every level; tests/fixtures/dcgmi/PROVENANCE.md), transcribed: key -> what it must hold.
DIAG_REQUIRED = {
    "test": ("name", "results", "test_summary"),
    "result": ("entity_group", "entity_group_id", "entity_id", "status"),
    "warning": ("error_category", "error_id", "error_severity", "warning"),
    "entity_group": ("entities", "entity_group", "entity_group_id"),
    "entity": ("device_id", "entity_id"),
}


def schema_problems(document: dict) -> list[str]:  # type: ignore[type-arg]
    """What a diag document lacks of the schema's required keys (empty: it has them all)."""
    problems = [] if isinstance(document.get("DCGM Diagnostic"), dict) else ["no 'DCGM Diagnostic'"]
    for category in document.get("DCGM Diagnostic", {}).get("test_categories", []):
        problems += [f"category lacks {k}" for k in ("category", "tests") if k not in category]
        for test in category.get("tests", []):
            problems += [f"test lacks {k}" for k in DIAG_REQUIRED["test"] if k not in test]
            problems += [] if "status" in test.get("test_summary", {}) else ["test_summary lacks status"]
            for result in test.get("results", []):
                problems += [f"result lacks {k}" for k in DIAG_REQUIRED["result"] if k not in result]
                for warning in result.get("warnings", []):
                    problems += [f"warning lacks {k}" for k in DIAG_REQUIRED["warning"] if k not in warning]
    for group in document.get("entity_groups", []):
        problems += [f"entity group lacks {k}" for k in DIAG_REQUIRED["entity_group"] if k not in group]
        for entity in group.get("entities", []):
            problems += [f"entity lacks {k}" for k in DIAG_REQUIRED["entity"] if k not in entity]
    problems += [] if "version" in document.get("metadata", {}) else ["metadata lacks version"]
    return problems


def diag_tests(document: dict) -> set[str]:  # type: ignore[type-arg]
    return {t["name"] for c in document["DCGM Diagnostic"]["test_categories"] for t in c["tests"]}


def test_dcgm4_levels_memtest_only_at_level_4_and_the_level_4_document_reads_the_same() -> None:
    """DCGM 4's suites (NVIDIA/DCGM nvvs/src/NvidiaValidationSuite.cpp FillTestVectors, v4.2.3): each
    level holds the one below; memtest and the pulse test run at level 4 only. The twin answers so, a
    level-4 document has the schema's shape (the real GB10 capture passes the same check), and silent HBM
    corruption fails level 4's memtest with DCGM's own error (DCGM_FR_MEMORY_MISMATCH, 58) and passes
    levels 1-3, as on a real node."""
    assert schema_problems(json.loads(GB10)) == []
    levels = {level: twin_checks.dcgmi_diag(level, []) for level in (1, 2, 3, 4)}
    assert diag_tests(levels[1]) == {"software"}
    assert diag_tests(levels[2]) == {"software", "memory", "pcie"}
    assert diag_tests(levels[3]) - diag_tests(levels[2]) == {
        "diagnostic", "nvbandwidth", "memory_bandwidth", "targeted_stress", "targeted_power",
    }  # fmt: skip
    assert diag_tests(levels[4]) - diag_tests(levels[3]) == {"memtest", "pulse_test"}
    for level, document in levels.items():
        assert schema_problems(document) == [], level
        assert diag_parser.dcgm_diag(json.dumps(document), {}).passed, level
    fault = [{"kind": "hbm_silent_corruption", "gpu": 2}]
    for level in (1, 2, 3):
        assert diag_parser.dcgm_diag(json.dumps(twin_checks.dcgmi_diag(level, fault)), {}).passed, level
    document = twin_checks.dcgmi_diag(4, fault)
    assert schema_problems(document) == []
    verdict = diag_parser.dcgm_diag("Successfully ran diagnostic for group.\n" + json.dumps(document), {})
    assert verdict.outcome == "failed" and verdict.summary == "dcgmi diag failed: memtest (GPU 2)"
    (failure,) = verdict.evidence["failures"]
    assert failure["category"] == "Stress" and failure["error_ids"] == [58]
    assert failure["warnings"] == [
        "A memory mismatch was detected on GPU 2, but no error was reported by CUDA or NVML."
    ]


def test_the_checks_after_hbm_faults_run_dcgms_memtest() -> None:
    """checks/policy.yml: after an HBM fault the node must pass a DCGM level that runs memtest (4 in DCGM
    4), not level 3, which never runs it; the catalogue's dcgm_diag_rN runs `dcgmi diag -r N`."""
    catalog, policy = load_catalog(), load_policy()
    levels = {
        name: int(check.args[check.args.index("-r") + 1])
        for name, check in catalog.items()
        if check.parser == "dcgm_diag"
    }
    assert levels == {"dcgm_diag_r1": 1, "dcgm_diag_r2": 2, "dcgm_diag_r3": 3, "dcgm_diag_r4": 4}
    assert (
        catalog["dcgm_diag_r4"].intrusive
        and catalog["dcgm_diag_r4"].seconds > catalog["dcgm_diag_r3"].seconds
    )
    with_memtest = {
        n for n, level in levels.items() if "memtest" in diag_tests(twin_checks.dcgmi_diag(level, []))
    }
    assert with_memtest == {"dcgm_diag_r4"}
    for signal in ("GPURowRemapPending", "GPURowRemapFailed", "GPUXidUncorrectable"):
        assert with_memtest & set(policy["after"][signal]), signal
    assert "dcgm_diag_r3" in policy["after"]["NVSwitchFatal"]  # level 3 where no memory fault is in play


GB10_DOC = json.loads(GB10)


def with_status(word: Any) -> str:
    document = copy.deepcopy(GB10_DOC)
    document["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["results"][0]["status"] = word
    document["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["test_summary"]["status"] = "Pass"
    return json.dumps(document)


ITERATIONS = json.loads(fixture("dcgmi-3.3.9-r1-i2-iterations-pass.json"))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "no JSON object"),
        ("Error: unable to connect to host engine at 127.0.0.1", "no JSON object"),
        (GB10[: len(GB10) // 2], "truncated or not JSON"),
        (GB10.replace('"Fail"', '"Inconclusive"'), "status words not understood"),
        (with_status(""), "status words not understood"),
        (with_status(3), "status words not understood"),
        ('{"DCGM Diagnostic": {"test_categories": []}}', "no test results"),
        ('{"DCGM Diagnostic": {"test_categories": [{"tests": [{"name": "software"}]}]}}', "no test results"),
        ('{"DCGM Diagnostic": {"runtime_error": "Couldn\'t find the GPUs"}}', "could not run"),
        (
            '{"DCGM GPU Diagnostic": {"runtime_error": "host engine down", "version": "3.3.9"}}',
            "could not run",
        ),
        ("[1, 2]", "no JSON object"),
        ('{"DCGM Diagnostic": [1, 2]}', "no 'DCGM Diagnostic'"),
        (json.dumps({**ITERATIONS, "Overall Result": "Fail", "warning": "Timeout"}), "Overall Result 'Fail'"),
        (json.dumps({"iterations": [None], "Overall Result": "Pass"}), "no 'DCGM Diagnostic'"),
        (json.dumps({**ITERATIONS, "iterations": [*ITERATIONS["iterations"], None]}), "runs without"),
    ],
)
def test_unreadable_diag_output_is_unknown_with_the_reason(text: str, why: str) -> None:
    verdict = diag_parser.dcgm_diag(text, {})
    assert (verdict.outcome, verdict.reason) == ("unknown", "unreadable"), verdict
    assert why in verdict.summary


def test_a_failure_is_failed_even_beside_a_word_the_parser_does_not_know() -> None:
    document = copy.deepcopy(GB10_DOC)
    tests = document["DCGM Diagnostic"]["test_categories"][0]["tests"]
    tests.append({"name": "pcie", "results": [{"entity_group": "GPU", "entity_id": 0, "status": "Maybe"}]})
    verdict = diag_parser.dcgm_diag(json.dumps(document), {})
    assert verdict.outcome == "failed" and verdict.summary == "dcgmi diag failed: software (GPU 0)"
    assert verdict.evidence["unknown_status"] == ["pcie: 'Maybe'"]


def test_skip_warn_and_nvvs_spellings_pass_and_a_failed_summary_alone_fails() -> None:
    for word in ("Skip", "WARN", "PASS", "skip", "Not Run"):
        assert diag_parser.dcgm_diag(with_status(word), {}).outcome == "passed", word
    document = copy.deepcopy(GB10_DOC)
    test = document["DCGM Diagnostic"]["test_categories"][0]["tests"][0]
    test["results"][0]["status"] = "Pass"
    test["test_summary"]["warnings"] = [{"error_id": 29, "warning": "a global warning"}]
    verdict = diag_parser.dcgm_diag(json.dumps(document), {})  # DCGM 4: an error of no one entity
    assert verdict.outcome == "failed" and verdict.summary == "dcgmi diag failed: software (summary)"
    assert verdict.evidence["failures"][0]["error_ids"] == [29]


def test_text_around_the_document_and_a_brace_in_a_line_before_it() -> None:
    r3 = fixture("dcgmi-4.2.3-r3-pass-skip.json")
    for text in (
        "Successfully ran diagnostic for group.\n" + r3,
        "WARNING {nvvs}: deprecated\n" + r3 + "\n(exit 0)\n",
        "журнал: ✓ {\n" + r3,
    ):
        assert diag_parser.dcgm_diag(text, {}).outcome == "passed"
    # one iteration inside an iterations document cut short is not the document
    iterations = fixture("dcgmi-3.3.9-r1-i2-iterations-pass.json")
    cut = diag_parser.dcgm_diag(iterations[: iterations.rindex('"Overall Result"') - 5], {})
    assert cut.outcome == "unknown"


def test_every_cut_of_every_document_is_unknown() -> None:
    """A capture cut anywhere before its last brace (a killed dcgmi, a full pipe): never a verdict."""
    for name, *_ in DIAG_FIXTURES:
        text = fixture(name)
        end = text.rfind("}")
        for cut in range(0, end, max(1, end // 150)):
            verdict = diag_parser.dcgm_diag(text[:cut], {})
            assert (verdict.outcome, verdict.reason) == ("unknown", "unreadable"), (
                name,
                cut,
                verdict.summary,
            )


# ---------------------------------------------------------------------------------- no traceback
REPLACEMENTS: list[Any] = [
    None, [], {}, "", "Fail", " pass ", "失敗 ✗", 0, -1, 2**70, 1.5, float("nan"), True,
    [None, 1, "a"], {"status": ["Fail"]}, {"status": "Fail", "warnings": "text", "gpu_ids": [0]}, "0,1",
]  # fmt: skip


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, child in items:
        yield from paths(child, (*prefix, key))


def mutations(document: Any, rng: random.Random) -> Iterator[Any]:
    """The document with one node dropped, and the same node changed three ways: wrapped in a list,
    unwrapped from its list or turned into its JSON text (one of these), and replaced by two of
    REPLACEMENTS (nulls, lists, strings, numbers, unicode). Every node of the document is visited; which
    changes each gets is drawn from a seeded generator, so every run tries the same documents."""
    structural: list[Callable[[Any], Any]] = [
        lambda o: [o],
        lambda o: o[0] if isinstance(o, list) and o else o,
        lambda o: json.dumps(o),
    ]
    for path in list(paths(document))[1:]:
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        key, original = path[-1], parent[path[-1]]
        for value in (rng.choice(structural)(original), *rng.sample(REPLACEMENTS, 2)):
            parent[key] = value
            yield document
        parent[key] = original
        if isinstance(parent, dict):
            del parent[key]
            yield document
            parent[key] = original
        else:
            parent.pop(key)
            yield document
            parent.insert(key, original)


JSON_FIXTURES = [name for name, *_ in DIAG_FIXTURES if name.endswith(".json")]


def test_dcgm_diag_itself_never_raises_on_mutated_real_documents() -> None:
    """Every shape a broken or future writer could give (dcgm_diag's bare function, not its guard): an
    outcome always, and no unexpected exception turned into an unknown by the guard."""
    rng = random.Random(41)
    bare = diag_parser.dcgm_diag.__wrapped__  # type: ignore[attr-defined]
    seen = 0
    for name in [*JSON_FIXTURES, "nvvs-3.1.0-real-output.txt"]:
        text = fixture(name)
        document = json.loads(text[text.index("{") :])
        for mutated in mutations(document, rng):
            verdict = bare(json.dumps(mutated), {})
            assert verdict.outcome in outcomes.OUTCOMES and "parser_error" not in verdict.evidence, name
            json.dumps(verdict.evidence)  # what the runner posts stays JSON
            seen += 1
    assert seen > 4000


def test_the_other_parsers_never_raise_on_cut_or_mangled_output() -> None:
    rng = random.Random(41)
    bits = {"bad_bits": {8: "HW Slowdown", 128: "HW Power Brake Slowdown"}}
    h2d = {"min_bytes_per_second": 20e9, "max_age_seconds": 7200}
    cases: list[tuple[Callable[..., outcomes.Verdict], str, dict[str, Any]]] = [
        (parsers.ib_write_bw, IB, {"min_gbits": 350}),
        (parsers.probe_lines, PROBE, GEMM),
        (parsers.row_remap, PAGE, {}),
        (parsers.clock_events, PAGE, bits),
        (parsers.h2d_bandwidth, H2D_PAGE, h2d),
    ]
    for parse, text, params in cases:
        bare = parse.__wrapped__  # type: ignore[attr-defined]
        variants = [text[:cut] for cut in range(len(text))]
        for _ in range(200):
            chars = list(text)
            for _ in range(3):
                chars[rng.randrange(len(chars))] = rng.choice(
                    ["", "{", "}", "=", "\n", " ", "NaN", "é", "\x00", "-"]
                )
            variants.append("".join(chars))
        for variant in variants:
            verdict = bare(variant, params)
            assert verdict.outcome in outcomes.OUTCOMES and "parser_error" not in verdict.evidence
        link = parsers.link_errors.__wrapped__  # type: ignore[attr-defined]
        for variant in variants[:: max(1, len(variants) // 50)]:
            assert link(variant, variant, LINK_LIMITS).outcome in outcomes.OUTCOMES


def test_the_guard_turns_an_unexpected_exception_into_an_unknown_naming_it() -> None:
    """Whatever a parser meets (here params it cannot use), the runner gets a verdict, not a traceback."""
    missing = parsers.probe_lines(PROBE, {})
    assert (missing.outcome, missing.reason) == ("unknown", "unreadable")
    assert "KeyError" in missing.summary and missing.evidence["parser_error"] == "KeyError"
    listed = parsers.clock_events(PAGE, {"bad_bits": [8, 128]})
    assert listed.outcome == "unknown" and "AttributeError" in listed.summary
    limits = parsers.link_errors(PAGE, PAGE, {"max_increase": {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "ten"}})
    assert limits.outcome == "unknown" and "ValueError" in limits.summary
    for name, parse in parsers.ONE_SHOT.items():
        assert hasattr(parse, "__wrapped__"), name


IB = """ #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
Conflicting CPU frequency values detected: 1500.000000 != 3300.016000. CPU Frequency is not max.
 65536      560845           0.00               98.02                0.186950
---------------------------------------------------------------------------------------
"""


def test_ib_write_bw_reads_past_perftests_warning_line_and_judges_the_rate() -> None:
    assert parsers.ib_write_bw_gbits(IB) == pytest.approx(98.02)
    assert parsers.ib_write_bw(IB, {"min_gbits": 350}).outcome == "failed"
    assert parsers.ib_write_bw(IB.replace("98.02", "392.21"), {"min_gbits": 350}).outcome == "passed"
    mb = IB.replace("Gb/sec", "MB/sec").replace("98.02", "48000.00")
    assert parsers.ib_write_bw_gbits(mb) == pytest.approx(384.0)
    old = (
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]\n"
        " 65536      1000           49000.00           48000.00\n"
    )
    assert parsers.ib_write_bw_gbits(old) == pytest.approx(384.0)  # perftest before MsgRate: 4 columns
    cut_row = IB[: IB.index("0.186950")]  # killed while printing the row: the figure may be cut too
    for bad in ("", IB.splitlines()[0], "Couldn't connect to remote", cut_row):
        verdict = parsers.ib_write_bw(bad, {"min_gbits": 350})
        assert (verdict.outcome, verdict.reason) == (
            "unknown",
            "unreadable",
        ) and "unreadable" in verdict.summary


PROBE = "\n".join(
    [f"fleetsight-probe v1 test=gemm gpu={g} dtype=bf16 tflops={700 - g} seconds=30.0" for g in range(8)]
    + ["fleetsight-probe v1 done gpus=8"]
)
GEMM = {"metric": "tflops", "expected": 989.0, "min_ratio": 0.6}


def test_probe_lines_judged_against_the_datasheet_floor_and_truncation_is_unknown() -> None:
    assert parsers.probe_lines(PROBE, GEMM).outcome == "passed"
    slow = parsers.probe_lines(PROBE.replace("tflops=697", "tflops=240"), GEMM)
    assert slow.outcome == "failed" and slow.summary.startswith("GPU 3 tflops 240")
    truncated = parsers.probe_lines("\n".join(PROBE.splitlines()[:5]), GEMM)
    assert (truncated.outcome, truncated.reason) == ("unknown", "unreadable") and "done" in truncated.summary
    short = parsers.probe_lines("\n".join(PROBE.splitlines()[:3] + PROBE.splitlines()[-1:]), GEMM)
    assert short.outcome == "unknown" and "3 GPU results, the probe said 8" in short.summary
    for broken in (PROBE.replace("tflops=697", "tflops=nan"), PROBE.replace("tflops=697", "tflops=inf")):
        assert parsers.probe_lines(broken, GEMM).outcome == "unknown"  # NaN is under no floor: not a pass
    assert parsers.probe_lines(PROBE.replace(" gpus=8", ""), GEMM).outcome == "unknown"


PAGE = """# TYPE DCGM_FI_DEV_ROW_REMAP_PENDING gauge
DCGM_FI_DEV_ROW_REMAP_PENDING{gpu="0",UUID="GPU-a"} 0
DCGM_FI_DEV_ROW_REMAP_PENDING{gpu="1",UUID="GPU-b"} 1
# TYPE DCGM_FI_DEV_ROW_REMAP_FAILED gauge
DCGM_FI_DEV_ROW_REMAP_FAILED{gpu="0",UUID="GPU-a"} 0
DCGM_FI_DEV_ROW_REMAP_FAILED{gpu="1",UUID="GPU-b"} 0
# TYPE DCGM_FI_DEV_CLOCK_THROTTLE_REASONS gauge
DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{gpu="0",UUID="GPU-a"} 132
DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{gpu="1",UUID="GPU-b"} 1
"""


def test_dcgm_fields_read_under_current_and_legacy_names() -> None:
    remap = parsers.row_remap(PAGE, {})
    assert remap.outcome == "failed" and remap.summary == "row remap pending or failed on GPU 1"
    bits = {8: "HW Slowdown", 64: "HW Thermal Slowdown", 128: "HW Power Brake Slowdown"}
    brake = parsers.clock_events(PAGE, {"bad_bits": bits})
    assert brake.outcome == "failed" and brake.summary == "GPU 0: HW Power Brake Slowdown"
    assert parsers.clock_events(PAGE.replace("} 132", "} 4"), {"bad_bits": bits}).outcome == "passed"
    for bad in ("not a page {", "", "\n"):
        assert (parsers.row_remap(bad, {}).outcome, parsers.row_remap(bad, {}).reason) == (
            "unknown",
            "unreadable",
        )
    unpublished = parsers.row_remap("# nothing here\nup 1\n", {})
    assert (unpublished.outcome, unpublished.reason) == ("unknown", "not_published")


def test_a_nan_on_a_metric_page_is_unknown_unless_another_gpu_fails() -> None:
    healthy = PAGE.replace(
        '"GPU-b"} 1\n# TYPE DCGM_FI_DEV_ROW_REMAP_FAILED', '"GPU-b"} 0\n# TYPE DCGM_FI_DEV_ROW_REMAP_FAILED'
    )
    assert parsers.row_remap(healthy, {}).outcome == "passed"
    nan = healthy.replace(
        'DCGM_FI_DEV_ROW_REMAP_FAILED{gpu="0",UUID="GPU-a"} 0',
        'DCGM_FI_DEV_ROW_REMAP_FAILED{gpu="0",UUID="GPU-a"} NaN',
    )
    assert parsers.row_remap(nan, {}).outcome == "unknown"
    assert parsers.row_remap(nan.replace('"GPU-b"} 0\n# TYPE', '"GPU-b"} 1\n# TYPE'), {}).outcome == "failed"
    bits = {128: "HW Power Brake Slowdown"}
    assert parsers.clock_events(PAGE.replace("} 132", "} NaN"), {"bad_bits": bits}).outcome == "unknown"
    assert parsers.clock_events(PAGE.replace("} 1\n", "} +Inf\n"), {"bad_bits": bits}).outcome == "failed"


LINK_LIMITS = {
    "max_increase": {
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 10,
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 0,
    }
}


def test_link_error_window_and_counter_reset() -> None:
    before = 'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="0"} 100\n'
    steady = parsers.link_errors(before, 'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="0"} 105\n', LINK_LIMITS)
    assert steady.outcome == "passed" and steady.evidence["not_published"] == [
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"
    ]
    rising = parsers.link_errors(before, 'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="0"} 150\n', LINK_LIMITS)
    assert rising.outcome == "failed" and "rose by 50" in rising.summary
    reset = parsers.link_errors(before, 'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="0"} 3\n', LINK_LIMITS)
    assert reset.outcome == "passed"
    nan = parsers.link_errors(before, 'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="0"} NaN\n', LINK_LIMITS)
    assert (nan.outcome, nan.reason) == ("unknown", "unreadable")
    assert parsers.link_errors(before, "", LINK_LIMITS).outcome == "unknown"
    late = 'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="1"} 100\n'  # GPU 0 absent from the first page: no window
    assert parsers.link_errors(late, before, LINK_LIMITS).outcome == "unknown"
    absent = parsers.link_errors("up 1\n", "up 1\n", LINK_LIMITS)
    assert (absent.outcome, absent.reason) == ("unknown", "not_published")


H2D_PAGE = (
    'fleetsight_pcie_host_to_device_bandwidth_bytes_per_second{gpu="0"} 5.1e10\n'
    'fleetsight_pcie_host_to_device_bandwidth_bytes_per_second{gpu="1"} 3.9e9\n'
    'fleetsight_pcie_host_to_device_bandwidth_timestamp_seconds{gpu="0"} 1000\n'
)


def test_h2d_bandwidth_from_the_node_agents_probe_series() -> None:
    params = {"min_bytes_per_second": 20e9, "max_age_seconds": 7200}
    slow = parsers.h2d_bandwidth(H2D_PAGE, params, now=1100)
    assert slow.outcome == "failed" and slow.summary == "GPU 1 host-to-device 3.9 GB/s < 20"
    stale = parsers.h2d_bandwidth(H2D_PAGE.replace("3.9e9", "5e10"), params, now=100000)
    assert (stale.outcome, stale.reason) == ("unknown", "not_published") and "old" in stale.summary
    assert parsers.h2d_bandwidth(H2D_PAGE.replace("3.9e9", "5e10"), params, now=1100).outcome == "passed"
    assert parsers.h2d_bandwidth(H2D_PAGE.replace("3.9e9", "NaN"), params, now=1100).outcome == "unknown"
    no_stamp = H2D_PAGE.replace("3.9e9", "5e10").replace("} 1000", "} NaN")
    assert parsers.h2d_bandwidth(no_stamp, params, now=1100).outcome == "unknown"


def test_catalogue_loads_and_a_malformed_one_is_named(tmp_path: Path) -> None:
    catalog = load_catalog()
    assert {c.name for c in catalog.values() if c.intrusive} >= {
        "dcgm_diag_r3",
        "gemm_throughput",
        "ib_pair_bandwidth",
    }
    bad = tmp_path / "c.yml"
    bad.write_text(
        "checks:\n  x: {kind: sometimes, parser: dcgm_diag, seconds: 1, summary: a, disturbs: b, tool: t}\n"
    )
    with pytest.raises(CatalogError, match="check x: kind 'sometimes'"):
        load_catalog(bad)


def test_round_robin_meets_every_pair_once_and_each_round_covers_every_node() -> None:
    for n in (2, 5, 8, 16):
        nodes = [f"n{i:02d}" for i in range(n)]
        rounds = round_robin(nodes)
        pairs = [frozenset(p) for r in rounds for p in r]
        assert len(pairs) == len(set(pairs)) == n * (n - 1) // 2
        for r in rounds:
            covered = [x for p in r for x in p]
            assert len(covered) == len(set(covered)) == n - n % 2


def test_a_port_slow_with_most_partners_is_blamed_not_its_partner() -> None:
    measured = {("a", "b", "mlx5_3"): 120.0, ("a", "c", "mlx5_3"): 118.0, ("b", "c", "mlx5_3"): 391.0}
    verdicts = port_verdicts(measured, 350)
    assert not verdicts[("a", "mlx5_3")]["passed"]
    assert verdicts[("b", "mlx5_3")]["passed"] and verdicts[("c", "mlx5_3")]["passed"]


def test_a_link_that_does_not_come_up_fails_ib_write_bw_and_a_silent_tool_is_unknown() -> None:
    """perftest reached its partner over TCP but could not bring the queue pair up over the link (its own
    words): evidence against the link. Output with neither figures nor those words says nothing."""
    down = "Failed to modify QP 1234 to RTR\n Unable to Connect the HCA's through the link\n"
    verdict = parsers.ib_write_bw(down, {"min_gbits": 350})
    assert verdict.outcome == "failed" and "link did not come up" in verdict.summary
    silent = parsers.ib_write_bw("Couldn't connect to 10.0.0.2:18515\n", {"min_gbits": 350})
    assert (silent.outcome, silent.reason) == ("unknown", "unreadable")
