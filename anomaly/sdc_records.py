"""Training records for the silent-corruption check (anomaly/sdc.py), from what a job logs: its raw lines
(a rank's log file, the twin's output) or the log store's documents, whose fields the log pipeline parsed
from the same lines (pipelines/catalogue.py: Megatron's progress line and the key=value line).

The line reader follows the pipeline's patterns for the two forms the check needs, so that an evaluation
reads the twin's lines offline as the pipeline would index them:

- Megatron-LM's ``iteration N/ M | ... | lm loss: X | ... | grad norm: G |`` (job-wide values);
- ``step=N [replica=R] ... loss=X [grad_norm=G] [step_time_ms=T]``, keys in that order (lower-cased);
  with ``replica=`` it is one data-parallel replica's local values.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from .sdc import Record, SdcInputError

_NUMBER = r"(?:-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|[-+]?(?:nan|inf(?:inity)?))(?![^ ,;|])"
MEGATRON = re.compile(
    r"iteration\s*(?P<step>[0-9]+)/\s*[0-9]+\s*\|.*?lm loss: (?P<loss>" + _NUMBER + r")"
    r"(?:.*?grad norm: (?P<grad>" + _NUMBER + r"))?",
    re.IGNORECASE,
)
KEY_VALUES = re.compile(
    r"step=(?P<step>[0-9]+)(?:.*?replica=(?P<replica>[0-9]+))?.*?loss=(?P<loss>" + _NUMBER + r")"
    r"(?:.*?grad_norm=(?P<grad>" + _NUMBER + r"))?"
)
NODE = re.compile(r"\bnode=(?P<node>[^\s,;|]+)")


def _number(text: str | None) -> float | None:
    return None if text is None else float(text.lower().replace("infinity", "inf"))


def parse_line(text: str, node: str = "") -> Record | None:
    """The record a log line holds, or None for any other line. ``node``: the host whose log it is (a
    replica line's own ``node=`` wins)."""
    match = MEGATRON.search(text)
    if match:
        return Record(int(match["step"]), _number(match["loss"]), _number(match["grad"]), None, node)
    match = KEY_VALUES.search(text.lower())
    if match:
        replica = int(match["replica"]) if match["replica"] is not None else None
        named = NODE.search(text)
        where = named["node"] if named and replica is not None else node
        return Record(int(match["step"]), _number(match["loss"]), _number(match["grad"]), replica, where)
    return None


def parse_lines(lines: Iterable[str], node: str = "") -> list[Record]:
    """Every record in the lines; a job-wide line logged by many ranks counts once per step."""
    records: list[Record] = []
    seen: set[tuple[int, int | None]] = set()
    for text in lines:
        record = parse_line(text, node)
        if record is None or (record.step, record.replica) in seen:
            continue
        seen.add((record.step, record.replica))
        records.append(record)
    return records


def _path(source: Mapping[str, Any], dotted: str) -> Any:
    """A field of an indexed document, nested (``training: {step: ...}``) or flat (``training.step``)."""
    if dotted in source:
        return source[dotted]
    value: Any = source
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def from_document(source: Mapping[str, Any]) -> Record | None:
    """The record of one indexed document (its ``_source``), or None when it holds no training step.
    A non-finite loss is indexed as text (``training.loss_finite: false``): it reads as NaN here."""
    if not isinstance(source, Mapping):
        raise SdcInputError(f"a log document must be a JSON object, got {type(source).__name__}")
    step = _path(source, "training.step")
    if step is None:
        return None
    if isinstance(step, bool) or not isinstance(step, int | float) or step < 0 or step != int(step):
        raise SdcInputError(f"document {_path(source, '@timestamp')}: training.step {step!r} is not a step")
    loss = _path(source, "training.loss")
    if _path(source, "training.loss_finite") is False:
        loss = math.nan
    grad = _path(source, "training.grad_norm")
    replica = _path(source, "training.replica")
    for name, value in (("training.loss", loss), ("training.grad_norm", grad), ("training.replica", replica)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise SdcInputError(f"document at step {int(step)}: {name} {value!r} is not a number")
    node = _path(source, "host.name") or ""
    return Record(
        int(step),
        None if loss is None else float(loss),
        None if grad is None else float(grad),
        None if replica is None else int(replica),
        str(node),
    )


def from_documents(sources: Iterable[Mapping[str, Any]]) -> list[Record]:
    """The records of a job's documents: one per step and replica (every rank logs the job-wide line)."""
    records: list[Record] = []
    seen: set[tuple[int, int | None]] = set()
    for source in sources:
        record = from_document(source)
        if record is None or (record.step, record.replica) in seen:
            continue
        seen.add((record.step, record.replica))
        records.append(record)
    return records
