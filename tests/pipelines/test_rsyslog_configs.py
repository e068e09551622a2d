"""The rsyslog configurations (node side and shipper, production and local) pass rsyslogd's own
validation, and carry what the loss guarantees rest on."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from fleetsight.components import load_components
from pipelines import logstash
from pipelines.catalogue import CATALOGUES
from pipelines.kafka_security import NODE_USER, SHIPPER_USER, RsyslogAuth
from pipelines.logclasses import BY_NAME, LOG_CLASSES
from pipelines.rsyslog_conf import (
    KAFKA_CLOSE_TIMEOUT_MS,
    NUDGE_TOPIC,
    NodeOptions,
    ShipperOptions,
    node_config,
    shipper_config,
)
from support import FLEETSIGHT, REPO_ROOT


def credential(tmp_path: Path, user: str) -> RsyslogAuth:
    """A credential's files as an operator installs them (the values do not matter to -N1)."""
    param = tmp_path / f"{user}.rsyslog-param"
    param.write_text("sasl.password=not-a-real-one")
    param.chmod(0o600)
    (tmp_path / "ca.pem").write_text("")
    return RsyslogAuth(user, param, tmp_path / "ca.pem")


def assert_sasl_ssl(config: str, user: str, inputs: int) -> None:
    """Every Kafka action/input speaks SASL_SSL + SCRAM as user; the password is read from its file."""
    assert config.count('"security.protocol=SASL_SSL"') == inputs
    assert config.count('"sasl.mechanism=SCRAM-SHA-512"') == inputs
    assert config.count(f'"sasl.username={user}"') == inputs
    assert config.count(f"`cat {'/'}") == inputs and "sasl.password=" not in config


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
        kafka_auth=credential(tmp_path, NODE_USER),
    )
    config = node_config(options)
    validate(config, tmp_path)
    assert_sasl_ssl(config, NODE_USER, len(LOG_CLASSES))
    for log_class in LOG_CLASSES:
        # Catalogued classes are parsed on the node and go to their edge topic as ECS JSON.
        topic = log_class.edge_topic if log_class.name in CATALOGUES else log_class.topic
        assert f'set $.kafka_topic = "{topic}"' in config
    # Idle actions are nudged (immark), so that omkafka re-sends what it holds as failed.
    assert 'module(load="immark"' in config and f'set $.kafka_topic = "{NUDGE_TOPIC}"' in config
    assert config.count('action.writeAllMarkMessages="off"') == len(LOG_CLASSES)
    assert "call edge_parse_kernel" in config and 'module(load="mmnormalize")' in config
    # What nothing-lost rests on: a disk-assisted queue saved on shutdown, retried forever.
    assert config.count('queue.saveOnShutdown="on"') == len(LOG_CLASSES)
    assert config.count('action.resumeRetryCount="-1"') == len(LOG_CLASSES)
    assert 'addMetadata="on"' in config


def test_shipper_config_is_valid(tmp_path: Path) -> None:
    options = ShipperOptions(
        brokers=["kafka:9092"],
        es_host="es",
        es_port=9200,
        work_dir=tmp_path,
        error_file=tmp_path / "e",
        kafka_auth=credential(tmp_path, SHIPPER_USER),
    )
    config = shipper_config(options)
    validate(config, tmp_path)
    assert_sasl_ssl(config, SHIPPER_USER, len(LOG_CLASSES) + len(CATALOGUES))
    for log_class in LOG_CLASSES:
        assert f'pipelineName="{log_class.pipeline_id}"' in config
    assert 'dynbulkid="on" bulkid="fleetsight_doc_id"' in config
    # Edge topics: bulk-indexed with no ingest pipeline, id = the line's second and origin, daily index
    # by the line's day.
    for name in CATALOGUES:
        edge = config[config.index(f'action(type="omelasticsearch" name="es_edge_{name}"') :]
        edge = edge[: edge.index("}")]
        assert "pipelineName" not in edge and 'bulkid="fleetsight_edge_doc_id"' in edge
        assert f'topic="{BY_NAME[name].edge_topic}"' in config


def test_logstash_reads_the_edge_topics_without_a_pipeline() -> None:
    conf = (REPO_ROOT / "pipelines" / "logstash" / "pipeline" / "fleetsight-logs.conf").read_text()
    assert tuple(BY_NAME[name].edge_topic for name in CATALOGUES) == logstash.EDGE_TOPICS
    assert f"topics => {json.dumps(list(logstash.EDGE_TOPICS))}" in conf
    edge_output = conf[conf.index("} else {", conf.index("output {")) :]
    assert "pipeline =>" not in edge_output and "document_id =>" in edge_output


def test_the_node_rsyslog_is_given_time_to_stop_cleanly() -> None:
    """The supervisor waits past omkafka's closeTimeout before it SIGKILLs the node rsyslog: a kill
    while librdkafka drains (Kafka down) could lose lines imfile already marked as read."""
    node = load_components()["logs-node"]
    assert node.stop_timeout_s >= len(LOG_CLASSES) * KAFKA_CLOSE_TIMEOUT_MS / 1000 + 5


def test_production_node_config_is_secured_and_refuses_to_load_without_its_credential(tmp_path: Path) -> None:
    """What `logs rsyslog-config` prints for a node (and the Debian package ships): SASL_SSL as the node
    user, credentials from /etc/fleetsight/kafka; rsyslogd refuses it while the password file is missing
    (no silent fallback to an unauthenticated connection), naming the file."""
    printed = subprocess.run(
        [*FLEETSIGHT, "logs", "rsyslog-config", "--broker", "kafka:19092", "--work-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert_sasl_ssl(printed, NODE_USER, len(LOG_CLASSES))
    assert "/etc/fleetsight/kafka/fleetsight-node.rsyslog-param" in printed
    assert '"ssl.ca.location=/etc/fleetsight/kafka/ca.pem"' in printed
    path = tmp_path / "rsyslog.conf"
    path.write_text(printed)
    result = subprocess.run(["rsyslogd", "-N1", "-f", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "fleetsight-node.rsyslog-param" in result.stderr + result.stdout
