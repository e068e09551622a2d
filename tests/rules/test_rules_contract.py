"""The contract the issue fixes: alert names, labels, annotations, runbooks, and a unit test that fires
and one that stays silent for every alert."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from fleetsight.dcgm import NEEDED_FIELDS, missing_field_promql, names_of
from fleetsight.xid_catalog import CATALOG
from health.policy import load as load_policy
from health.sources import node_of
from rules.ruleset import RUNBOOKS_DIR, Rule, alert_names, load_rules, recording_levels, source_metrics

ISSUE_ALERTS = {
    "NodeDown",
    "ExporterDown",
    "GPUFellOffBus",
    "GPUXidUncorrectable",
    "GPUNVLinkErrors",
    "NVSwitchFatal",
    "GPURowRemapPending",
    "GPURowRemapFailed",
    "GPUPowerBrakeActive",
    "GPUThermalThrottling",
    "PSUFailed",
    "PCIeLinkDowngraded",
    "PCIeBandwidthDegraded",
    "InfiniBandPortDown",
    "InfiniBandLinkFlapping",
    "InfiniBandSymbolErrors",
    "InfiniBandPortRateDegraded",
    "InfiniBandFlashCut",  # issue 43: rules/infiniband.yml, a sub-second cut between scrapes
    "LustreClientErrors",
    "LustreOSTSlow",
    "StragglerNode",
    "DCGMFieldsMissing",
    "HealthEventLag",  # issue 37: the health service's own event backlog
    "ActiveCheckFailed",  # issue 36: rules/checks.yml
    "FleetSightBlind",  # issue 41: rules/checks.yml, a check that could not look
    "DCGMProfilingBlind",  # issue 41: rules/blindness.yml, profiling fields at 0 on busy GPUs
    "FabricManagerDown",  # issue 41: rules/blindness.yml, NVIDIA Fabric Manager not running
    "GPUAppXidsAcrossJobs",  # issue 41: rules/gpu.yml, application Xids that follow one GPU across jobs
    "FleetClusterMissing",  # issue 45: rules/fleet.yml, a cluster the global layer cannot read
    "ComponentFailureForecast",  # issue 43: rules/precursors.yml, error trends that forecast a failure
    "TrainingSilentCorruptionSuspected",  # issue 43: rules/training.yml, a replica that disagrees (SDC)
    "MemoryScanOverdue",  # issue 43: rules/checks.yml, a node past its memory-scan (DCGM level 4) due date
    "TrainingPaceStraggler",  # issue 42: rules/training.yml, a slow host or link named by the job's own pace
    "TrainingUpdatesAnomalous",  # issue 43: rules/training.yml, a job's updates drift with no replica named
}
# Alerts about a whole cluster (or a central service), not one node: their description names the
# cluster instead.
CLUSTER_ALERTS = {"LustreOSTSlow", "DCGMFieldsMissing", "HealthEventLag", "FleetClusterMissing"}
# Alerts about a whole training job that no node can be blamed for: their description names the job.
JOB_ALERTS = {"TrainingUpdatesAnomalous"}
RUNBOOK_SECTIONS = (
    "## What it means",
    "## Impact on running jobs",
    "## How to confirm",
    "## What to do",
    "## When to escalate",
)
UNIT_TESTS = sorted((Path(__file__).resolve().parents[2] / "rules" / "tests").glob("*.yml"))


def test_the_alerts_are_exactly_the_issues() -> None:
    assert set(alert_names(load_rules())) == ISSUE_ALERTS


def test_every_alert_has_severity_team_summary_description_and_runbook() -> None:
    for rule in (r for r in load_rules() if r.is_alert):
        assert rule.labels.get("severity") in {"critical", "warning", "info"}, rule.name
        assert rule.labels.get("team") in {"sre", "researcher", "facilities"}, rule.name
        assert rule.annotations.get("summary"), rule.name
        description = rule.annotations.get("description", "")
        assert (
            "$labels.node" in description
            or rule.name in CLUSTER_ALERTS
            or (rule.name in JOB_ALERTS and "$labels.hpc_job" in description)
        ), rule.name
        assert rule.annotations.get("runbook_url") == f"docs/runbooks/{rule.name}.md", rule.name


def test_every_alert_has_a_runbook_with_the_sections_the_chatbot_reads() -> None:
    index = (RUNBOOKS_DIR / "README.md").read_text()
    for name in ISSUE_ALERTS:
        page = RUNBOOKS_DIR / f"{name}.md"
        assert page.exists(), page
        text = page.read_text()
        assert text.startswith(f"# {name}\n"), name
        for section in RUNBOOK_SECTIONS:
            assert section in text, f"{name}: {section}"
        assert re.search(r"```\n.+\n```", text, re.S), f"{name}: no commands to confirm"
        assert f"[{name}.md]({name}.md)" in index, f"{name} missing from docs/runbooks/README.md"


def xid_codes(rule_name: str) -> set[int]:
    rule = next(r for r in load_rules() if r.name == rule_name)
    return {int(c) for c in re.search(r'xid=~"([0-9|]+)"', rule.expr).group(1).split("|")}


def test_xid_code_lists_follow_the_catalogue() -> None:
    """dcgm-exporter gives only the code: the rules list the catalogue's codes per alert."""
    needs_action = {
        c for c, i in CATALOG.items() if i.action in ("reset_gpu", "check_hardware", "reboot_node")
    }
    nvlink = {c for c, i in CATALOG.items() if i.category == "nvlink"}
    assert xid_codes("GPUXidUncorrectable") == needs_action - nvlink - {79}
    assert xid_codes("GPUNVLinkErrors") == nvlink


def test_recording_rules_the_alerts_need_form_levels_without_cycles() -> None:
    rules = load_rules()
    levels = recording_levels([r for r in rules if r.is_alert], rules)
    assert levels and all(levels)
    names_before: set[str] = set()
    for level in levels:
        for rule in level:
            used = {r.name for lvl in levels for r in lvl} & set(
                re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", rule.expr)
            )
            assert used <= names_before, rule.name
        names_before |= {r.name for r in level}


def test_every_alert_has_a_unit_test_that_fires_and_one_that_stays_silent() -> None:
    fires: set[str] = set()
    silent: set[str] = set()
    for path in UNIT_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else silent).add(check["alertname"])
    assert fires >= ISSUE_ALERTS, ISSUE_ALERTS - fires
    assert silent >= ISSUE_ALERTS, ISSUE_ALERTS - silent


def field_readers(field: str, rules: list[Rule]) -> set[str]:
    """The alerts that read a DCGM field under any of its names, through the recording rules."""
    names = set(names_of(field))
    return {
        r.name
        for r in rules
        if r.is_alert and r.name != "DCGMFieldsMissing" and source_metrics(r, rules) & names
    }


def missing_field_rules(rules: list[Rule]) -> dict[str, Rule]:
    return {r.labels["field"]: r for r in rules if r.name == "DCGMFieldsMissing"}


def test_dcgm_fields_missing_has_one_rule_per_needed_field_as_the_table_says() -> None:
    """fleetsight/dcgm.py NEEDED_FIELDS is the one list: a rule per field with its query, its blinded
    alerts in the annotations, and every alert that reads the field among them."""
    rules = load_rules()
    by_field = missing_field_rules(rules)
    assert set(by_field) == {need.field for need in NEEDED_FIELDS}
    for need in NEEDED_FIELDS:
        rule = by_field[need.field]
        assert " ".join(rule.expr.split()) == missing_field_promql(need.field), need.field
        assert rule.annotations["blinds"] == ", ".join(need.alerts), need.field
        assert set(need.alerts) <= set(alert_names(rules)), need.field
        assert field_readers(need.field, rules) <= set(need.alerts), need.field
        for signal in need.signals:
            assert signal in rule.annotations["description"], (need.field, signal)


def test_a_rule_reading_a_needed_field_the_table_does_not_list_is_caught() -> None:
    rules = load_rules()
    extra = Rule("GPUNewAlert", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS > 0", "g", Path("x.yml"), True)
    readers = field_readers("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", [*rules, extra])
    clock = next(n for n in NEEDED_FIELDS if n.field == "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
    assert readers - set(clock.alerts) == {"GPUNewAlert"}


def test_no_rule_selects_the_dcgm_scrape_job() -> None:
    """The GPU operator's dcgm-exporter is scraped under another job name (nvidia-dcgm-exporter)."""
    for rule in load_rules():
        if any(token.startswith("DCGM_") for token in re.findall(r"[A-Z_]+", rule.expr)):
            assert not re.search(r'\bjob\s*=~?\s*"', rule.expr), rule.name


def test_training_alerts_never_drain_and_the_ring_wide_and_job_wide_ones_touch_no_node() -> None:
    """Issue 41's "blind is not broken" and issue 42: the training watch's alerts are statistical, so the
    shipped health policy makes them `degraded` at most; a pace straggler with node="" (the whole ring,
    rules/tests/training_test.yml: no node label on the alert) is tied to no node by the health service."""
    policy = load_policy()
    training = [r for r in load_rules() if r.is_alert and r.file.name == "training.yml"]
    assert {r.name for r in training} >= {"TrainingSilentCorruptionSuspected", "TrainingPaceStraggler"}
    for rule in training:
        assert policy.effect(rule.name, rule.labels["severity"]) in {"degraded", "blind", "ignore"}, rule.name
    pace = next(r for r in training if r.name == "TrainingPaceStraggler")
    kept = re.search(r"max by \(([^)]*)\) \(fleetsight_job_pace_straggler\)", pace.expr)
    assert kept and {x.strip() for x in kept.group(1).split(",")} == {"cluster", "hpc_job", "node", "cause"}
    ring_wide = {"alertname": pace.name, "cluster": "c1", "hpc_job": "4202", "cause": "communication"}
    assert node_of({**ring_wide, **pace.labels}) is None
    job_wide = next(r for r in training if r.name == "TrainingUpdatesAnomalous")
    assert "node" not in job_wide.expr.split("unless")[0], "the job-wide alert must keep no node label"
    assert (
        node_of({"alertname": job_wide.name, "cluster": "c1", "hpc_job": "4301", **job_wide.labels}) is None
    )
