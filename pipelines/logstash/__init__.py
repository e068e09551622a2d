"""Names shared by the Logstash pipeline (pipeline/fleetsight-logs.conf), docker-compose.yml and the
log pipeline's producers and ingest pipelines. Tests check that the .conf and compose use these."""

# Kafka topic that rsyslog on every node writes raw log lines to.
KAFKA_TOPIC = "fleetsight-logs"
# Logstash's consumer group: its committed offsets let a restarted Logstash resume where it stopped.
KAFKA_CONSUMER_GROUP = "logstash-fleetsight"
# Elasticsearch ingest pipeline that parses the lines (the parsing lives there, not in Logstash).
ES_INGEST_PIPELINE = "fleetsight-logs"
# Daily indices; Logstash's sprintf date syntax.
ES_INDEX = "fleetsight-logs-%{+YYYY.MM.dd}"
