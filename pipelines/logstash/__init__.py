"""Names shared by the Logstash pipeline (pipeline/fleetsight-logs.conf), docker-compose.yml and the
log pipeline's producers and ingest pipelines. Tests check that the .conf and compose use these."""

from ..logclasses import LOG_CLASSES

# Kafka topics that rsyslog on every node writes to: one per log class (pipelines/kafka/topics.yaml).
KAFKA_TOPICS = tuple(log_class.topic for log_class in LOG_CLASSES)
# Logstash's consumer group: its committed offsets let a restarted Logstash resume where it stopped.
KAFKA_CONSUMER_GROUP = "logstash-fleetsight"
# Each topic's records go through the ingest pipeline of the same name (installed by `logs apply`).
ES_INGEST_PIPELINE = "%{[@metadata][kafka][topic]}"
# The index Logstash names; the ingest pipeline moves each document to <topic>-<the line's day>.
ES_INDEX = "%{[@metadata][kafka][topic]}"
# The document id: the line's origin, set on the node (event.id), else the Kafka position.
ES_DOCUMENT_ID = "%{[@metadata][doc_id]}"
# Topics of lines parsed on the node (ECS JSON): a second input, indexed with no ingest pipeline.
EDGE_TOPICS = tuple(
    f"fleetsight-edge-{name}" for name in ("kernel", "fabricmanager", "application", "bmc", "audit")
)
