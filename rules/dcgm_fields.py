"""The DCGMFieldsMissing alert rules, one per field of fleetsight/dcgm.py NEEDED_FIELDS.

The rules differ only in what the table says of each field (its names, the alerts and signals it
blinds), so the table is the one place to add a field: rules/generate.py writes these rules where a
source says ``- generate: DCGMFieldsMissing``. Its own module because it is content (the rule's
wording) where generate.py is mechanics.
"""

from __future__ import annotations

from fleetsight.dcgm import NEEDED_FIELDS, NeededField, missing_field_promql, names_of

ALERT = "DCGMFieldsMissing"


def blind_until_added(need: NeededField) -> str:
    """The description's sentence on what stays blind: alerts (with the table's note), then signals."""
    note = f" ({need.note})" if need.note else ""
    sentence = f"Blind until it is added: {', '.join(need.alerts)}{note}."
    if need.signals:
        sentence += f" Also blind: {', '.join(need.signals)}."
    return sentence


def rule_lines(need: NeededField) -> list[str]:
    """One rule, indented as a list item at column 0 (the caller indents it to its place)."""
    published_names = " or ".join(names_of(need.field))
    return [
        f"- alert: {ALERT}",
        "  expr: |",
        f"    {missing_field_promql(need.field)}",
        # A node whose exporter just started has every field of its file in its first scrape.
        "  for: 15m",
        "  labels:",
        "    severity: warning",
        "    team: sre",
        f"    field: {need.field}",
        "  annotations:",
        '    summary: "dcgm-exporter on {{ $value }} node(s) of cluster {{ $labels.cluster }} does not'
        f' publish {need.field}"',
        "    description: >-",
        "      {{ $value }} node(s) of cluster {{ $labels.cluster }} report GPUs through dcgm-exporter but",
        f"      publish no {published_names}: their counters file leaves the field out.",
        f"      {blind_until_added(need)}",
        "      Deploy FleetSight's counters file (exporters/dcgm/counters.csv) or add the field to yours.",
        f'    blinds: "{", ".join(need.alerts)}"',
    ]


def rules_lines() -> list[str]:
    """Every DCGMFieldsMissing rule, in the table's order."""
    return [line for need in NEEDED_FIELDS for line in rule_lines(need)]
