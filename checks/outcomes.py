"""The outcome of a check: a :class:`Verdict` (outcome, one-line summary, evidence) and the guard that
makes every parser return one.

Three outcomes (issue 41, "blind is not broken"). *passed* and *failed* are what the tool measured: a
test that says it failed, a bandwidth under its floor, a row remap pending. *unknown* is a check that
could not observe the node, with its ``reason`` (BLIND_REASONS): every parser takes the tool's raw text,
and output that is empty, truncated, not the tool's format, or holds a status word the parser does not
know, and a ``dcgmi diag`` that says it could not run (its ``runtime_error``), are unknown
("unreadable"), never a failure and never a pass. A check that cannot read its evidence has neither
shown the node healthy nor shown it broken.

No parser raises: each public one is wrapped (:func:`never_raises`) so that an exception it did not
expect (a shape of the document nobody foresaw) becomes an unknown whose summary names the exception's
type, not a traceback in the runner. ``parser.__wrapped__`` is the bare function.

Its own module because the runner, the results service and every parser (checks/parsers.py,
checks/diag_parser.py) share this contract, which changes for other reasons than any one tool's format.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

HEAD = 400  # characters of unreadable output kept as evidence

OUTCOMES = ("passed", "failed", "unknown")
# Why a check could not observe (an unknown's ``reason``): a small fixed set, so that it can be a label.
BLIND_REASONS = (
    "tool_missing",  # the command is not installed on the node (or not in the image)
    "timeout",  # the tool or the page did not answer in time
    "unreachable",  # connection refused, no route, DNS
    "unauthorised",  # 401/403, a missing or unreadable credentials file
    "tls",  # the certificate or the protocol does not match (an exporter's TLS set up differently)
    "not_published",  # the page is there but the fields the check reads are not (counters file)
    "unreadable",  # output that is not the tool's format, truncated, or words the parser does not know
    "not_run",  # the check cannot run this way (a pair check asked for on one node)
)


@dataclass
class Verdict:
    """``outcome`` is passed, failed or unknown; an unknown (the check could not observe the node) says
    why in ``reason`` (one of BLIND_REASONS) and never counts against the node."""

    outcome: str
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)
    reason: str = ""

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome {self.outcome!r} is not one of {', '.join(OUTCOMES)}")
        if (self.outcome == "unknown") != bool(self.reason):
            raise ValueError("an unknown names its reason, and only an unknown has one")

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"

    @classmethod
    def judged(cls, passed: bool, summary: str, evidence: dict[str, Any] | None = None) -> Verdict:
        """A verdict on what the tool saw: passed or failed."""
        return cls("passed" if passed else "failed", summary, evidence or {})

    @classmethod
    def blind(cls, reason: str, summary: str, evidence: dict[str, Any] | None = None) -> Verdict:
        if reason not in BLIND_REASONS:
            raise ValueError(f"reason {reason!r} is not one of {', '.join(BLIND_REASONS)}")
        return cls("unknown", summary, evidence or {}, reason)


def unreadable(what: str, why: str, text: str) -> Verdict:
    return Verdict.blind("unreadable", f"{what}: unreadable output ({why})", {"output_head": text[:HEAD]})


# ---------------------------------------------------------------------------------- no traceback
ParserT = TypeVar("ParserT", bound=Callable[..., Verdict])


def never_raises(what: str) -> Callable[[ParserT], ParserT]:
    """A parser that returns an unknown ("unreadable", the exception's type in the summary) where it
    would have raised. The bare parser stays reachable as ``__wrapped__``."""

    def wrap(parse: ParserT) -> ParserT:
        @functools.wraps(parse)
        def guarded(*args: Any, **kwargs: Any) -> Verdict:
            try:
                return parse(*args, **kwargs)
            except Exception as exc:  # the whole point: whatever the output held, a verdict comes back
                text = "\n".join(a for a in args if isinstance(a, str))
                detail = " ".join(str(exc).split())[:200]
                return Verdict.blind(
                    "unreadable",
                    f"{what}: unreadable output (the parser met {type(exc).__name__}: {detail})",
                    {"output_head": text[:HEAD], "parser_error": type(exc).__name__},
                )

        return cast(ParserT, guarded)

    return wrap
