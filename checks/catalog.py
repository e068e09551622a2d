"""The check catalogue (checks/catalog.yml): what each check is, what it needs, costs and disturbs.

Loaded once and validated: a malformed catalogue stops the caller with the check and key named, the
same rule as the health policy."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CATALOG_FILE = Path(__file__).resolve().parent / "catalog.yml"
KINDS = ("light", "intrusive")
PARSERS = (
    "h2d_bandwidth",
    "row_remap",
    "clock_events",
    "link_errors",
    "dcgm_diag",
    "probe_lines",
    "ib_write_bw",
)


class CatalogError(ValueError):
    """The catalogue is malformed: the message names the check and the key."""


@dataclass(frozen=True)
class Check:
    name: str
    kind: str
    summary: str
    needs: tuple[str, ...]
    seconds: float
    disturbs: str
    tool: str
    parser: str
    args: tuple[str, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)
    nodes: int = 1  # 2: a pair check, one scheduler unit on two nodes (server on one, client on the other)

    @property
    def intrusive(self) -> bool:
        return self.kind == "intrusive"

    @property
    def runbook(self) -> str:
        return "docs/runbooks/ActiveCheckFailed.md"


def _check(name: str, raw: Any) -> Check:
    if not isinstance(raw, dict):
        raise CatalogError(f"check {name}: must be a mapping")
    where = f"check {name}"
    kind = raw.get("kind")
    if kind not in KINDS:
        raise CatalogError(f"{where}: kind {kind!r} must be one of {', '.join(KINDS)}")
    if raw.get("parser") not in PARSERS:
        raise CatalogError(f"{where}: parser {raw.get('parser')!r} must be one of {', '.join(PARSERS)}")
    seconds = raw.get("seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
        raise CatalogError(f"{where}: seconds must be a positive number")
    nodes = raw.get("nodes", 1)
    if nodes not in (1, 2) or (nodes == 2 and kind != "intrusive"):
        raise CatalogError(f"{where}: nodes must be 1 or 2 (2 only for an intrusive check)")
    for key in ("summary", "disturbs", "tool"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise CatalogError(f"{where}: {key} must be a non-empty string")
    return Check(
        name=name,
        kind=kind,
        summary=raw["summary"],
        needs=tuple(str(n) for n in raw.get("needs") or ()),
        seconds=float(seconds),
        disturbs=raw["disturbs"],
        tool=raw["tool"],
        parser=raw["parser"],
        args=tuple(str(a) for a in raw.get("args") or ()),
        params=dict(raw.get("params") or {}),
        nodes=nodes,
    )


def load_catalog(path: Path = CATALOG_FILE) -> dict[str, Check]:
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, dict) or not isinstance(raw.get("checks"), dict):
        raise CatalogError(f"{path}: expected a mapping with a 'checks' mapping")
    return {name: _check(name, item) for name, item in raw["checks"].items()}


def format_duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def catalog_table(checks: dict[str, Check]) -> str:
    """The catalogue as a Markdown table: what `fleetsight checks catalog` prints and docs/checks.md
    shows."""
    rows = [
        "| check | kind | takes | disturbs | needs | what |",
        "|---|---|---|---|---|---|",
    ]
    for check in sorted(checks.values(), key=lambda c: (c.kind, c.seconds, c.name)):
        rows.append(
            f"| {check.name} | {check.kind} | {format_duration(check.seconds)} | {check.disturbs} | "
            f"{'; '.join(check.needs)} | {check.summary} |"
        )
    return "\n".join(rows)
