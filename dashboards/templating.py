"""Grafana's interpolation of a panel query, as Grafana documents it, in one place: the project's own
runner (dashboards/verify.py) and the history check (evaluation/dashboards.py) send the real Prometheus
and OpenSearch what Grafana would, without a Grafana (its server is AGPL: the project never builds it).

Documented semantics implemented here (tests/dashboards/test_templating.py cites each page):
- `$__interval`: the time range divided by the max data points, rounded to a readable step, never below
  the min interval (the datasource's scrape interval); `$__interval_ms` in milliseconds.
- `$__rate_interval`: max($__interval + scrape interval, 4 * scrape interval).
- `$__range`, `$__range_s`, `$__range_ms`: to - from.
- `$var`, `${var}`, `${var:format}` and the deprecated `[[var]]` / `[[var:format]]`; formats csv, pipe,
  regex, lucene, raw; a multi-value or Include-All variable on a Prometheus datasource becomes a regex
  of its escaped values, `(a|b)`; the All option is all values, or the custom all value, never escaped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise

# Readable steps $__interval rounds to (seconds). Grafana documents the rounding, not its table; these are
# the steps it shows, and a value rounds to the nearest of them (the midpoint between two decides).
STEPS_S = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600,
    900, 1200, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 604800, 2592000, 31536000,
)  # fmt: skip
# Regex metacharacters of RE2 (Prometheus's regex engine), escaped in a multi-value selection.
REGEX_SPECIAL = re.compile(r"[\\^$.|?*+()\[\]{}]")
# Lucene's reserved characters, escaped in a single value sent to the Elasticsearch datasource.
LUCENE_SPECIAL = re.compile(r'([+\-=&|><!(){}\[\]^"~*?:\\/])')
# Grafana's three reference syntaxes: [[name]] / [[name:format]], ${name} / ${name:format}, $name.
REFERENCE = re.compile(r"\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?::([^}]+))?\}|\$(\w+)")
ALL = "$__all"  # the value Grafana stores when the All option is selected


@dataclass(frozen=True)
class Selected:
    """A dashboard variable's current value(s) and the options that decide how it is formatted."""

    values: tuple[str, ...]
    multi: bool = False
    include_all: bool = False
    all_selected: bool = False
    all_value: str | None = None  # the variable's Custom all value

    @property
    def regex_formatted(self) -> bool:
        """Grafana turns a variable into a regex only when it can hold several values."""
        return self.multi or self.include_all


def round_interval(seconds: float) -> float:
    """The readable step nearest to `seconds` (2.4 s -> 2 s, 3.6 s -> 5 s, 100 s -> 2 m)."""
    for smaller, larger in pairwise(STEPS_S):
        if seconds < (smaller + larger) / 2:
            return smaller
    return STEPS_S[-1]


def interval_s(range_s: float, max_data_points: int, min_interval_s: float) -> float:
    """$__interval: range / max data points, rounded, floored at the min interval."""
    return max(min_interval_s, round_interval(range_s / max_data_points))


def rate_interval_s(interval: float, scrape_s: float) -> float:
    """$__rate_interval: wide enough for four scrapes, and one step plus a scrape."""
    return max(interval + scrape_s, 4 * scrape_s)


def duration(seconds: float) -> str:
    """A PromQL duration in the largest unit that holds it whole (120 -> 2m, 125 -> 125s)."""
    milliseconds = round(seconds * 1000)
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if milliseconds >= size and milliseconds % size == 0:
            return f"{milliseconds // size}{unit}"
    return f"{milliseconds}ms"


def builtins(
    start: float,
    end: float,
    scrape_s: float,
    max_data_points: int = 1000,
    min_interval_s: float | None = None,
) -> dict[str, str]:
    """Grafana's global variables for a query over [start, end]; the min interval defaults to the scrape
    interval (the datasource's `timeInterval`), as Grafana's does."""
    range_ms = round((end - start) * 1000)
    interval = interval_s(
        end - start, max_data_points, scrape_s if min_interval_s is None else min_interval_s
    )
    return {
        "__interval": duration(interval),
        "__interval_ms": str(round(interval * 1000)),
        "__rate_interval": duration(rate_interval_s(interval, scrape_s)),
        "__range": f"{round(range_ms / 1000)}s",
        "__range_s": str(round(range_ms / 1000)),
        "__range_ms": str(range_ms),
    }


def regex_escape(value: str) -> str:
    return REGEX_SPECIAL.sub(lambda m: "\\" + m.group(0), value)


def lucene_escape(value: str) -> str:
    return LUCENE_SPECIAL.sub(r"\\\1", value)


def formatted(values: tuple[str, ...], fmt: str) -> str:
    """An explicit `${var:fmt}` (Grafana's advanced variable format options)."""
    if fmt == "csv":
        return ",".join(values)
    if fmt == "pipe":
        return "|".join(values)
    if fmt == "regex":
        escaped = [regex_escape(value) for value in values]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
    if fmt == "lucene":
        if len(values) == 1:
            return lucene_escape(values[0])
        return "(" + " OR ".join(f'"{lucene_escape(value)}"' for value in values) + ")"
    if fmt == "raw":
        return values[0] if len(values) == 1 else "{" + ",".join(values) + "}"
    raise ValueError(f"unknown variable format {fmt!r} (known: csv, pipe, regex, lucene, raw)")


def datasource_default(selected: Selected, datasource: str) -> str:
    """The datasource's own formatting when the query names no format."""
    if datasource == "elasticsearch":
        return formatted(selected.values, "lucene")
    if not selected.regex_formatted:
        return ",".join(selected.values)
    # Inside a PromQL double-quoted string a regex backslash must itself be escaped.
    return formatted(selected.values, "regex").replace("\\", "\\\\")


def value_of(selected: Selected, fmt: str | None, datasource: str) -> str:
    if selected.all_selected and selected.all_value is not None:
        return selected.all_value  # the custom all value is never escaped
    return formatted(selected.values, fmt) if fmt else datasource_default(selected, datasource)


def interpolate(text: str, variables: Mapping[str, str | Selected], datasource: str = "prometheus") -> str:
    """`text` with every variable it references replaced as Grafana would before sending it to the
    datasource (`prometheus` or `elasticsearch`); a name that is no variable is left as it is."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3) or match.group(5)
        fmt = match.group(2) or match.group(4)
        found = variables.get(name)
        if found is None:
            return match.group(0)
        selected = found if isinstance(found, Selected) else Selected((found,))
        return value_of(selected, fmt, datasource)

    return REFERENCE.sub(replace, text)


def selection(variable: Mapping[str, object], chosen: str | list[str] | tuple[str, ...]) -> Selected:
    """A dashboard JSON variable (its `multi`, `includeAll`, `allValue`) with a choice: one value, several,
    or `ALL` followed by every option's value."""
    values = (chosen,) if isinstance(chosen, str) else tuple(chosen)
    is_all = bool(values) and values[0] == ALL
    all_value = variable.get("allValue")
    return Selected(
        values[1:] if is_all else values,
        multi=bool(variable.get("multi")),
        include_all=bool(variable.get("includeAll")),
        all_selected=is_all,
        all_value=str(all_value) if all_value else None,
    )
