"""Ground truth: where it lies (outside the data folder), how it is written, and how scorers read it.

The format is the contract of docs/twin.md ("Ground truth"). Pure: json and pathlib only, so a scorer
imports it without the simulator.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRUTH_SUFFIX = ".truth.jsonl"
SCENARIO_SUFFIX = ".scenario.json"
# Every line has these keys (docs/twin.md); scorers may rely on them.
TRUTH_KEYS = (
    "id",
    "kind",
    "benign",
    "target",
    "onset",
    "end",
    "onset_unix",
    "end_unix",
    "magnitude",
    "jobs",
    "job",
    "job_slowdown",
    "job_failed",
    "effects",
)
# Every line this twin writes also has these (docs/twin.md): the event's own part in its job's pace.
# Files written before they existed lack them, so load_truth does not require them.
PACE_KEYS = ("fault_slowdown", "pacing", "masked")
# Optional keys: "nodes", the hosts an event touched that its target does not name (a leaf switch's, a
# crashed job's); "hardware": false on what is not the node's hardware (twin/fault_kinds.py
# NOT_HARDWARE_KINDS: a silent or blind source, a missing tool, Fabric Manager down, an application's
# Xids), where a drain, a repair or a degraded state is a wrong one. A line without it is the hardware's
# (or benign: "benign" says so). What a training kind did (twin/training_kinds.py): "resumed" (a
# checkpoint_stall: node -> unix time it resumed), "busiest" (a moe_imbalance: [unix, node] each time the
# busiest node changed), "from_nodes" and "to_nodes" (a job_resize's node lists), "bubble" (a
# pipeline_bubble: the share of each GPU's step spent in the bubble), "cuts" (an ib_flash_cut: [unix, seconds]
# of each cut).
OPTIONAL_KEYS = ("nodes", "hardware", "resumed", "busiest", "from_nodes", "to_nodes", "bubble", "cuts")


class TruthError(ValueError):
    """A truth file that cannot be read, with the file and line."""


def default_truth_path(out: str | Path) -> Path:
    """``<out>.truth.jsonl`` beside the output folder, never inside it."""
    out = Path(out).resolve()
    return out.parent / f"{out.name}{TRUTH_SUFFIX}"


def scenario_path(truth: str | Path) -> Path:
    """Where the scenario's name, description and seed go: beside the truth file."""
    return Path(truth).with_suffix(SCENARIO_SUFFIX)


def check_outside(truth: str | Path, out: str | Path) -> None:
    """Refuse a truth path inside the data folder: a component under evaluation would read it."""
    truth_path, out_path = Path(truth).resolve(), Path(out).resolve()
    if truth_path == out_path or out_path in truth_path.parents:
        raise ValueError(f"--truth {truth}: must lie outside the output folder {out}")


def load_truth(path: str | Path) -> list[dict[str, Any]]:
    """Every truth line as a dict, sorted by onset, then id."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise TruthError(f"{path}: cannot read: {exc.strerror}") from exc
    lines = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError as exc:
            raise TruthError(f"{path}:{number}: not JSON: {exc}") from exc
        missing = [key for key in TRUTH_KEYS if key not in entry]
        if missing:
            raise TruthError(f"{path}:{number}: missing keys {', '.join(missing)}")
        lines.append(entry)
    return sorted(lines, key=lambda entry: (entry["onset_unix"], entry["id"]))


@dataclass(frozen=True)
class Fault:
    """One truth line, typed: what every scorer reads. ``line`` keeps the whole entry for the rest
    (effects, pace keys) so that no scorer parses the file again."""

    id: str
    kind: str
    onset: float  # unix seconds
    end: float
    node: str | None = None
    gpu: int | None = None
    code: int | None = None  # the Xid of an xid fault
    benign: bool = False
    job: str | None = None
    magnitude: Any = None
    hardware: bool = True  # False: not the node's hardware (the line's "hardware": false)
    line: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def target(self) -> dict[str, Any]:
        """The line's target as the scenario gave it (``node``, and ``gpu``, ``port``, ``tool``, ... per
        kind): a copy, so that a reader cannot change the line."""
        return dict(self.line.get("target") or {})

    @property
    def nodes(self) -> list[str]:
        """The hosts the event touched: its target's node, else the line's "nodes" (a job's, a switch's)."""
        if self.node:
            return [self.node]
        return [str(n) for n in self.line.get("nodes") or []]

    @classmethod
    def from_line(cls, entry: dict[str, Any]) -> Fault:
        target = entry.get("target") or {}
        code = target.get("code") or (entry.get("magnitude") if entry["kind"] == "xid" else None)
        gpu = target.get("gpu")
        return cls(
            id=str(entry["id"]),
            kind=str(entry["kind"]),
            onset=float(entry["onset_unix"]),
            end=float(entry["end_unix"]),
            node=target.get("node") or entry.get("node"),
            gpu=int(gpu) if isinstance(gpu, int | float) else None,
            code=int(code) if entry["kind"] == "xid" and code else None,
            benign=bool(entry.get("benign", False)),
            job=str(entry["job"]) if entry.get("job") is not None else None,
            magnitude=entry.get("magnitude"),
            hardware=entry.get("hardware", True) is not False,
            line=entry,
        )


def load_faults(path: str | Path) -> list[Fault]:
    """Every truth line as a :class:`Fault`, sorted by onset, then id (benign disturbances included:
    ``benign`` says which)."""
    faults = []
    for entry in load_truth(path):
        try:
            faults.append(Fault.from_line(entry))
        except (TypeError, ValueError) as exc:
            raise TruthError(f"{path}: line {entry.get('id')!r} has a malformed value: {exc}") from exc
    return faults


def write_lines(path: str | Path, lines: list[dict[str, Any]]) -> None:
    """Replace the whole file by rename, so a reader sees the old or the new file, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in lines))
    os.replace(tmp, path)


def write_scenario(path: str | Path, info: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
