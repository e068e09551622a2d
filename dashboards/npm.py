"""TypeScript and Grafana's dashboard types from npm, cached for `fleetsight dashboards verify`.

Kept apart from the checks themselves so that declaring the install step (component.py) imports
nothing heavy.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from fleetsight.settings import Settings
from fleetsight.setup import InstallError, run_logged

TSC_VERSION = "5.9.3"
SCHEMA_VERSION = "12.1.1"  # the Grafana image docker-compose.yml runs


def npm_dir(settings: Settings) -> Path:
    return settings.cache_dir / "npm-grafana-schema"


def tsc_path(settings: Settings) -> Path:
    return npm_dir(settings) / "node_modules" / ".bin" / "tsc"


def npm_installed(settings: Settings) -> bool:
    schema = npm_dir(settings) / "node_modules" / "@grafana" / "schema"
    return tsc_path(settings).exists() and schema.is_dir()


def install_npm(settings: Settings, log: Path) -> None:
    if shutil.which("npm") is None:
        raise InstallError("npm is not installed (apt-get install npm)")
    folder = npm_dir(settings)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "package.json").write_text('{"name": "fleetsight-grafana-schema", "private": true}\n')
    run_logged(
        ["npm", "install", "--no-audit", "--no-fund", f"typescript@{TSC_VERSION}",
         f"@grafana/schema@{SCHEMA_VERSION}"],
        log,
        cwd=folder,
    )  # fmt: skip
