"""DCGM field names as dcgm-exporter publishes them: the counters-file format and the aliased names.

dcgm-exporter names each metric after the field name written in its counters CSV (``FIELD, type, help``;
``#`` starts a comment). DCGM renames fields over time and keeps the old name as a legacy alias with the same
field id (go-dcgm ``pkg/dcgm/const_fields.go``, ``legacyDCGMFields``), so one DCGM field can reach
Prometheus under either name, depending on the counters file and the exporter's go-dcgm. Every consumer
(rules, anomaly, health) reads a field through :data:`ALIASES`: all its names, the one FleetSight ships
first. The upstream files behind these facts are vendored under ``exporters/dcgm/upstream/``.
"""

from __future__ import annotations

import csv
import functools
import io
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SHIPPED_COUNTERS = REPO_ROOT / "exporters" / "dcgm" / "counters.csv"
UPSTREAM = REPO_ROOT / "exporters" / "dcgm" / "upstream"
STOCK_COUNTERS = UPSTREAM / "default-counters.csv"
# go-dcgm's name tables (exporters/dcgm/upstream/PROVENANCE.md): the one the pinned image
# (dcgm-exporter 4.4.2-4.7.0) resolves names with, and the newest (DCGM 4.6.1) with its renames.
PINNED_FIELDS = UPSTREAM / "go-dcgm-fields-0b1e78b.csv"
NEWEST_FIELDS = UPSTREAM / "go-dcgm-fields-b7fa315.csv"

# Field id -> every name DCGM has given it, the name FleetSight's counters file uses first. The shipped
# name is the one the go-dcgm of every supported dcgm-exporter release resolves: dcgm-exporter refuses to
# start on a counters file naming a field its go-dcgm does not know (4.4.2-4.7.0 knows
# ROW_REMAP_FAILURE, not ROW_REMAP_FAILED; DCGM 4.6's go-dcgm knows both).
ALIASES: dict[str, tuple[str, ...]] = {
    # id 112: renamed in DCGM 3.3; the stock file publishes neither.
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": (
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    ),
    # id 395: the stock file publishes the legacy name; DCGM 4.6 made ROW_REMAP_FAILED current.
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_FAILED"),
    # id 230: DCGM 4.6 renamed it XID_ERROR; dcgm-exporter 4.x adds err_code/err_msg labels to it.
    "DCGM_FI_DEV_XID_ERRORS": ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR"),
}


def names_of(field: str) -> tuple[str, ...]:
    """Every name the field may be published under (the field itself when it has no alias)."""
    for names in ALIASES.values():
        if field in names:
            return names
    return (field,)


def promql_selector_any(field: str, matchers: str = "") -> str:
    """A PromQL selector matching the field under any of its names: ``{__name__=~"A|B", matchers}``.

    The result keeps ``__name__`` (as any selector does); aggregate or use ``label_replace``/``without``
    when two names could both be present for one GPU."""
    names = names_of(field)
    if len(names) == 1:
        return f"{field}{{{matchers}}}" if matchers else field
    extra = f", {matchers}" if matchers else ""
    return f'{{__name__=~"{"|".join(names)}"{extra}}}'


@dataclass(frozen=True)
class Counter:
    field: str
    prom_type: str  # gauge, counter or label (a label on the other metrics, as DCGM_FI_DRIVER_VERSION)
    help: str


class CountersFileError(ValueError):
    """A counters file dcgm-exporter would refuse: the message names the line."""


PROM_TYPES = {"gauge", "counter", "histogram", "summary", "label"}


def parse_counters(text: str, source: str = "counters file") -> list[Counter]:
    """Parse dcgm-exporter's counters CSV as its ``ReadCSVFile``/``ExtractCounters`` do: ``#`` lines are
    comments, fields are trimmed of spaces, every record has exactly three fields."""
    counters: list[Counter] = []
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#") and line.strip()]
    for number, record in enumerate(csv.reader(io.StringIO("\n".join(lines))), 1):
        fields = [part.strip(" ") for part in record]
        if len(fields) != 3:
            raise CountersFileError(
                f"{source}: record {number} {record!r} has {len(fields)} fields, expected 3"
            )
        if fields[1] not in PROM_TYPES:
            raise CountersFileError(f"{source}: record {number}: unknown Prometheus type {fields[1]!r}")
        counters.append(Counter(*fields))
    return counters


def read_counters(path: Path) -> list[Counter]:
    return parse_counters(path.read_text(), str(path))


# --------------------------------------------------------------------------------- needed fields
# dcgm-exporter's series that say it runs on a node: every counters file, stock or FleetSight's, has it.
PRESENCE_FIELD = "DCGM_FI_DEV_GPU_TEMP"


@dataclass(frozen=True)
class NeededField:
    """A field FleetSight's alerts or services read that a counters file may leave out (the stock file
    leaves out the first two): while it is missing, the alerts and signals listed here are blind."""

    field: str  # the name FleetSight ships; names_of() gives its aliases
    alerts: tuple[str, ...]  # Prometheus alerts that cannot fire (rules/*.yml)
    signals: tuple[str, ...]  # the anomaly service's causes and straggler scores it feeds
    note: str = ""


# THE list of needed fields: the DCGMFieldsMissing rules (rules/gpu.yml, generated from it by
# rules/dcgm_fields.py; tests/rules/test_rules_contract.py holds them to missing_field_promql()) and the
# health service's /v1/status both read it.
NEEDED_FIELDS: tuple[NeededField, ...] = (
    NeededField(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        ("GPUPowerBrakeActive", "GPUThermalThrottling"),
        ("anomaly cause power_brake", "anomaly cause thermal"),
    ),
    NeededField("DCGM_FI_DEV_ROW_REMAP_PENDING", ("GPURowRemapPending",), ()),
    NeededField("DCGM_FI_DEV_ROW_REMAP_FAILURE", ("GPURowRemapFailed",), ()),
    NeededField(
        "DCGM_FI_DEV_XID_ERRORS",
        ("GPUXidUncorrectable", "GPUNVLinkErrors"),
        (),
        "only dcgm-exporter's half: the node agent's kernel-log Xids still reach both alerts",
    ),
    NeededField(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        ("StragglerNode",),
        ("straggler",),
        "the anomaly service compares the tensor-core activity of a job's nodes",
    ),
)


def missing_field_promql(field: str) -> str:
    """Per cluster, the number of nodes whose dcgm-exporter publishes PRESENCE_FIELD but ``field`` under
    none of its names. Per node, so a fleet where only some nodes run the stock counters file shows too."""
    return (
        f"count by (cluster) (count by (cluster, node) ({PRESENCE_FIELD}) "
        f"unless on (cluster, node) count by (cluster, node) ({promql_selector_any(field)}))"
    )


def missing_fields_promql() -> str:
    """One query for every needed field: missing_field_promql() of each, labelled ``field``."""
    return " or ".join(
        f'label_replace({missing_field_promql(need.field)}, "field", "{need.field}", "", "")'
        for need in NEEDED_FIELDS
    )


@dataclass(frozen=True)
class FieldName:
    name: str
    id: int
    current: bool  # False: a legacy alias (go-dcgm's legacyDCGMFields)


@functools.cache
def read_field_table(path: Path) -> dict[str, FieldName]:
    """A vendored go-dcgm name table: every name ``dcgm.GetFieldID`` resolves, with its field id."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    return {r["name"]: FieldName(r["name"], int(r["id"]), r["table"] == "current") for r in rows}


def field_id(name: str, tables: tuple[Path, ...] = (PINNED_FIELDS, NEWEST_FIELDS)) -> int | None:
    """The DCGM field id of a name in any of the tables (current or legacy), None if no table knows it."""
    for path in tables:
        if (entry := read_field_table(path).get(name)) is not None:
            return entry.id
    return None
