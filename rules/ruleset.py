"""The rule files as data: which alerts exist, what each needs, and in what order recording rules
must be computed. Shared by the evaluation, the CLI and the tests."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

RULES_DIR = Path(__file__).resolve().parent
RUNBOOKS_DIR = RULES_DIR.parent / "docs" / "runbooks"
# Exporter metric families a rule can read: dcgm-exporter's, FleetSight's own, and Prometheus's `up`.
SOURCE_METRIC = re.compile(r"DCGM_FI_[A-Z0-9_]+|fleetsight_[a-z0-9_]+|up")
IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
# Metrics that only add context (the job on a node, whether the agent ran): data with only these
# cannot make an alert fire.
CONTEXT_METRICS = frozenset(
    {"DCGM_FI_DEV_GPU_UTIL", "fleetsight_kernel_log_lines_total", "fleetsight_pcie_link_up"}
)


@dataclass(frozen=True)
class Rule:
    name: str  # the record name or the alert name
    expr: str
    group: str
    file: Path
    is_alert: bool
    for_seconds: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


def parse_duration(text: str | int | float | None) -> float:
    """Prometheus durations (`90s`, `5m`, `1h30m`) in seconds."""
    if text is None or text == "":
        return 0.0
    if isinstance(text, int | float):
        return float(text)
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    total, rest = 0.0, text.strip()
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)", rest):
        total += float(number) * units[unit]
    if not re.fullmatch(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w|y))+", rest):
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return total


def rule_files(folder: Path = RULES_DIR) -> list[Path]:
    """The rule files Prometheus loads (`rules/*.yml`, generated from rules/source/ by rules/generate.py;
    unit tests live in rules/tests/)."""
    return sorted(folder.glob("*.yml"))


def load_rules(files: list[Path] | None = None) -> list[Rule]:
    rules: list[Rule] = []
    for path in files if files is not None else rule_files():
        document: dict[str, Any] = yaml.safe_load(path.read_text()) or {}
        for group in document.get("groups", []):
            for entry in group.get("rules", []):
                is_alert = "alert" in entry
                rules.append(
                    Rule(
                        name=entry["alert"] if is_alert else entry["record"],
                        expr=str(entry["expr"]),
                        group=group["name"],
                        file=path,
                        is_alert=is_alert,
                        for_seconds=parse_duration(entry.get("for")),
                        labels={k: str(v) for k, v in (entry.get("labels") or {}).items()},
                        annotations={k: str(v) for k, v in (entry.get("annotations") or {}).items()},
                    )
                )
    return rules


def alert_names(rules: list[Rule]) -> list[str]:
    """Alert names in file order, each once (an alert may have several rules, e.g. two variants)."""
    return list(dict.fromkeys(rule.name for rule in rules if rule.is_alert))


def records_used(expr: str, record_names: set[str]) -> set[str]:
    return {token for token in IDENTIFIER.findall(expr) if token in record_names}


def source_metrics(rule: Rule, rules: list[Rule]) -> set[str]:
    """Exporter metrics a rule reads, through the recording rules it uses."""
    records = {r.name: r for r in rules if not r.is_alert}
    seen: set[str] = set()
    pending = [rule.expr]
    metrics: set[str] = set()
    while pending:
        expr = pending.pop()
        metrics |= {token for token in IDENTIFIER.findall(expr) if SOURCE_METRIC.fullmatch(token)}
        for name in records_used(expr, set(records)) - seen:
            seen.add(name)
            pending.append(records[name].expr)
    return metrics


def recording_levels(alerts: list[Rule], rules: list[Rule]) -> list[list[Rule]]:
    """The recording rules the alerts need, in levels: level 0 reads raw series only, level n reads
    records of lower levels. Computing them level by level reproduces what Prometheus records."""
    records = {r.name: r for r in rules if not r.is_alert}
    needed: set[str] = set()
    pending = [a.expr for a in alerts]
    while pending:
        for name in records_used(pending.pop(), set(records)) - needed:
            needed.add(name)
            pending.append(records[name].expr)
    level: dict[str, int] = {}

    def depth(name: str, trail: tuple[str, ...] = ()) -> int:
        if name in trail:
            raise ValueError(f"recording rules depend on each other in a cycle: {' -> '.join(trail)}")
        if name not in level:
            deps = records_used(records[name].expr, set(records)) - {name}
            level[name] = 1 + max((depth(d, (*trail, name)) for d in deps), default=-1)
        return level[name]

    for name in needed:
        depth(name)
    levels: list[list[Rule]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for name in sorted(needed):
        levels[level[name]].append(records[name])
    return levels
