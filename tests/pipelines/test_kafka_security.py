"""Kafka on the log path, as the session's real broker runs it: TLS + SASL/SCRAM-SHA-512 on the listener
the nodes use, and the ACLs of pipelines/kafka/acls.yaml (docs/security.md T2, T3). Each refusal is
checked next to the same call succeeding with the right credential, so a refusal cannot come from a
broker that is simply down."""

from __future__ import annotations

import socket
import ssl
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from logs_helpers import LogStack

from pipelines.component import kafka_secrets
from pipelines.kafka_security import ADMIN_USER, NODE_USER, SHIPPER_USER, USERS
from pipelines.logclasses import BY_NAME
from support import wait_until

LOG_TOPIC = BY_NAME["bmc"].topic  # a raw-class topic: nothing else in the session asserts its counts
REFUSED_WITHIN_S = 3.0


def errors_of(config: dict[str, Any]) -> tuple[dict[str, Any], list[KafkaError]]:
    """config with an error callback that collects what librdkafka reports (authentication failures
    arrive there, not as exceptions)."""
    seen: list[KafkaError] = []
    return {**config, "error_cb": seen.append, "log_level": 0}, seen


def metadata_refused(config: dict[str, Any]) -> list[KafkaError]:
    """Ask for metadata with config; assert none comes back; the errors librdkafka reported (served by
    poll, for a while after the refusal)."""
    config, seen = errors_of({**config, "socket.timeout.ms": 3000})
    client = Producer(config)
    with pytest.raises(KafkaException):
        client.list_topics(timeout=REFUSED_WITHIN_S)
    wait_until(lambda: client.poll(0.2) is not None and bool(seen), timeout=10, interval=0, what="an error")
    return seen


def produce_one(config: dict[str, Any], topic: str) -> KafkaError | None:
    """Produce one record; its delivery error (None: delivered)."""
    outcome: list[KafkaError | None] = []
    producer = Producer({**config, "log_level": 0, "message.timeout.ms": 15000})
    producer.produce(
        topic, b"kafka-security-test " + uuid.uuid4().hex.encode(), on_delivery=lambda e, m: outcome.append(e)
    )
    assert producer.flush(30) == 0, "the record neither delivered nor failed in 30 s"
    return outcome[0]


def first_consumer_error(consumer: Consumer, start: Callable[[], None]) -> KafkaError:
    """Start consuming (subscribe or assign) and return the first error a poll reports."""
    start()

    def error() -> KafkaError | None:
        message = consumer.poll(0.5)
        if message is None or message.error() is None:
            return None
        return None if message.error().code() == KafkaError._PARTITION_EOF else message.error()

    try:
        return wait_until(error, timeout=30, interval=0, what="the broker to answer the consumer")
    finally:
        consumer.close()


def test_a_client_without_credentials_is_refused(log_stack: LogStack) -> None:
    ca = str(kafka_secrets(log_stack.settings).ca_file)
    # TLS to the right CA, but no SASL: the broker takes nothing before a SASL handshake.
    metadata_refused(
        {"bootstrap.servers": log_stack.bootstrap, "security.protocol": "SSL", "ssl.ca.location": ca}
    )
    # The control: the same call with the admin credential answers.
    assert AdminClient(log_stack.kafka()).list_topics(timeout=30).brokers


def test_a_wrong_password_is_refused(log_stack: LogStack) -> None:
    config = {**log_stack.kafka(NODE_USER), "sasl.password": "not-the-password"}
    seen = metadata_refused(config)
    assert any(error.code() == KafkaError._AUTHENTICATION for error in seen), seen
    # A known user's name with another user's password is no better.
    other = {
        **log_stack.kafka(NODE_USER),
        "sasl.password": kafka_secrets(log_stack.settings).password(SHIPPER_USER),
    }
    assert any(error.code() == KafkaError._AUTHENTICATION for error in metadata_refused(other))


def test_plaintext_to_the_sasl_ssl_listener_fails(log_stack: LogStack) -> None:
    metadata_refused({"bootstrap.servers": log_stack.bootstrap})  # PLAINTEXT, librdkafka's default
    # SASL without TLS: the listener speaks TLS first, so the SASL handshake never gets through.
    node = log_stack.kafka(NODE_USER)
    metadata_refused({**node, "security.protocol": "SASL_PLAINTEXT"})


def test_a_client_that_does_not_trust_the_ca_is_refused(log_stack: LogStack) -> None:
    """The broker's certificate is checked (CA and host name): a client with the system's CAs only does
    not send its password to it."""
    node = {k: v for k, v in log_stack.kafka(NODE_USER).items() if k != "ssl.ca.location"}
    seen = metadata_refused(node)
    assert any(error.code() in (KafkaError._SSL, KafkaError._TRANSPORT) for error in seen), seen


def test_the_node_credential_produces_to_log_topics_but_cannot_consume(log_stack: LogStack) -> None:
    node = log_stack.kafka(NODE_USER)
    assert produce_one(node, LOG_TOPIC) is None
    assert produce_one(node, "fleetsight-audit") is None, "the node's auth.log is the audit topic's source"
    # Consuming in the shipper's group: refused (no READ on any group).
    consumer = Consumer(
        {**node, "group.id": "fleetsight-shipper", "auto.offset.reset": "earliest", "log_level": 0}
    )
    error = first_consumer_error(consumer, lambda: consumer.subscribe([LOG_TOPIC]))
    assert error.code() in (KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED), (
        error
    )
    # Fetching a partition directly, without a group: refused too (no READ on the topic).
    consumer = Consumer({**node, "group.id": "unused", "enable.auto.commit": False, "log_level": 0})
    error = first_consumer_error(consumer, lambda: consumer.assign([TopicPartition(LOG_TOPIC, 0, 0)]))
    # (librdkafka asks for a group coordinator even here, which is refused first)
    assert error.code() in (KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED), (
        error
    )


def test_the_node_credential_cannot_create_topics_or_write_elsewhere(log_stack: LogStack) -> None:
    node = log_stack.kafka(NODE_USER)
    topic = f"not-a-log-topic-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(node)  # held: a future outlives no client
    future = admin.create_topics([NewTopic(topic, 1, 1)])[topic]
    with pytest.raises(KafkaException) as refused:
        future.result(30)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    error = produce_one(node, "__consumer_offsets")
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, error


def test_the_shipper_credential_consumes_but_cannot_produce(log_stack: LogStack) -> None:
    shipper = log_stack.kafka(SHIPPER_USER)
    error = produce_one(shipper, LOG_TOPIC)
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, error
    # It reads the log topics in its own group (the running shipper does, in fleetsight-shipper): here
    # through logstash-fleetsight, the production group, with no offsets committed.
    consumer = Consumer(
        {
            **shipper,
            "group.id": "logstash-fleetsight",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([LOG_TOPIC])
    try:

        def record() -> bool:
            message = consumer.poll(0.5)
            if message is not None and message.error() is not None:
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                return False
            return message is not None

        wait_until(record, timeout=60, interval=0, what="the shipper credential to read a record")
    finally:
        consumer.close()
    # ... but not in a group of its own choosing.
    consumer = Consumer({**shipper, "group.id": "someone-elses-group", "log_level": 0})
    error = first_consumer_error(consumer, lambda: consumer.subscribe([LOG_TOPIC]))
    assert error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, error


def test_the_controller_listener_takes_only_the_brokers_certificate(log_stack: LogStack) -> None:
    """The KRaft controller listener is on loopback and mutual TLS: a client with the CA but no client
    certificate does not complete the handshake."""
    port = log_stack.settings.port("kafka_controller")
    context = ssl.create_default_context(cafile=str(kafka_secrets(log_stack.settings).ca_file))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        pytest.raises((ssl.SSLError, ConnectionError, OSError)),
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        # TLS 1.3 reports a refused client certificate on the first read, not in the handshake.
        tls.sendall(b"\x00\x00\x00\x00")
        if not tls.recv(1):
            raise ConnectionError("closed by the controller")


def test_no_password_is_in_a_log_or_an_rsyslog_configuration(log_stack: LogStack) -> None:
    """Kafka's and rsyslog's own logs (and rsyslog.conf, which reads the password from a file) never hold
    a Kafka password. The passwords live in the run folder's data/kafka-secrets/ (0600 files)."""
    material = kafka_secrets(log_stack.settings)
    passwords = {user: material.password(user) for user in USERS}
    run = log_stack.settings.run_dir
    searched = [
        *sorted((run / "logs").glob("*.log")),
        *sorted((run / "config").glob("rsyslog-*/rsyslog.conf")),
    ]
    assert {path.name for path in searched} >= {
        "kafka.log",
        "logs-node.log",
        "logs-shipper.log",
        "rsyslog.conf",
    }
    for path in searched:
        text = path.read_text(errors="replace")
        for user, password in passwords.items():
            assert password not in text, f"{user}'s password is in {path}"
    for user in USERS:
        for path in (material.password_file(user), material.rsyslog_param_file(user)):
            assert path.stat().st_mode & 0o077 == 0, f"{path} is readable by others"
    assert (material.directory.stat().st_mode & 0o077) == 0
    assert ADMIN_USER in (run / "config" / "kafka" / "server.properties").read_text()
    assert (run / "config" / "kafka" / "server.properties").stat().st_mode & 0o077 == 0
