"""Elasticsearch security of the log path (production): the users and roles of
``security/elasticsearch.yml``, applied through the security API, and the credentials FleetSight's own
clients (``logs apply``, ``logs kibana-import``) present. docs/security.md T2, T3, T5.

Clients take their credential from the environment, never from a command line:
``FLEETSIGHT_LOGS_USERNAME``, ``FLEETSIGHT_LOGS_PASSWORD_FILE`` (a file holding the password) and
``FLEETSIGHT_LOGS_CA_FILE`` (the CA of Elasticsearch's HTTP certificate). None set: no authentication
(the local OpenSearch, on loopback).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from fleetsight.secrets import SecretFileError, read_secret_file

from .logclasses import PIPELINES_DIR

SECURITY_FILE = PIPELINES_DIR / "security" / "elasticsearch.yml"
ENV_USERNAME = "FLEETSIGHT_LOGS_USERNAME"
ENV_PASSWORD_FILE = "FLEETSIGHT_LOGS_PASSWORD_FILE"
ENV_CA_FILE = "FLEETSIGHT_LOGS_CA_FILE"


class SecurityError(ValueError):
    """A credential file is missing, or the server refused a user or role; the message says which."""


@dataclass(frozen=True)
class HttpCredential:
    username: str
    password_file: Path
    ca_file: Path | None

    def client_options(self) -> dict[str, Any]:
        """httpx options: basic auth, and the CA to verify the server with."""
        password = read_secret(self.password_file, ENV_PASSWORD_FILE)
        return {"auth": (self.username, password), "verify": self.verify()}

    def verify(self) -> str | bool:
        return str(self.ca_file) if self.ca_file else True


def read_secret(path: Path, source: str) -> str:
    """The secret in path, read as every FleetSight secret file is (:func:`read_secret_file`); source says
    what the file is for and starts the message of a file that cannot be used, raised as SecurityError,
    which the CLI reports."""
    try:
        return read_secret_file(path, source)
    except SecretFileError as exc:
        raise SecurityError(str(exc)) from None


def credential_from_env() -> HttpCredential | None:
    username = os.environ.get(ENV_USERNAME, "")
    password_file = os.environ.get(ENV_PASSWORD_FILE, "")
    ca = os.environ.get(ENV_CA_FILE, "")
    if not (username or password_file):
        return None
    if not (username and password_file):
        raise SecurityError(f"set both {ENV_USERNAME} and {ENV_PASSWORD_FILE} (or neither)")
    return HttpCredential(username, Path(password_file), Path(ca) if ca else None)


def client_options() -> dict[str, Any]:
    """httpx options for FleetSight's clients of Elasticsearch/Kibana, from the environment."""
    credential = credential_from_env()
    return credential.client_options() if credential else {}


def load(path: Path = SECURITY_FILE) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def apply_security(url: str, secrets_dir: Path, timeout_s: float = 30.0) -> list[tuple[str, str]]:
    """PUT every role and user of the file, and the built-in users' passwords, as the credential of the
    environment (the ``elastic`` superuser); (kind, name) of each object written."""
    document = load()
    written = []
    with httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s, **client_options()) as http:

        def put(method: str, path: str, body: dict[str, Any], what: str) -> None:
            try:
                response = http.request(method, path, json=body)
            except httpx.HTTPError as exc:
                raise SecurityError(f"{url} did not answer for {what}: {exc}") from exc
            if not response.is_success:
                # The body never echoes a password: Elasticsearch names the field, not its value.
                raise SecurityError(f"{what}: HTTP {response.status_code} {response.text[:300]}")

        for name, role in document["roles"].items():
            put("PUT", f"/_security/role/{name}", role, f"role {name}")
            written.append(("role", name))
        for name, user in document["users"].items():
            password = read_secret(
                secrets_dir / user["password_secret"], f"the password secret of user {name}"
            )
            body = {"password": password, "roles": user["roles"]}
            put("PUT", f"/_security/user/{name}", body, f"user {name}")
            written.append(("user", name))
        for name, secret in document.get("builtin_passwords", {}).items():
            password = read_secret(secrets_dir / secret, f"the password secret of built-in user {name}")
            put("POST", f"/_security/user/{name}/_password", {"password": password}, f"password of {name}")
            written.append(("password", name))
    return written
