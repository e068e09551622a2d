"""What the dashboards take from npm, cached by setup: TypeScript and Grafana's dashboard types for
`fleetsight dashboards verify`, and Apache ECharts (Apache-2.0) for the local dashboard viewer.

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
ECHARTS_VERSION = "6.1.0"


def npm_dir(settings: Settings) -> Path:
    return settings.cache_dir / "npm-grafana-schema"


def tsc_path(settings: Settings) -> Path:
    return npm_dir(settings) / "node_modules" / ".bin" / "tsc"


def npm_installed(settings: Settings) -> bool:
    schema = npm_dir(settings) / "node_modules" / "@grafana" / "schema"
    return tsc_path(settings).exists() and schema.is_dir()


def install_npm(settings: Settings, log: Path) -> None:
    npm_install(npm_dir(settings), [f"typescript@{TSC_VERSION}", f"@grafana/schema@{SCHEMA_VERSION}"], log)


def echarts_dir(settings: Settings) -> Path:
    return settings.cache_dir / "npm-echarts"


def echarts_file(settings: Settings) -> Path:
    """The one file the viewer serves: ECharts' own minified build (no bundler needed)."""
    return echarts_dir(settings) / "node_modules" / "echarts" / "dist" / "echarts.min.js"


def echarts_installed(settings: Settings) -> bool:
    return echarts_file(settings).is_file()


def install_echarts(settings: Settings, log: Path) -> None:
    npm_install(echarts_dir(settings), [f"echarts@{ECHARTS_VERSION}"], log)


def npm_install(folder: Path, packages: list[str], log: Path) -> None:
    """``npm install`` of exact versions into a private folder of the cache."""
    if shutil.which("npm") is None:
        raise InstallError("npm is not installed (apt-get install npm)")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "package.json").write_text(f'{{"name": "fleetsight-{folder.name}", "private": true}}\n')
    run_logged(["npm", "install", "--no-audit", "--no-fund", *packages], log, cwd=folder)
