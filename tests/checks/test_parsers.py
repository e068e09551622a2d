"""The checks' parsers on real tool output (tests/fixtures/dcgmi/PROVENANCE.md) and on what breaks:
truncated, garbage, unknown status words. Every bad input is a failed check with a reason, never a
crash and never a pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from checks import parsers
from checks.catalog import CatalogError, load_catalog
from checks.plan import port_verdicts, round_robin
from checks.service import load_policy
from twin import checks as twin_checks

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dcgmi"
GB10 = (FIXTURES / "dgx-spark-gb10-r1.json").read_text()
EXCERPT = (FIXTURES / "dcgm-issue-215-r3-excerpt.txt").read_text()


def test_real_gb10_level1_document_fails_with_dcgms_own_reason() -> None:
    verdict = parsers.dcgm_diag("Successfully ran diagnostic for group.\n" + GB10, {})
    assert not verdict.passed
    assert verdict.summary == "dcgmi diag failed: software (GPU 0)"
    failure = verdict.evidence["failures"][0]
    assert failure["error_ids"] == [29] and "Persistence mode" in failure["warnings"][0]
    assert verdict.evidence["dcgm_version"] == "4.2.3"


def test_real_level3_test_object_passes_inside_a_document_and_fails_alone() -> None:
    test = json.loads(EXCERPT.strip().rstrip(","))
    document = {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [test]}]}}
    assert parsers.dcgm_diag(json.dumps(document), {}).passed
    alone = parsers.dcgm_diag(EXCERPT, {})  # as pasted in the issue: no document around it
    assert not alone.passed and "no 'DCGM Diagnostic' object" in alone.summary


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
        assert parsers.dcgm_diag(json.dumps(document), {}).passed, level
    fault = [{"kind": "hbm_silent_corruption", "gpu": 2}]
    for level in (1, 2, 3):
        assert parsers.dcgm_diag(json.dumps(twin_checks.dcgmi_diag(level, fault)), {}).passed, level
    document = twin_checks.dcgmi_diag(4, fault)
    assert schema_problems(document) == []
    verdict = parsers.dcgm_diag("Successfully ran diagnostic for group.\n" + json.dumps(document), {})
    assert not verdict.passed and verdict.summary == "dcgmi diag failed: memtest (GPU 2)"
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


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "no JSON object"),
        ("Error: unable to connect to host engine at 127.0.0.1", "no JSON object"),
        (GB10[: len(GB10) // 2], "truncated or not JSON"),
        (GB10.replace('"Fail"', '"Inconclusive"'), "status words not understood"),
        ('{"DCGM Diagnostic": {"test_categories": []}}', "no test results"),
        ('{"DCGM Diagnostic": {"runtime_error": "Couldn\'t find the GPUs"}}', "could not run"),
        ("[1, 2]", "no JSON object"),
    ],
)
def test_bad_diag_output_is_a_failed_check_with_the_reason(text: str, why: str) -> None:
    verdict = parsers.dcgm_diag(text, {})
    assert not verdict.passed
    assert why in verdict.summary


IB = """ #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
Conflicting CPU frequency values detected: 1500.000000 != 3300.016000. CPU Frequency is not max.
 65536      560845           0.00               98.02                0.186950
---------------------------------------------------------------------------------------
"""


def test_ib_write_bw_reads_past_perftests_warning_line_and_judges_the_rate() -> None:
    assert parsers.ib_write_bw_gbits(IB) == pytest.approx(98.02)
    assert not parsers.ib_write_bw(IB, {"min_gbits": 350}).passed
    assert parsers.ib_write_bw(IB.replace("98.02", "392.21"), {"min_gbits": 350}).passed
    mb = IB.replace("Gb/sec", "MB/sec").replace("98.02", "48000.00")
    assert parsers.ib_write_bw_gbits(mb) == pytest.approx(384.0)
    for bad in ("", IB.splitlines()[0], "Couldn't connect to remote"):
        verdict = parsers.ib_write_bw(bad, {"min_gbits": 350})
        assert not verdict.passed and "unreadable" in verdict.summary


PROBE = "\n".join(
    [f"fleetsight-probe v1 test=gemm gpu={g} dtype=bf16 tflops={700 - g} seconds=30.0" for g in range(8)]
    + ["fleetsight-probe v1 done gpus=8"]
)
GEMM = {"metric": "tflops", "expected": 989.0, "min_ratio": 0.6}


def test_probe_lines_judged_against_the_datasheet_floor_and_truncation_fails() -> None:
    assert parsers.probe_lines(PROBE, GEMM).passed
    slow = parsers.probe_lines(PROBE.replace("tflops=697", "tflops=240"), GEMM)
    assert not slow.passed and slow.summary.startswith("GPU 3 tflops 240")
    truncated = parsers.probe_lines("\n".join(PROBE.splitlines()[:5]), GEMM)
    assert not truncated.passed and "done" in truncated.summary
    short = parsers.probe_lines("\n".join(PROBE.splitlines()[:3] + PROBE.splitlines()[-1:]), GEMM)
    assert not short.passed and "3 GPU results, the probe said 8" in short.summary


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
    assert not remap.passed and remap.summary == "row remap pending or failed on GPU 1"
    bits = {8: "HW Slowdown", 64: "HW Thermal Slowdown", 128: "HW Power Brake Slowdown"}
    brake = parsers.clock_events(PAGE, {"bad_bits": bits})
    assert not brake.passed and brake.summary == "GPU 0: HW Power Brake Slowdown"
    assert parsers.clock_events(PAGE.replace("} 132", "} 4"), {"bad_bits": bits}).passed
    for bad in ("not a page {", ""):
        assert not parsers.row_remap(bad, {}).passed


def test_link_error_window_and_counter_reset() -> None:
    limits = {
        "max_increase": {
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 10,
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 0,
        }
    }
    before = 'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="0"} 100\n'
    steady = parsers.link_errors(before, 'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="0"} 105\n', limits)
    assert steady.passed and steady.evidence["not_published"] == [
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"
    ]
    rising = parsers.link_errors(before, 'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="0"} 150\n', limits)
    assert not rising.passed and "rose by 50" in rising.summary
    reset = parsers.link_errors(before, 'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="0"} 3\n', limits)
    assert reset.passed


def test_h2d_bandwidth_from_the_node_agents_probe_series() -> None:
    page = (
        'fleetsight_pcie_host_to_device_bandwidth_bytes_per_second{gpu="0"} 5.1e10\n'
        'fleetsight_pcie_host_to_device_bandwidth_bytes_per_second{gpu="1"} 3.9e9\n'
        'fleetsight_pcie_host_to_device_bandwidth_timestamp_seconds{gpu="0"} 1000\n'
    )
    params = {"min_bytes_per_second": 20e9, "max_age_seconds": 7200}
    slow = parsers.h2d_bandwidth(page, params, now=1100)
    assert not slow.passed and slow.summary == "GPU 1 host-to-device 3.9 GB/s < 20"
    stale = parsers.h2d_bandwidth(page.replace("3.9e9", "5e10"), params, now=100000)
    assert not stale.passed and "old" in stale.summary
    assert parsers.h2d_bandwidth(page.replace("3.9e9", "5e10"), params, now=1100).passed


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
