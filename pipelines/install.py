"""``fleetsight setup`` steps of the log path: Debian's rsyslog with its Kafka and Elasticsearch modules,
and Kafka and OpenSearch, both fetched from Maven Central with Maven (:mod:`pipelines.kafka_install`,
:mod:`pipelines.opensearch_install`, what they share in :mod:`pipelines.maven_install`).
"""

from __future__ import annotations

from fleetsight.setup import InstallStep, apt_step

from .kafka_install import KAFKA_VERSION, install_kafka, kafka_present
from .opensearch_install import (
    OPENSEARCH_VERSION,
    SECURITY_PLUGIN_VERSION,
    install_opensearch,
    install_opensearch_security,
    opensearch_present,
    opensearch_secured_present,
)

INSTALL_STEPS = [
    apt_step(
        "rsyslog",
        "Debian's rsyslog with its Kafka (omkafka, imkafka) and Elasticsearch (omelasticsearch) modules",
        "logs-node, logs-shipper",
        {"rsyslog": "rsyslogd", "rsyslog-kafka": None, "rsyslog-elasticsearch": None},
    ),
    InstallStep(
        name="kafka",
        description=f"Kafka {KAFKA_VERSION} (KRaft) jars from Maven Central",
        needed_by="kafka, the log pipeline",
        check=kafka_present,
        install=install_kafka,
        eta="~20 s (~6 s with a warm ~/.m2)",
    ),
    InstallStep(
        name="opensearch",
        description=f"OpenSearch {OPENSEARCH_VERSION}, ingest-common and script modules, from Maven Central",
        needed_by="opensearch, ingest pipelines, log alerting",
        check=opensearch_present,
        install=install_opensearch,
        eta="~20 s (~5 s with a warm ~/.m2)",
    ),
    InstallStep(
        name="opensearch-security",
        description=f"OpenSearch with its security plugin {SECURITY_PLUGIN_VERSION} from Maven Central "
        "(a second install beside the local one, for the security tests)",
        needed_by="tests/pipelines/test_opensearch_security.py (the role model enforced by a real server)",
        check=opensearch_secured_present,
        install=install_opensearch_security,
        eta="~10 s (a 44 MB zip; ~4 s with a warm ~/.m2)",
    ),
]
