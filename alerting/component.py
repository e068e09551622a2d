"""Alertmanager and the local Slack stand-in."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from fleetsight.components import Component, http_ok, missing_binary
from fleetsight.settings import Settings

PRODUCTION_CONFIG = Path(__file__).with_name("alertmanager.yml")


def slack_record_file(settings: Settings) -> Path:
    return settings.data_dir("slack-sink") / "messages.jsonl"


def prepare(settings: Settings) -> None:
    """The production routing file, with the webhook secret pointing at the local Slack stand-in."""
    config_dir = settings.config_dir("alertmanager")
    config_dir.mkdir(parents=True, exist_ok=True)
    secret = config_dir / "slack_webhook_url"
    secret.write_text(settings.url("slack_sink", "/services/local/webhook"))
    secret.chmod(0o600)
    config = yaml.safe_load(PRODUCTION_CONFIG.read_text())
    config["global"]["slack_api_url_file"] = str(secret)
    (config_dir / "alertmanager.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    settings.data_dir("alertmanager").mkdir(parents=True, exist_ok=True)


def command(settings: Settings) -> list[str]:
    return [
        "prometheus-alertmanager",
        f"--config.file={settings.config_dir('alertmanager') / 'alertmanager.yml'}",
        f"--storage.path={settings.data_dir('alertmanager')}",
        f"--web.listen-address=127.0.0.1:{settings.port('alertmanager')}",
        "--cluster.listen-address=",  # a single instance: no gossip port on 0.0.0.0
    ]


COMPONENTS = [
    Component(
        name="slack-sink",
        description="Slack stand-in: records what Alertmanager would post to Slack",
        command=lambda s: [
            sys.executable,
            "-m",
            "alerting.slack_sink",
            f"--listen=127.0.0.1:{s.port('slack_sink')}",
            f"--record={slack_record_file(s)}",
        ],
        ready=lambda s: http_ok(s.url("slack_sink", "/")),
        urls=lambda s: {"messages": s.url("slack_sink", "/")},
    ),
    Component(
        name="alertmanager",
        description="Alertmanager: routes every alert to Slack",
        command=command,
        prepare=prepare,
        ready=lambda s: http_ok(s.url("alertmanager", "/-/ready")),
        urls=lambda s: {"ui": s.url("alertmanager")},
        missing=lambda s: missing_binary("prometheus-alertmanager"),
        depends_on=("slack-sink",),
    ),
]
