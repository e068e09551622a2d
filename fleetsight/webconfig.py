"""The web configuration of FleetSight's HTTP endpoints, in exporter-toolkit's file format (what
node_exporter and dcgm-exporter read with ``--web.config.file``): TLS for the endpoint, and (exporters
only) basic auth with bcrypt hashes. The exporters serve it with their own HTTP server; the services
(health, anomaly, chatbot, checks, dashboards) through uvicorn (``uvicorn_tls``, ``run_server``).

    tls_server_config:
      cert_file: /etc/fleetsight/tls/node.crt
      key_file: /etc/fleetsight/tls/node.key
      client_ca_file: /etc/fleetsight/tls/ca.crt     # optional: with client_auth_type, scrapers need a cert
      client_auth_type: RequireAndVerifyClientCert    # or NoClientCert (default)
    basic_auth_users:
      prometheus: $2y$10$...                          # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':')

``promtool check web-config FILE`` checks the same file. A mistake (unknown key, missing file, a
password instead of a hash) stops the exporter or service at start with the file and the key named.

The services take TLS from it but refuse ``basic_auth_users``: they already authenticate every caller
with scoped bearer tokens (fleetsight/auth.py), and Prometheus scrapes them with a ``read`` token
(``authorization: {credentials_file: ...}``). A second credential store, checked with bcrypt on
/metrics alone, would be one more secret to rotate and would leave the API routes as they are.
"""

from __future__ import annotations

import base64
import binascii
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import yaml

TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version"}
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}


class WebConfigError(ValueError):
    """The web configuration file is wrong; the message names the file and the key."""


@dataclass
class WebConfig:
    tls: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    # bcrypt is slow on purpose (~50 ms): a scraper's credentials, once checked, are remembered
    _verified: set[tuple[str, str]] = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def authorized(self, header: str | None) -> bool:
        """Whether an Authorization header passes basic auth (always, when no users are configured)."""
        if not self.users:
            return True
        scheme, _, encoded = (header or "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        hashed = self.users.get(user)
        if hashed is None:
            return False
        key = (user, password)
        with self._lock:
            if key in self._verified:
                return True
        import bcrypt  # only basic auth needs it; load() checked it is there

        if not bcrypt.checkpw(password.encode(), hashed):
            return False
        with self._lock:
            self._verified.add(key)
        return True


def load(path: str | Path) -> WebConfig:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise WebConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise WebConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise WebConfigError(f"{path}: expected a mapping")
    unknown = set(raw) - {"tls_server_config", "basic_auth_users", "http_server_config"}
    if unknown:
        raise WebConfigError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    config = WebConfig()
    if raw.get("tls_server_config"):
        config.tls = _tls(path, raw["tls_server_config"])
    for user, hashed in (raw.get("basic_auth_users") or {}).items():
        if not str(hashed).startswith(("$2a$", "$2b$", "$2y$")):
            raise WebConfigError(f"{path}: basic_auth_users.{user}: expected a bcrypt hash, not a password")
        config.users[str(user)] = str(hashed).encode()
    if config.users:
        _require_bcrypt(path)
    return config


def _require_bcrypt(path: Path) -> None:
    """Basic auth checks bcrypt hashes; an agent without basic auth runs without the bcrypt module."""
    try:
        import bcrypt  # noqa: F401
    except ImportError:
        message = f"{path}: basic_auth_users needs the bcrypt module: pip install bcrypt"
        raise WebConfigError(message) from None


def _tls(path: Path, section: dict) -> ssl.SSLContext:
    unknown = set(section) - TLS_KEYS
    if unknown:
        raise WebConfigError(f"{path}: tls_server_config: unknown key(s) {', '.join(sorted(unknown))}")
    for key in ("cert_file", "key_file"):
        if not section.get(key):
            raise WebConfigError(f"{path}: tls_server_config.{key} is required")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    version = str(section.get("min_version", "TLS12"))
    if version not in TLS_VERSIONS:  # a typo must not quietly mean TLS 1.2
        raise WebConfigError(f"{path}: tls_server_config.min_version: one of {', '.join(TLS_VERSIONS)}")
    context.minimum_version = TLS_VERSIONS[version]
    try:
        context.load_cert_chain(section["cert_file"], section["key_file"])
        auth = section.get("client_auth_type", "NoClientCert")
        if auth not in CLIENT_AUTH:
            raise WebConfigError(
                f"{path}: tls_server_config.client_auth_type: one of {', '.join(CLIENT_AUTH)}"
            )
        context.verify_mode = CLIENT_AUTH[auth]
        if section.get("client_ca_file"):
            context.load_verify_locations(section["client_ca_file"])
    except (OSError, ssl.SSLError) as exc:
        raise WebConfigError(f"{path}: tls_server_config: {exc}") from None
    return context


# ------------------------------------------------------------------------------------------ services
SERVICE_HELP = (
    "TLS for the API and /metrics, in exporter-toolkit's format (tls_server_config; basic_auth_users is "
    "refused: callers and Prometheus use bearer tokens). Default: plain HTTP."
)


def web_config_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--web.config.file`` of a service's serve command (health, anomaly, chatbot)."""
    return click.option(
        "--web.config.file",
        "web_config_file",
        type=click.Path(dir_okay=False),
        default=None,
        help=SERVICE_HELP,
    )(command)


def load_for_service(path: str | Path) -> WebConfig:
    """The file as a service reads it: TLS only; basic auth is named as refused before its hashes are
    looked at, so the message points to what to do instead."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        raw = {}  # load() below names the problem
    if isinstance(raw, dict) and raw.get("basic_auth_users"):
        raise WebConfigError(
            f"{path}: basic_auth_users: FleetSight's services do not take basic auth; they check bearer "
            "tokens (<SERVICE>_TOKENS[_FILE]): give Prometheus a token with scope read "
            "(authorization: {credentials_file: ...}) and remove basic_auth_users"
        )
    return load(path)


def uvicorn_tls(path: str | Path | None) -> dict[str, Any]:
    """uvicorn.run's keyword arguments for ``--web.config.file``: none without a file (plain HTTP), else
    the context this module builds (certificate, client CA, client_auth_type, min_version; the file
    must configure TLS), handed over with uvicorn's ssl_context_factory (its ssl_* arguments cannot set
    a minimum version). A bad file stops the service here, before it starts anything, with the file
    and the key named."""
    if not path:
        return {}
    try:
        context = load_for_service(path).tls
    except WebConfigError as exc:
        raise click.ClickException(f"--web.config.file {exc}") from None
    if context is None:  # the file would change nothing: an operator expecting TLS must hear so
        raise click.ClickException(f"--web.config.file {path}: tls_server_config is required (a service's "
                                   "web configuration carries only TLS)")  # fmt: skip
    return {"ssl_context_factory": lambda _config, _default: context}


def listen_address(listen: str) -> tuple[str, int]:
    """A service's ``--listen HOST:PORT`` as (host, port); ``:PORT`` means loopback. A bad value is a
    usage error naming the option."""
    host, _, port = listen.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(
            f"expected HOST:PORT (e.g. 127.0.0.1:19142), got {listen!r}", param_hint="--listen"
        )
    return host or "127.0.0.1", int(port)


def run_server(
    app: Any, host: str, port: int, tls: dict[str, Any] | None = None, limit_concurrency: int | None = None
) -> None:
    """Run a service's ASGI app until the process is stopped. ``tls``: :func:`uvicorn_tls`'s arguments,
    or plain HTTP. No access lines (each service logs its own events, and an access line per scrape
    would drown them); idle keep-alive connections closed after 5 s; past ``limit_concurrency``
    requests at once the answer is 503 rather than an unbounded queue (None: no limit, for a service
    whose callers must not be refused, such as the scheduler asking the health service)."""
    import uvicorn  # late: the exporters import this module and never serve through uvicorn

    uvicorn.run(
        app, host=host, port=port, log_level="warning", access_log=False, timeout_keep_alive=5,
        limit_concurrency=limit_concurrency, **(tls or {}),
    )  # fmt: skip
