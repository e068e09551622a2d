"""What every `fleetsight health ...` command module shares: the click context (``-h``) and the health
service's default URL.

A module of its own so that the command modules (health/cli.py, health/serve_cli.py,
health/kubernetes_cli.py) depend on it rather than on each other: health/cli.py assembles the group
from them without an import circle.
"""

from __future__ import annotations

from fleetsight.settings import Settings

CONTEXT = {"help_option_names": ["-h", "--help"]}


def default_url() -> str:
    return Settings().url("health")
