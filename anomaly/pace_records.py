"""A job's pace records from what it logs: the step time of each step and, where a rank splits it, where
the step went (``data_ms``, ``compute_ms``, ``comm_ms``). From raw lines (a rank's log file, the twin's
output) or from the log store's documents (pipelines/catalogue.py parses the same keys as numbers).

Two line forms carry a step time: the per-rank or per-replica key=value line (docs/anomaly.md, "What a
job logs"), ``step=N [replica=R] [node=H] ... step_time_ms=T [data_ms=D compute_ms=C comm_ms=M]``, and
Megatron-LM's progress line (``elapsed time per iteration (ms): T``, job-wide: no split).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

PARTS = ("data_ms", "compute_ms", "comm_ms")
_KEY = re.compile(r"\b([a-z_]+)=([^\s,;|]+)")
_MEGATRON = re.compile(
    r"iteration\s*(?P<step>[0-9]+)/.*?elapsed time per iteration \(ms\):\s*(?P<ms>[0-9.eE+-]+)", re.I
)


class PaceInputError(ValueError):
    """Records the pace check cannot read: says which and why."""


@dataclass(frozen=True)
class PaceRecord:
    """One logged step: job-wide (``replica`` None) or one rank's (or replica's), with its split."""

    step: int
    step_ms: float | None
    replica: int | None = None
    node: str = ""
    data_ms: float | None = None
    compute_ms: float | None = None
    comm_ms: float | None = None
    hosts: int = 1  # a job-wide line: the nodes that logged it (every rank prints Megatron's line)

    @property
    def split(self) -> bool:
        return self.data_ms is not None and self.compute_ms is not None and self.comm_ms is not None


def _float(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def parse_line(text: str, node: str = "") -> PaceRecord | None:
    """The pace record a line holds, or None for any other line (a line without a step time too)."""
    match = _MEGATRON.search(text)
    if match:
        return PaceRecord(int(match["step"]), _float(match["ms"]), None, node)
    lower = text.lower()
    if "step=" not in lower or "step_time_ms=" not in lower:
        return None
    keys = dict(_KEY.findall(lower[lower.index("step=") :]))
    if not keys.get("step", "").isdigit():
        return None
    replica = keys.get("replica")
    named = re.search(r"\bnode=([^\s,;|]+)", text)
    return PaceRecord(
        int(keys["step"]),
        _float(keys.get("step_time_ms")),
        int(replica) if replica and replica.isdigit() else None,
        named[1] if named else node,
        *(_float(keys.get(part)) for part in PARTS),
    )


def parse_lines(lines: Iterable[str], node: str = "") -> list[PaceRecord]:
    """Every record in the lines; a job-wide line logged by many ranks counts once per step, and a step
    logged again (a requeued job redoing it) counts as its last logging."""
    records: dict[tuple[int, int | None], PaceRecord] = {}
    hosts: dict[int, set[str]] = {}
    for text in lines:
        record = parse_line(text, node)
        if record is not None:
            records[(record.step, record.replica)] = record
            if record.replica is None:
                hosts.setdefault(record.step, set()).add(record.node)
    return _counted(records, hosts)


def _counted(
    records: dict[tuple[int, int | None], PaceRecord], hosts: dict[int, set[str]]
) -> list[PaceRecord]:
    """The records in order, each job-wide one with the number of nodes that logged its step."""
    out = [
        r if r.replica is not None else replace(r, hosts=max(1, len(hosts[r.step]))) for r in records.values()
    ]
    return sorted(out, key=lambda r: (r.step, -1 if r.replica is None else r.replica))


def _path(source: Mapping[str, Any], dotted: str) -> Any:
    if dotted in source:
        return source[dotted]
    value: Any = source
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _number(source: Mapping[str, Any], name: str, step: int) -> float | None:
    value = _path(source, f"training.{name}")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PaceInputError(f"document at step {step}: training.{name} {value!r} is not a number")
    return float(value) if math.isfinite(value) and value >= 0 else None


def from_documents(sources: Iterable[Mapping[str, Any]]) -> list[PaceRecord]:
    """The records of a job's indexed documents (``_source``), as parse_lines reads lines."""
    records: dict[tuple[int, int | None], PaceRecord] = {}
    hosts: dict[int, set[str]] = {}
    for source in sources:
        if not isinstance(source, Mapping):
            raise PaceInputError(f"a log document must be a JSON object, got {type(source).__name__}")
        step = _path(source, "training.step")
        if step is None:
            continue
        if isinstance(step, bool) or not isinstance(step, int | float) or step < 0 or step != int(step):
            raise PaceInputError(f"training.step {step!r} is not a step")
        step = int(step)
        replica = _path(source, "training.replica")
        if replica is not None and (isinstance(replica, bool) or not isinstance(replica, int | float)):
            raise PaceInputError(f"document at step {step}: training.replica {replica!r} is not a number")
        record = PaceRecord(
            step,
            _number(source, "step_time_ms", step),
            None if replica is None else int(replica),
            str(_path(source, "host.name") or ""),
            *(_number(source, part, step) for part in PARTS),
        )
        records[(record.step, record.replica)] = record
        if record.replica is None:
            hosts.setdefault(step, set()).add(record.node)
    return _counted(records, hosts)
