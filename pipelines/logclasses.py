"""The log classes of the log path, each with its Kafka topic, ingest pipeline and indices.

One name per class is used everywhere: the Kafka topic, the ingest pipeline
(``pipelines/ingest/<class>.json``, installed under the topic's name), and the prefix of its daily
indices. The node-side rsyslog, the central shipper (rsyslog locally, Logstash in docker-compose),
``fleetsight logs apply`` and the tests read them here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

PIPELINES_DIR = Path(__file__).resolve().parent
INGEST_DIR = PIPELINES_DIR / "ingest"
TOPICS_FILE = PIPELINES_DIR / "kafka" / "topics.yaml"


EDGE_TOPIC_PREFIX = "fleetsight-edge-"


@dataclass(frozen=True)
class LogClass:
    name: str  # file name of its ingest pipeline: pipelines/ingest/<name>.json
    topic: str  # Kafka topic == ingest pipeline id == index prefix (without the date)
    node_files: tuple[str, ...]  # where a production node writes these lines (imfile globs)
    twin_files: tuple[str, ...]  # the same under the twin's nodes/<node>/ trees ("" = the twin has none)
    description: str

    @property
    def pipeline_id(self) -> str:
        return self.topic

    @property
    def index_pattern(self) -> str:
        return f"{self.topic}-*"

    @property
    def edge_topic(self) -> str:
        """The topic of this class's lines parsed on the node (ECS JSON): indexed with no pipeline.
        Only classes of the pattern catalogue (pipelines/catalogue.py) have one."""
        return EDGE_TOPIC_PREFIX + self.name

    def pipeline_body(self) -> dict[str, Any]:
        return json.loads((INGEST_DIR / f"{self.name}.json").read_text())


LOG_CLASSES: tuple[LogClass, ...] = (
    LogClass(
        "kernel",
        "fleetsight-logs-kernel",
        ("/var/log/kern.log",),
        ("var/log/kern.log",),
        "kernel log: NVRM Xid, SXid, Lustre, IB link events",
    ),
    LogClass(
        "fabricmanager",
        "fleetsight-logs-fabricmanager",
        ("/var/log/fabricmanager.log",),
        ("var/log/fabricmanager.log",),
        "NVIDIA Fabric Manager log: NVSwitch errors",
    ),
    LogClass(
        "application",
        "fleetsight-logs-application",
        ("/var/log/jobs/*/rank-*.log",),
        ("var/log/jobs/*/rank-*.log",),
        "jobs' per-rank logs: training progress, CUDA and NCCL errors",
    ),
    LogClass(
        "bmc",
        "fleetsight-logs-bmc",
        ("/var/log/bmc-sel.log",),
        ("var/log/bmc-sel.log",),
        "BMC System Event Log (ipmitool sel elist lines)",
    ),
    LogClass(
        "audit",
        "fleetsight-audit",
        ("/var/log/auth.log",),
        ("var/log/auth.log",),
        "audit/security: logins, sudo",
    ),
)
BY_NAME = {log_class.name: log_class for log_class in LOG_CLASSES}
OPERATIONAL_INDICES = "fleetsight-logs-*"
"""Every operational log index (all classes but audit): what searches and alert rules read."""


def topic_specs() -> dict[str, dict[str, Any]]:
    """topic -> {partitions, replication_factor, config} from kafka/topics.yaml, defaults merged."""
    document = yaml.safe_load(TOPICS_FILE.read_text())
    defaults = document["defaults"]
    specs = {}
    for topic, spec in document["topics"].items():
        specs[topic] = {
            "partitions": int(spec["partitions"]),
            "replication_factor": int(spec.get("replication_factor", defaults["replication_factor"])),
            "config": {**defaults["config"], **spec.get("config", {})},
        }
    return specs
