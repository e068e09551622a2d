"""The configuration files production uses are valid for the real tools, and so are the local ones
the runner derives from them."""

from __future__ import annotations

import subprocess
from pathlib import Path

from alerting.component import prepare as prepare_alertmanager
from fleetsight.settings import REPO_ROOT, Settings
from metrics.component import config_path, local_config
from metrics.component import prepare as prepare_prometheus


def check(command: list[str]) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def test_production_prometheus_config_is_valid() -> None:
    check(["promtool", "check", "config", str(REPO_ROOT / "metrics" / "prometheus.yml")])


def test_production_alertmanager_config_is_valid() -> None:
    check(["amtool", "check-config", str(REPO_ROOT / "alerting" / "alertmanager.yml")])


def test_local_configs_are_valid_and_keep_production_routing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FLEETSIGHT_RUN_DIR", str(tmp_path))
    settings = Settings()
    prepare_prometheus(settings)
    prepare_alertmanager(settings)
    check(["promtool", "check", "config", str(config_path(settings))])
    check(["amtool", "check-config", str(settings.config_dir("alertmanager") / "alertmanager.yml")])

    config = local_config(settings)
    assert config["global"]["external_labels"]["replica"] == "A"
    targets = config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert targets == [
        f"127.0.0.1:{settings.port('alertmanager')}",
        f"127.0.0.1:{settings.port('alertmanager_b')}",
    ]
    secret = settings.config_dir("alertmanager") / "slack_webhook_url"
    assert secret.read_text() == settings.url("slack_sink", "/services/local/webhook")
    assert secret.stat().st_mode & 0o077 == 0  # the webhook is a secret
