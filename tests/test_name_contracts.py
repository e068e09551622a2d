"""Names that tie the stages together, checked statically: every alert name the health policy, the
Alertmanager routes and the runbooks use is an alert that exists (a Prometheus rule in rules/ or a log
rule in alerting/elastalert/rules/), and every runbook path a component hands out is a file.

Each check can fail: `test_a_typo_is_caught` feeds a misspelt copy of each source through the same check.
The metric side (every metric a rule, the anomaly service or the health service reads is produced) needs a
running stack and lives in tests/dashboards/test_dashboards.py beside the panels' check.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from health.policy import load as load_policy

REPO = Path(__file__).resolve().parents[1]
RUNBOOKS = REPO / "docs" / "runbooks"
# Runbooks that are not one alert's: the index.
NOT_AN_ALERT = {"README"}
COMPONENT_FOLDERS = ("alerting", "anomaly", "chatbot", "dashboards", "exporters", "health", "rules")
RUNBOOK_PATH = re.compile(r"docs/runbooks/[A-Za-z0-9_.-]+\.md")


def prometheus_alerts() -> set[str]:
    names = set()
    for path in (REPO / "rules").glob("*.yml"):
        for group in yaml.safe_load(path.read_text()).get("groups", []):
            names |= {rule["alert"] for rule in group.get("rules", []) if "alert" in rule}
    return names


def log_alerts() -> set[str]:
    rules = (REPO / "alerting" / "elastalert" / "rules").glob("*.yaml")
    return {yaml.safe_load(path.read_text())["alertmanager_alertname"] for path in rules}


def all_alerts() -> set[str]:
    return prometheus_alerts() | log_alerts()


def unknown_policy_signals(signals: dict[str, str], aliases: dict[str, str], alerts: set[str]) -> list[str]:
    """Policy keys that are neither an alert nor one of the service's own signals (those have a runbook
    alias in the policy, which names them)."""
    return sorted(s for s in signals if s not in alerts and s not in aliases)


def alertmanager_matchers(text: str) -> list[str]:
    """The alertname values (plain or regex alternatives) in Alertmanager's routes and inhibit rules."""
    values = re.findall(r'alertname\s*=~?\s*"([^"]+)"', text)
    return [part for value in values for part in value.split("|")]


def unmatched(patterns: list[str], alerts: set[str]) -> list[str]:
    return sorted(p for p in patterns if not any(re.fullmatch(p, alert) for alert in alerts))


def dangling_runbook_links(texts: dict[str, str]) -> list[str]:
    return sorted(
        f"{where}: {link}"
        for where, text in texts.items()
        for link in RUNBOOK_PATH.findall(text)
        if not (REPO / link).is_file()
    )


def component_texts() -> dict[str, str]:
    return {
        str(path.relative_to(REPO)): path.read_text()
        for folder in COMPONENT_FOLDERS
        for pattern in ("*.py", "*.yml", "*.yaml")
        for path in (REPO / folder).rglob(pattern)
    }


def test_every_policy_signal_is_an_alert_or_a_named_service_signal() -> None:
    policy = load_policy()
    assert not unknown_policy_signals(policy.signals, policy.runbooks, all_alerts())


def test_every_alertname_in_the_alertmanager_routes_exists() -> None:
    text = (REPO / "alerting" / "alertmanager.yml").read_text()
    patterns = alertmanager_matchers(text)
    assert len(patterns) > 10, "the routes' alert names were not found: has the file's format changed?"
    assert not unmatched(patterns, all_alerts())


def test_every_runbook_is_an_alerts_and_every_alert_has_one() -> None:
    runbooks = {p.stem for p in RUNBOOKS.glob("*.md")} - NOT_AN_ALERT
    assert runbooks == all_alerts(), (
        f"runbooks without an alert: {sorted(runbooks - all_alerts())}; "
        f"alerts without a runbook: {sorted(all_alerts() - runbooks)}"
    )


def test_every_runbook_link_a_component_hands_out_resolves() -> None:
    texts = component_texts()
    assert sum(len(RUNBOOK_PATH.findall(t)) for t in texts.values()) > 20
    assert not dangling_runbook_links(texts)
    policy = load_policy()
    handed_out = {policy.runbook(signal) for signal in policy.signals}
    assert not [link for link in sorted(handed_out) if not (REPO / link).is_file()]


@pytest.mark.parametrize(
    "check",
    ["policy", "alertmanager", "runbook link"],
)
def test_a_typo_is_caught(check: str) -> None:
    """Each check above, fed a misspelt copy of its source, names the misspelt entry."""
    alerts = all_alerts()
    if check == "policy":
        policy = load_policy()
        signals = {**policy.signals, "GPUFelOffBus": "repair"}
        assert unknown_policy_signals(signals, policy.runbooks, alerts) == ["GPUFelOffBus"]
    elif check == "alertmanager":
        text = (REPO / "alerting" / "alertmanager.yml").read_text().replace('"PSUFailed"', '"PSUFailure"')
        assert unmatched(alertmanager_matchers(text), alerts) == ["PSUFailure"]
    else:
        text = "see docs/runbooks/straggler.md"
        assert dangling_runbook_links({"health/x.py": text}) == ["health/x.py: docs/runbooks/straggler.md"]
