"""Who may use the chatbot's HTTP API, and how much: scoped tokens (fleetsight/auth.py's scheme, as the
health and anomaly services), reads and asks open to the cluster network only by configuration, a
per-caller rate limit on asks, and a deadline per answer.

Scopes: ``read`` (``GET /v1/status``, the cited files) and ``ask`` (``POST /v1/ask``). Tokens come from
``FLEETSIGHT_CHATBOT_TOKENS`` ("tokA=read,ask;tokB=ask") or the file ``FLEETSIGHT_CHATBOT_TOKENS_FILE``
names, never from the command line, and are never logged. The Slack endpoint is authenticated by Slack's
signing secret instead (chatbot/slack.py).
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fleetsight import auth

ASK = "ask"
SCOPES = (auth.READ, ASK)
TOKENS_PREFIX = "FLEETSIGHT_CHATBOT"
RATE_ENV = "FLEETSIGHT_CHATBOT_RATE_LIMIT"
# An answer costs live look-ups and maybe a model call: 20 a minute is a person asking fast, and
# stops one caller from spending the model's key or the live sources for everyone else.
DEFAULT_RATE = "20/minute"
# Live look-ups take at most a few times their 1.5 s timeout, the model its own deadline (20 s).
DEFAULT_ASK_TIMEOUT_S = 30.0
PERIODS = {"s": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}
MAX_CALLERS = 10_000  # buckets kept; the least recently seen caller is forgotten first


class AccessError(ValueError):
    """A rate or token setting the service cannot use; the message says which and why."""


@dataclass(frozen=True)
class Rate:
    count: int  # asks per period, and the burst a fresh caller may spend at once
    period_s: float

    @classmethod
    def parse(cls, text: str) -> Rate | None:
        """ "20/minute", "5/s", "300/hour"; "0" or "off": no limit (None)."""
        text = text.strip().lower()
        if text in ("0", "off", "none"):
            return None
        match = re.fullmatch(r"(\d+)\s*/\s*([a-z]+)", text)
        if not match or match.group(2) not in PERIODS or int(match.group(1)) < 1:
            raise AccessError(
                f"rate limit {text!r}: use COUNT/PERIOD with PERIOD one of second, minute, hour "
                "(e.g. 20/minute), or off"
            )
        return cls(int(match.group(1)), PERIODS[match.group(2)])

    def __str__(self) -> str:
        return f"{self.count}/{self.period_s:g}s"


class RateLimiter:
    """A token bucket per caller: ``rate.count`` asks at once, refilled at ``count`` per ``period``.
    Thread-safe; remembers at most ``max_callers`` callers (the idlest are forgotten: a forgotten caller
    starts again with a full bucket, which is what it would have had by then anyway)."""

    def __init__(
        self, rate: Rate, max_callers: int = MAX_CALLERS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.max_callers = max_callers
        self.clock = clock
        self.buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # caller -> (tokens, at)
        self.lock = threading.Lock()

    def take(self, caller: str) -> float:
        """0 when the caller may ask now (one ask is counted); else the seconds until it may."""
        per_second = self.rate.count / self.rate.period_s
        with self.lock:
            now = self.clock()
            tokens, at = self.buckets.pop(caller, (float(self.rate.count), now))
            tokens = min(float(self.rate.count), tokens + (now - at) * per_second)
            wait = 0.0 if tokens >= 1.0 else (1.0 - tokens) / per_second
            self.buckets[caller] = (tokens - 1.0 if wait == 0.0 else tokens, now)
            while len(self.buckets) > self.max_callers:
                self.buckets.popitem(last=False)
        return wait


def retry_after(wait_s: float) -> str:
    """Retry-After in whole seconds, never 0 for a refused ask."""
    return str(max(1, math.ceil(wait_s)))


@dataclass(frozen=True)
class Access:
    """The service's access settings, from the command line and the environment."""

    tokens: Mapping[str, frozenset[str]] = field(default_factory=dict)
    open_reads: bool = True
    open_asks: bool = False
    rate: Rate | None = field(default_factory=lambda: Rate.parse(DEFAULT_RATE))
    ask_timeout_s: float = DEFAULT_ASK_TIMEOUT_S

    def guard(self) -> auth.TokenGuard:
        return auth.TokenGuard(
            self.tokens, self.open_reads, frozenset({ASK}) if self.open_asks else frozenset()
        )

    @classmethod
    def from_env(
        cls,
        open_reads: bool = True,
        open_asks: bool = False,
        rate: str | None = None,
        ask_timeout_s: float = DEFAULT_ASK_TIMEOUT_S,
        environ: Mapping[str, str] = os.environ,
    ) -> Access:
        """Tokens from FLEETSIGHT_CHATBOT_TOKENS(_FILE); the rate from ``rate``, else
        $FLEETSIGHT_CHATBOT_RATE_LIMIT, else 20/minute."""
        try:
            tokens = auth.load_tokens(TOKENS_PREFIX, SCOPES, environ)
        except auth.TokenError as exc:
            raise AccessError(str(exc)) from None
        if ask_timeout_s <= 0:
            raise AccessError(f"ask timeout {ask_timeout_s:g}: must be positive")
        parsed = Rate.parse(rate or environ.get(RATE_ENV) or DEFAULT_RATE)
        return cls(tokens, open_reads, open_asks, parsed, ask_timeout_s)
