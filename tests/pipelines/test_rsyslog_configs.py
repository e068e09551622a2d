"""The rsyslog configurations (node side and shipper, production and local) pass rsyslogd's own
validation, and carry what the loss guarantees rest on."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fleetsight.components import load_components
from pipelines.logclasses import LOG_CLASSES
from pipelines.rsyslog_conf import (
    KAFKA_CLOSE_TIMEOUT_MS,
    NodeOptions,
    ShipperOptions,
    node_config,
    shipper_config,
)


def validate(config: str, tmp_path: Path) -> None:
    path = tmp_path / "rsyslog.conf"
    path.write_text(config)
    result = subprocess.run(["rsyslogd", "-N1", "-f", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "error" not in (result.stdout + result.stderr).lower(), result.stdout + result.stderr


@pytest.mark.parametrize("local", [False, True], ids=["production", "local"])
def test_node_config_is_valid(tmp_path: Path, local: bool) -> None:
    options = NodeOptions(
        brokers=["kafka-1:9092", "kafka-2:9092"],
        work_dir=tmp_path,
        cluster="prod-a",
        files_root=str(tmp_path / "nodes") if local else "",
        node_from_path=local,
    )
    config = node_config(options)
    validate(config, tmp_path)
    for log_class in LOG_CLASSES:
        assert f'topic="{log_class.topic}"' in config
    # What nothing-lost rests on: a disk-assisted queue saved on shutdown, retried forever.
    assert config.count('queue.saveOnShutdown="on"') == len(LOG_CLASSES)
    assert config.count('action.resumeRetryCount="-1"') == len(LOG_CLASSES)
    assert 'addMetadata="on"' in config


def test_shipper_config_is_valid(tmp_path: Path) -> None:
    options = ShipperOptions(
        brokers=["kafka:9092"], es_host="es", es_port=9200, work_dir=tmp_path, error_file=tmp_path / "e"
    )
    config = shipper_config(options)
    validate(config, tmp_path)
    for log_class in LOG_CLASSES:
        assert f'pipelineName="{log_class.pipeline_id}"' in config
    assert 'dynbulkid="on" bulkid="fleetsight_es_id"' in config


def test_the_node_rsyslog_is_given_time_to_stop_cleanly() -> None:
    """The supervisor waits past omkafka's closeTimeout before it SIGKILLs the node rsyslog: a kill
    while librdkafka drains (Kafka down) could lose lines imfile already marked as read."""
    node = load_components()["logs-node"]
    assert node.stop_timeout_s >= KAFKA_CLOSE_TIMEOUT_MS / 1000 + 5
