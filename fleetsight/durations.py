"""Durations and instants as FleetSight's files and command lines write them, for every component."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def seconds(value: Any) -> float:
    """Seconds from 90, "90", "90s", "5m", "1.5h", "2d"; ValueError otherwise."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    match = None if isinstance(value, bool) else _DURATION.match(str(value))
    if not match:
        raise ValueError(f"expected a duration like 90s, 5m, 2h; got {value!r}")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def instant(value: Any) -> dt.datetime:
    """An aware UTC time from an ISO 8601 text (UTC unless it says otherwise) or a datetime;
    ValueError otherwise."""
    moment = (
        value
        if isinstance(value, dt.datetime)
        else dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    )
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.UTC)
