"""How a scenario file's fields are read: the error every mistake raises (naming the field), durations
and times, mappings, known keys, bounded integers, indices and canonical spellings.

Its own module because every section's reader (twin/scenario.py, twin/scenario_jobs.py,
twin/scenario_faults.py) uses these, and the error must be one class whichever section found it.
"""

from __future__ import annotations

import datetime as dt
import difflib
from typing import Any

from fleetsight import durations


class ScenarioError(ValueError):
    """A scenario file that cannot be used, with the reason."""


def parse_duration(value: Any, where: str) -> float:
    """Seconds from 90, "90s", "5m", "1.5h", "2d"."""
    try:
        return durations.seconds(value)
    except ValueError:
        raise ScenarioError(f"{where}: expected a duration like 90s, 5m, 2h; got {value!r}") from None


def parse_time(value: Any, where: str) -> dt.datetime:
    try:
        return durations.instant(value)
    except ValueError as exc:
        raise ScenarioError(f"{where}: expected an ISO 8601 time, got {value!r}") from exc


def as_mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ScenarioError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def check_known_keys(raw: dict[str, Any], allowed: set[str] | tuple[str, ...], where: str) -> None:
    """Refuse a key the twin does not know: a typo (``magnitud``) must not fall back to a default."""
    for key in raw:
        if key not in allowed:
            hint = difflib.get_close_matches(str(key), list(allowed), n=1)
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ScenarioError(
                f"{where}.{key}: unknown key{suggestion}; known: {', '.join(sorted(allowed))}".lstrip(".")
            )


def bounded_int(raw: dict[str, Any], key: str, default: int, where: str, low: int, high: int) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ScenarioError(f"{where}.{key}: expected an integer {low}..{high}, got {value!r}")
    return value


def index_in_range(value: Any, where: str, count: int, prefix: str = "") -> int:
    text = str(value)
    if prefix and text.startswith(prefix):
        text = text[len(prefix) :]
    try:
        index = int(text)
    except ValueError as exc:
        raise ScenarioError(f"{where}: expected {prefix or ''}0..{count - 1}, got {value!r}") from exc
    if not 0 <= index < count:
        raise ScenarioError(f"{where}: {value!r} out of range {prefix}0..{prefix}{count - 1}")
    return index


def canonical_name(value: Any, names: dict[str, tuple[str, ...]], where: str, what: str) -> str:
    """The canonical name of one of ``names`` (any of its spellings), or a ScenarioError listing them."""
    text = str(value).strip().lower()
    for canonical, spellings in names.items():
        if text in spellings:
            return canonical
    raise ScenarioError(f"{where}: expected {what} ({', '.join(names)}), got {value!r}")
