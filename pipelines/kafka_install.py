"""Kafka for the log path (KRaft, no ZooKeeper), as ``fleetsight setup`` installs it: a set of jars (the
broker, the tools (StorageTool) and the log4j 2 binding for slf4j 1.x) copied by ``mvn
dependency:copy-dependencies`` from ``maven/kafka.pom.xml``; and what the stack runner and the tests use
to start it (classpath, java command line, KRaft properties).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from fleetsight.settings import Settings
from fleetsight.setup import InstallError, stamp_matches, write_stamp

from .maven_install import (
    MAVEN_DIR,
    STAMP_NAME,
    file_sha256,
    maven_copy_dependencies,
    replace_dir,
    require_tools,
    staging_dir,
)

# The pins: change one and the next `fleetsight setup` re-installs (the stamp no longer matches).
KAFKA_VERSION = "4.1.1"
KAFKA_SCALA_VERSION = "2.13"  # must match the kafka_<scala> artifact in maven/kafka.pom.xml
LOG4J_VERSION = "2.24.3"
KAFKA_POM = MAVEN_DIR / "kafka.pom.xml"

KAFKA_STAMP = (
    f"kafka {KAFKA_VERSION} scala {KAFKA_SCALA_VERSION} log4j {LOG4J_VERSION} pom {file_sha256(KAFKA_POM)}"
)
KAFKA_REQUIRED_JARS = (
    f"kafka_{KAFKA_SCALA_VERSION}-{KAFKA_VERSION}.jar",
    f"kafka-tools-{KAFKA_VERSION}.jar",
    f"kafka-clients-{KAFKA_VERSION}.jar",
    f"log4j-slf4j-impl-{LOG4J_VERSION}.jar",
    f"log4j-core-{LOG4J_VERSION}.jar",
)

# Console only: whoever starts Kafka sends its output to that component's log file.
KAFKA_LOG4J2 = """\
# Written by `fleetsight setup`: Kafka logs one line per event to stdout.
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{ISO8601} level=%p logger=%c msg="%m"%n
rootLogger.level = info
rootLogger.appenderRef.stdout.ref = STDOUT
logger.kafka.name = kafka
logger.kafka.level = info
logger.apache.name = org.apache.kafka
logger.apache.level = info
logger.state.name = state.change.logger
logger.state.level = warn
"""


def kafka_home(settings: Settings) -> Path:
    """Kafka's install folder: ``libs/`` (jars) and ``config/log4j2.properties``."""
    return settings.cache_dir / "kafka"


def kafka_classpath(settings: Settings) -> str:
    """The Java classpath of every Kafka jar (a wildcard: java expands it)."""
    return str(kafka_home(settings) / "libs" / "*")


def kafka_java_command(settings: Settings, main_class: str, *args: str, heap: str = "512m") -> list[str]:
    """A java command line running one of Kafka's main classes, e.g. ``kafka.Kafka server.properties``
    or ``kafka.tools.StorageTool format -t ID -c server.properties``."""
    log4j = kafka_home(settings) / "config" / "log4j2.properties"
    return [
        "java", f"-Xmx{heap}", f"-Dlog4j2.configurationFile={log4j}", "-Djava.awt.headless=true",
        "-cp", kafka_classpath(settings), main_class, *args,
    ]  # fmt: skip


def kafka_server_properties(*, node_id: int, broker_port: int, controller_port: int, log_dir: Path) -> str:
    """server.properties of a single-node KRaft cluster (broker and controller in one process) on
    loopback, with replication factors of 1 for the internal topics."""
    return "\n".join(
        [
            "process.roles=broker,controller",
            f"node.id={node_id}",
            f"controller.quorum.voters={node_id}@127.0.0.1:{controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{broker_port},CONTROLLER://127.0.0.1:{controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{broker_port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            f"log.dirs={log_dir}",
            "num.partitions=1",
            "offsets.topic.replication.factor=1",
            "share.coordinator.state.topic.replication.factor=1",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "",
        ]
    )


KAFKA_COMMON_KEYS = (
    "log.dirs",
    "num.partitions",
    "offsets.topic.replication.factor",
    "share.coordinator.state.topic.replication.factor",
    "transaction.state.log.replication.factor",
    "transaction.state.log.min.isr",
    "group.initial.rebalance.delay.ms",
)
"""The lines of :func:`kafka_server_properties` that do not depend on listeners (the secured broker,
pipelines/kafka_security.py, takes these and brings its own listeners)."""


def kafka_present(settings: Settings) -> bool:
    libs = kafka_home(settings) / "libs"
    return (
        shutil.which("java") is not None
        and stamp_matches(kafka_home(settings) / STAMP_NAME, KAFKA_STAMP)
        and all((libs / jar).is_file() for jar in KAFKA_REQUIRED_JARS)
        and (kafka_home(settings) / "config" / "log4j2.properties").is_file()
    )


def install_kafka(settings: Settings, log: Path) -> None:
    require_tools("java", "mvn")
    staged = staging_dir(settings, "kafka")
    try:
        properties = {"kafka.version": KAFKA_VERSION, "log4j.version": LOG4J_VERSION}
        maven_copy_dependencies(KAFKA_POM, staged / "libs", properties, log)
        missing = [jar for jar in KAFKA_REQUIRED_JARS if not (staged / "libs" / jar).is_file()]
        if missing:
            raise InstallError(f"Maven finished but these jars are missing: {', '.join(missing)}")
        (staged / "config").mkdir()
        (staged / "config" / "log4j2.properties").write_text(KAFKA_LOG4J2)
        write_stamp(staged / STAMP_NAME, KAFKA_STAMP)
        replace_dir(staged, kafka_home(settings))
    finally:
        shutil.rmtree(staged, ignore_errors=True)
