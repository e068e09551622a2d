"""Secrets kept one to a file (a Kubernetes Secret's mount, a root-only file on a node, the file
Alertmanager's ``credentials_file`` names): read, stripped, and refused with the file's name when they
cannot be used. No FastAPI here (fleetsight.auth has it): the node agent and the checks import this."""

from __future__ import annotations

from pathlib import Path


class SecretFileError(ValueError):
    """A secret file that cannot be read, or that holds nothing."""


def read_secret_file(path: str | Path, source: str) -> str:
    """The file's text without surrounding whitespace. ``source`` says where the path came from (a flag
    such as ``--events-token-file`` or an environment variable) and starts each error message."""
    try:
        secret = Path(path).read_text().strip()
    except OSError as exc:
        raise SecretFileError(f"{source} {path}: cannot read: {exc.strerror}") from None
    if not secret:
        raise SecretFileError(f"{source} {path}: empty")
    return secret
