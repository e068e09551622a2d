"""Scoped bearer tokens for FleetSight's HTTP APIs (health, anomaly, chatbot): one scheme, one parser,
one FastAPI dependency.

Tokens never live in a configuration file of the repository: they come from ``<PREFIX>_TOKENS``
("tokA=read,drain;tokB=read") or from the file named by ``<PREFIX>_TOKENS_FILE`` (one
``token scope,scope`` per line, ``#`` comments). A token is compared in constant time and never logged;
what a handler learns of its caller is the token's last four characters. Reads may be open on the
cluster network by configuration (``open_reads``); every other scope always needs a token.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import HTTPException, Request

READ = "read"


class TokenError(ValueError):
    """A token list names a scope the service does not know, or its file cannot be read."""


def parse_tokens(text: str, known_scopes: tuple[str, ...], separator: str = ";") -> dict[str, frozenset[str]]:
    """ "tokA=read,drain;tokB=read" (environment) or one "token scope,scope" per line (file)."""
    tokens: dict[str, frozenset[str]] = {}
    for entry in text.split(separator):
        entry = entry.strip()
        if not entry or entry.startswith("#"):
            continue
        token, _, scopes = entry.replace("=", " ", 1).partition(" ")
        wanted = frozenset(s.strip() for s in scopes.split(",") if s.strip())
        unknown = wanted - set(known_scopes)
        if unknown:
            raise TokenError(
                f"token with unknown scope(s) {', '.join(sorted(unknown))} (known: {', '.join(known_scopes)})"
            )
        tokens[token] = wanted
    return tokens


def load_tokens(
    prefix: str, known_scopes: tuple[str, ...], environ: Mapping[str, str] = os.environ
) -> dict[str, frozenset[str]]:
    """The tokens of ``<prefix>_TOKENS`` and of the file ``<prefix>_TOKENS_FILE`` names."""
    tokens = parse_tokens(environ.get(f"{prefix}_TOKENS", ""), known_scopes)
    path = environ.get(f"{prefix}_TOKENS_FILE")
    if path:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise TokenError(f"{prefix}_TOKENS_FILE {path}: cannot read: {exc.strerror}") from None
        tokens.update(parse_tokens(text, known_scopes, separator="\n"))
    return tokens


@dataclass
class TokenGuard:
    """Who may call what: the tokens with their scopes, and whether reads are open."""

    tokens: Mapping[str, frozenset[str]] = field(default_factory=dict)
    open_reads: bool = True
    # Other scopes a deployment opens to callers without a token (the chatbot's "ask", by configuration).
    open_scopes: frozenset[str] = frozenset()

    def scopes_of(self, request: Request) -> frozenset[str] | None:
        """The caller's scopes; None without a token; 401 for a malformed or unknown one."""
        header = request.headers.get("authorization", "")
        if not header:
            return None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise HTTPException(401, "Authorization must be 'Bearer <token>'", {"WWW-Authenticate": "Bearer"})
        for known, scopes in self.tokens.items():
            if hmac.compare_digest(known.encode(), token.strip().encode()):
                return scopes
        raise HTTPException(401, "unknown token", {"WWW-Authenticate": "Bearer"})

    def require(self, scope: str) -> Callable[[Request], Awaitable[str]]:
        """A FastAPI dependency: the caller (last four characters of its token, or ``anonymous`` for an
        open read), or 401/403 naming the scope that is missing."""

        async def check(request: Request) -> str:
            scopes = self.scopes_of(request)
            if (scope == READ and self.open_reads) or scope in self.open_scopes:
                return "anonymous"
            if scopes is None:
                raise HTTPException(
                    401, f"this needs a bearer token with scope {scope!r}", {"WWW-Authenticate": "Bearer"}
                )
            if scope not in scopes:
                have = ", ".join(sorted(scopes)) or "none"
                raise HTTPException(403, f"the token lacks scope {scope!r} (it has: {have})")
            return request.headers["authorization"][-4:]  # who did it, without the secret

        return check


def caller_identity(request: Request) -> str:
    """Who is calling, for per-caller limits: a digest of the bearer token (never the token itself),
    else the client's address."""
    header = request.headers.get("authorization", "")
    if header:
        return "token:" + hashlib.sha256(header.encode()).hexdigest()[:16]
    return "addr:" + (request.client.host if request.client else "unknown")


# Request bodies FleetSight's APIs accept: a drain reason or a chat question is a few hundred bytes.
MAX_BODY_BYTES = 64 * 1024


class BodyLimit:
    """ASGI middleware: a request whose body is larger than ``max_bytes`` gets 413 before the app reads
    it (by Content-Length), or as soon as the streamed body passes the limit (chunked uploads)."""

    def __init__(self, app: Callable, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._refuse(send)
            return
        seen = 0
        refused = False

        async def limited_receive() -> dict:
            # Past the limit: answer 413 now, and tell the app the client went away.
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request" and not refused:
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    refused = True
                    await self._refuse(send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: dict) -> None:
            if not refused:  # the app's own answer, unless 413 went first
                await send(message)

        await self.app(scope, limited_receive, guarded_send)

    async def _refuse(self, send: Callable) -> None:
        body = b'{"detail": "request body larger than %d bytes"}' % self.max_bytes
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


# What the APIs answer besides success, documented in their OpenAPI schemas (FastAPI(responses=...)) so
# that a client, and a fuzzer checking answers against the schema, knows them.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "No token, or an unknown or malformed one (WWW-Authenticate: Bearer)"},
    403: {"description": "The token lacks the scope the route needs"},
    404: {"description": "The node, job or route is not known"},
    413: {"description": f"The request body is larger than {MAX_BODY_BYTES} bytes"},
    503: {"description": "Too many requests at once, or the service is not ready yet"},
}
# A route that answers pre-rendered JSON (bytes) documents its body as an object.
JSON_OBJECT_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {"description": "JSON object", "content": {"application/json": {"schema": {"type": "object"}}}}
}
