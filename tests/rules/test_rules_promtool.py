"""The rule files pass `promtool check rules` and their unit tests (`promtool test rules`) with both the
Debian promtool (2.x, what the local stack runs) and a promtool 3.x built by `fleetsight setup`
(production runs Prometheus 3.x images)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from fleetsight.settings import Settings
from rules.install import PROMTOOL3_BUILD, prometheus_release
from rules.ruleset import RULES_DIR, rule_files

UNIT_TESTS = sorted((RULES_DIR / "tests").glob("*.yml"))


def promtool(generation: str) -> str:
    """The binary of one generation; a missing one fails the test and says how to get it."""
    if generation == "2":
        binary = shutil.which("promtool")
        if binary is None:
            pytest.fail("promtool 2.x is missing: apt-get install prometheus (or `fleetsight setup`)")
        return binary
    settings = Settings()
    if not PROMTOOL3_BUILD.present(settings):
        missing = PROMTOOL3_BUILD.binary(settings)
        pytest.fail(f"promtool {prometheus_release()} is missing at {missing}: run `fleetsight setup`")
    return str(PROMTOOL3_BUILD.binary(settings))


def run(binary: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary, *map(str, args)], capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("generation", ["2", "3"])
def test_promtool_reports_the_expected_generation(generation: str) -> None:
    version = run(promtool(generation), "--version")
    assert f"version {generation}." in version.stdout + version.stderr


@pytest.mark.parametrize("generation", ["2", "3"])
def test_every_rule_file_passes_promtool_check(generation: str) -> None:
    files = rule_files()
    assert len(files) >= 7, files
    result = run(promtool(generation), "check", "rules", *files)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(files)


@pytest.mark.parametrize("generation", ["2", "3"])
def test_rule_unit_tests_pass(generation: str) -> None:
    assert UNIT_TESTS, "no promtool unit tests in rules/tests/"
    result = run(promtool(generation), "test", "rules", *UNIT_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(UNIT_TESTS)


@pytest.mark.parametrize("generation", ["2", "3"])
def test_a_broken_rule_file_is_refused(generation: str, tmp_path: Path) -> None:
    """The check is real: a rule with a PromQL syntax error fails and names the file."""
    broken = tmp_path / "broken.yml"
    broken.write_text("groups:\n  - name: x\n    rules:\n      - alert: Broken\n        expr: rate(up[5m]\n")
    result = run(promtool(generation), "check", "rules", broken)
    assert result.returncode != 0
    assert "broken.yml" in result.stdout + result.stderr


@pytest.mark.parametrize("generation", ["2", "3"])
def test_a_wrong_expectation_fails_the_unit_tests(generation: str, tmp_path: Path) -> None:
    """The unit tests can fail: expecting PSUFailed for a healthy PSU is reported as a failure."""
    case = tmp_path / "wrong_test.yml"
    case.write_text(
        f"rule_files: [{RULES_DIR / 'node.yml'}]\n"
        "evaluation_interval: 15s\n"
        "tests:\n"
        "  - interval: 15s\n"
        "    input_series:\n"
        '      - series: \'fleetsight_bmc_psu_healthy{node="n1",chassis="1",psu="PSU0"}\'\n'
        "        values: '1x20'\n"
        '      - series: \'fleetsight_bmc_psu_present{node="n1",chassis="1",psu="PSU0"}\'\n'
        "        values: '1x20'\n"
        "    alert_rule_test:\n"
        "      - eval_time: 4m\n"
        "        alertname: PSUFailed\n"
        "        exp_alerts:\n"
        "          - exp_labels: {severity: critical, team: facilities, node: n1, chassis: '1', psu: PSU0}\n"
    )
    result = run(promtool(generation), "test", "rules", case)
    assert result.returncode != 0
    assert "PSUFailed" in result.stdout + result.stderr


def test_unit_tests_over_several_groups_fix_the_evaluation_order() -> None:
    """promtool evaluates the groups of a unit test in Go's map order unless `group_eval_order` names them:
    an alert evaluated before the records it reads sees records one interval old, outside the lookback,
    and fails one run in four (CI, stop 54). Every test file over more than one group names them all."""
    unordered = []
    for test_file in UNIT_TESTS:
        spec = yaml.safe_load(test_file.read_text())
        names = [
            group["name"]
            for rule_file in spec["rule_files"]
            for group in yaml.safe_load((test_file.parent / rule_file).read_text())["groups"]
        ]
        if len(names) > 1 and sorted(spec.get("group_eval_order", [])) != sorted(names):
            unordered.append(f"{test_file.name}: group_eval_order should name {names}")
    assert not unordered, "\n".join(unordered)
