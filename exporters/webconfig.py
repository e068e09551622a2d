"""The exporters' web configuration, in exporter-toolkit's file format (what node_exporter and
dcgm-exporter read with ``--web.config.file``): TLS for the endpoint, and basic auth with bcrypt hashes.

    tls_server_config:
      cert_file: /etc/fleetsight/tls/node.crt
      key_file: /etc/fleetsight/tls/node.key
      client_ca_file: /etc/fleetsight/tls/ca.crt     # optional: with client_auth_type, scrapers need a cert
      client_auth_type: RequireAndVerifyClientCert    # or NoClientCert (default)
    basic_auth_users:
      prometheus: $2y$10$...                          # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':')

``promtool check web-config FILE`` checks the same file. A mistake (unknown key, missing file, a
password instead of a hash) stops the exporter at start with the file and the key named.
"""

from __future__ import annotations

import base64
import binascii
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

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
    context.minimum_version = TLS_VERSIONS.get(
        str(section.get("min_version", "TLS12")), ssl.TLSVersion.TLSv1_2
    )
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
