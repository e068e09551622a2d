"""Alerts over logs: ElastAlert2 runs the rules of alerting/elastalert/ (this component owns both the rules
and their runner). Locally it is installed into its own venv (its pinned elasticsearch 7 client does not
fit the project's) and configured from the production files with the local hosts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from fleetsight.settings import Settings
from fleetsight.venvs import PrivateVenv

ELASTALERT_VERSION = "2.19.0"  # the last release for Python 3.11 (later ones need 3.12+)
PYTZ_VERSION = "2026.6"  # imported by elastalert2, not declared by it
ELASTALERT_DIR = Path(__file__).resolve().parent / "elastalert"
PRODUCTION_CONFIG = ELASTALERT_DIR / "config.yaml"
RULES_DIR = ELASTALERT_DIR / "rules"
ELASTALERT_VENV = PrivateVenv(
    folder="elastalert",
    label="ElastAlert2",
    requirements=(f"elastalert2=={ELASTALERT_VERSION}", f"pytz=={PYTZ_VERSION}"),
    executable="elastalert",
    python_below=(3, 12),  # ElastAlert2 2.19.0 runs on 3.11
)


def venv_bin(settings: Settings, name: str) -> Path:
    return ELASTALERT_VENV.bin(settings, name)


ELASTALERT_INSTALL_STEP = ELASTALERT_VENV.install_step(
    name="elastalert",
    description=f"ElastAlert2 {ELASTALERT_VERSION} in its own venv (PyPI)",
    needed_by="elastalert, alerts from logs",
    eta="~40 s",
)


def elastalert_missing(settings: Settings) -> str | None:
    if not ELASTALERT_VENV.present(settings):
        return "not installed: ElastAlert2 (run `fleetsight setup`)"
    return None


def local_rules_dir(settings: Settings) -> Path:
    return settings.config_dir("elastalert") / "rules"


def local_config_path(settings: Settings) -> Path:
    return settings.config_dir("elastalert") / "config.yaml"


def local_config(settings: Settings) -> dict:
    config = yaml.safe_load(PRODUCTION_CONFIG.read_text())
    config.pop("ca_certs", None)  # the local OpenSearch speaks plain HTTP on loopback
    config.update(
        {
            "es_host": "127.0.0.1",
            "es_port": settings.port("opensearch"),
            "rules_folder": str(local_rules_dir(settings)),
            "use_ssl": False,
        }
    )
    return config


def local_rule(settings: Settings, rule: dict) -> dict:
    """The production rule with the local Alertmanager; nothing else changes."""
    return {**rule, "alertmanager_hosts": [settings.url("alertmanager")]}


def prepare_elastalert(settings: Settings) -> None:
    rules = local_rules_dir(settings)
    rules.mkdir(parents=True, exist_ok=True)
    for old in rules.glob("*.yaml"):
        old.unlink()
    for path in sorted(RULES_DIR.glob("*.yaml")):
        rule = yaml.safe_load(path.read_text())
        (rules / path.name).write_text(yaml.safe_dump(local_rule(settings, rule), sort_keys=False))
    config = local_config_path(settings)
    config.write_text(yaml.safe_dump(local_config(settings), sort_keys=False))
    # Its writeback indices (status, silences, errors); idempotent, single node: no replicas.
    result = subprocess.run(
        [str(venv_bin(settings, "elastalert-create-index")), "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=settings.config_dir("elastalert"),
    )
    if result.returncode != 0 and "already exists" not in (result.stdout + result.stderr):
        raise ValueError(f"elastalert-create-index failed: {(result.stdout + result.stderr)[-500:]}")


def elastalert_command(settings: Settings) -> list[str]:
    return [str(venv_bin(settings, "elastalert")), "--config", str(local_config_path(settings)), "--verbose"]


def elastalert_ready(settings: Settings) -> bool:
    """ElastAlert2 is up once it has written its status index entry for a first run, or says so."""
    log = settings.log_file("elastalert")
    try:
        text = log.read_text(errors="replace")[-20000:]
    except OSError:
        return False
    return "Starting up" in text or "Ran " in text or "Queried rule" in text
