"""PromQL text built from values: string literals and exact-match regexes, for the services that put
node and job names into their queries."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable


def quote(value: str) -> str:
    """A PromQL string literal (Go escapes, as JSON writes them)."""
    return json.dumps(value)


def any_of(values: Iterable[str]) -> str:
    """A PromQL regex literal matching exactly these values (RE2 takes Python's escapes of punctuation)."""
    return quote("|".join(re.escape(v) for v in sorted(values)))
