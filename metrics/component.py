"""Prometheus in the local stack: configuration built from metrics/prometheus.yml plus the scrape
jobs that other components declare."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fleetsight.components import Component, http_ok, load_components, missing_binary
from fleetsight.settings import Settings

PRODUCTION_CONFIG = Path(__file__).with_name("prometheus.yml")
RULES_DIR = Path(__file__).resolve().parent.parent / "rules"


def config_path(settings: Settings) -> Path:
    return settings.config_dir("prometheus") / "prometheus.yml"


def local_config(settings: Settings) -> dict[str, Any]:
    production = yaml.safe_load(PRODUCTION_CONFIG.read_text())
    config: dict[str, Any] = {
        "global": {**production["global"]},
        "rule_files": [str(RULES_DIR / "*.yml")],
        "alerting": {
            "alert_relabel_configs": production["alerting"]["alert_relabel_configs"],
            "alertmanagers": [
                {"static_configs": [{"targets": [f"127.0.0.1:{settings.port('alertmanager')}"]}]}
            ],
        },
        "scrape_configs": [
            {
                "job_name": "prometheus",
                "static_configs": [{"targets": [f"127.0.0.1:{settings.port('prometheus')}"]}],
            },
        ],
    }
    config["global"]["external_labels"] = {**production["global"]["external_labels"], "replica": "local"}
    for component in load_components().values():
        config["scrape_configs"].extend(component.scrape_configs(settings))
    return config


def prepare(settings: Settings) -> None:
    path = config_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(local_config(settings), sort_keys=False))
    settings.data_dir("prometheus").mkdir(parents=True, exist_ok=True)


def command(settings: Settings) -> list[str]:
    return [
        "prometheus",
        f"--config.file={config_path(settings)}",
        f"--storage.tsdb.path={settings.data_dir('prometheus')}",
        f"--web.listen-address=127.0.0.1:{settings.port('prometheus')}",
        "--web.enable-lifecycle",
        "--web.enable-admin-api",
        # 2-hour blocks are what a Thanos sidecar uploads.
        "--storage.tsdb.min-block-duration=2h",
        "--storage.tsdb.max-block-duration=2h",
        "--storage.tsdb.retention.time=30d",
    ]


COMPONENTS = [
    Component(
        name="prometheus",
        description="Prometheus: scrapes the twin and the exporters, evaluates rules/",
        command=command,
        prepare=prepare,
        ready=lambda s: http_ok(s.url("prometheus", "/-/ready")),
        urls=lambda s: {"ui": s.url("prometheus")},
        missing=lambda s: missing_binary("prometheus"),
        depends_on=("alertmanager",),
    ),
]
