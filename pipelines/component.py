"""The log path in the local stack: Kafka, OpenSearch, the node-side rsyslog reading the twin's logs,
and the rsyslog shipper (Kafka -> ingest pipelines -> OpenSearch, the local stand-in for Logstash). The
log alerts over OpenSearch (ElastAlert2) are alerting/'s."""

from __future__ import annotations

import base64
import shutil
import uuid
from pathlib import Path

from fleetsight.components import Component, http_ok, missing_binary
from fleetsight.settings import Settings

from . import install, kafka_install, opensearch_install
from . import kafka_security as security
from .logclasses import LOG_CLASSES
from .rsyslog_conf import KAFKA_CLOSE_TIMEOUT_MS, NodeOptions, ShipperOptions, node_config, shipper_config

# A stopping node rsyslogd may wait omkafka's closeTimeout for librdkafka once per class's action (Kafka
# down: each holds at least a nudge), then saves its disk queues and imfile positions: a SIGKILL before
# that can lose lines imfile already marked read.
NODE_RSYSLOG_STOP_TIMEOUT_S = len(LOG_CLASSES) * KAFKA_CLOSE_TIMEOUT_MS / 1000 + 10.0


# -- Kafka ------------------------------------------------------------------------------------------


def kafka_bootstrap(settings: Settings) -> str:
    return f"127.0.0.1:{settings.port('kafka')}"


def kafka_properties(settings: Settings) -> Path:
    return settings.config_dir("kafka") / "server.properties"


def kafka_secrets(settings: Settings) -> security.KafkaSecrets:
    """The local stack's CA, broker certificate and SCRAM passwords (made by :func:`prepare_kafka`)."""
    return security.KafkaSecrets(settings.data_dir("kafka-secrets"))


def kafka_client(settings: Settings, user: str = security.ADMIN_USER) -> dict[str, str]:
    """confluent-kafka settings to reach the local stack's broker as user (SASL_SSL, SCRAM)."""
    auth = kafka_secrets(settings).client(user)
    return {"bootstrap.servers": kafka_bootstrap(settings), **auth.librdkafka()}


def prepare_kafka(settings: Settings) -> None:
    """Certificates and SCRAM passwords (once per run folder), server.properties (SASL_SSL for clients,
    mutual TLS for the controller, both on loopback; ACLs enforced), and the storage formatted once with
    the SCRAM users (KRaft needs a cluster id in meta.properties)."""
    data = settings.data_dir("kafka")
    material = kafka_secrets(settings)
    if not material.complete():
        shutil.rmtree(data, ignore_errors=True)  # formatted with passwords that are gone
    material = security.ensure_secrets(material.directory)
    data.mkdir(parents=True, exist_ok=True)
    properties = kafka_properties(settings)
    properties.parent.mkdir(parents=True, exist_ok=True)
    broker = f"127.0.0.1:{settings.port('kafka')}"
    text = security.broker_properties(
        material,
        listener=broker,
        controller=f"127.0.0.1:{settings.port('kafka_controller')}",
        advertised=broker,
        node_id=1,
    )
    common = kafka_install.kafka_server_properties(node_id=1, broker_port=0, controller_port=0, log_dir=data)
    shared = [line for line in common.splitlines() if line.split("=")[0] in kafka_install.KAFKA_COMMON_KEYS]
    # It holds the admin password (inter-broker SCRAM): owner only.
    security.write_private(properties, text + "\n".join(shared) + "\nauto.create.topics.enable=false\n")
    if not (data / "meta.properties").is_file():
        # KRaft: a cluster id (16 random bytes, URL-safe base64) written into the storage once; never
        # one that starts with "-", which the tool's command line would take for an option (as Kafka's
        # own Uuid.randomUuid avoids).
        cluster_id = "-"
        while cluster_id.startswith("-"):
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        java = kafka_install.kafka_java_command(settings, "kafka.tools.StorageTool", heap="128m")
        security.format_with_scram(java, ["format", "-t", cluster_id, "-c", str(properties)], material)


def kafka_ready(settings: Settings) -> bool:
    from confluent_kafka.admin import AdminClient

    try:
        admin = AdminClient({**kafka_client(settings), "socket.timeout.ms": 2000, "log_level": 0})
        return len(admin.list_topics(timeout=2).brokers) >= 1
    except Exception:  # the client raises KafkaException until the broker answers
        return False


# -- OpenSearch -------------------------------------------------------------------------------------


def opensearch_dir(settings: Settings) -> Path:
    return settings.data_dir("opensearch")


def prepare_opensearch(settings: Settings) -> None:
    opensearch_install.prepare_opensearch_instance(
        settings,
        opensearch_dir(settings),
        http_port=settings.port("opensearch"),
        transport_port=settings.port("opensearch_transport"),
    )


def opensearch_env(settings: Settings) -> dict[str, str]:
    instance = opensearch_dir(settings)
    return {
        "OPENSEARCH_PATH_CONF": str(instance / "config"),
        "OPENSEARCH_JAVA_HOME": str(opensearch_install.java_home()),
        "OPENSEARCH_TMPDIR": str(instance / "tmp"),
    }


def opensearch_missing(settings: Settings) -> str | None:
    if not opensearch_install.opensearch_present(settings):
        return "not installed: OpenSearch (run `fleetsight setup`)"
    return None


# -- rsyslog: node side and shipper ------------------------------------------------------------------


def rsyslog_dir(settings: Settings, role: str) -> Path:
    return settings.data_dir(f"rsyslog-{role}")


def twin_nodes_root(settings: Settings) -> Path:
    return settings.data_dir("twin") / "nodes"


# The local stack ships the jobs' logs raw, through their ingest pipeline, although they are catalogued:
# so that both paths run in every test of the stack (the loss test counts them apart); the equivalence
# test shows that the node's parser makes the same documents. A production node parses every class.
LOCAL_RAW_CLASSES = ("application",)


def local_node_options(settings: Settings) -> NodeOptions:
    """The local node rsyslog's options: one rsyslogd reading every twin node's files."""
    work = rsyslog_dir(settings, "node")
    return NodeOptions(
        brokers=[kafka_bootstrap(settings)],
        work_dir=work,
        cluster=settings.cluster,
        files_root=str(twin_nodes_root(settings)),
        node_from_path=True,
        stats_file=work / "impstats.json",
        kafka_auth=kafka_secrets(settings).rsyslog_auth(security.NODE_USER),
        raw_classes=LOCAL_RAW_CLASSES,
    )


def prepare_node(settings: Settings) -> None:
    options = local_node_options(settings)
    options.work_dir.mkdir(parents=True, exist_ok=True)
    twin_nodes_root(settings).mkdir(parents=True, exist_ok=True)
    config = settings.config_dir("rsyslog-node") / "rsyslog.conf"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(node_config(options))


def prepare_shipper(settings: Settings) -> None:
    """Topics, pipelines, templates first (Kafka and OpenSearch are ready), then the shipper's config."""
    from .apply import apply_all

    apply_all(kafka_bootstrap(settings), settings.url("opensearch"), kafka_client(settings))
    work = rsyslog_dir(settings, "shipper")
    work.mkdir(parents=True, exist_ok=True)
    options = ShipperOptions(
        brokers=[kafka_bootstrap(settings)],
        es_host="127.0.0.1",
        es_port=settings.port("opensearch"),
        work_dir=work,
        error_file=work / "rejected.jsonl",
        stats_file=work / "impstats.json",
        kafka_auth=kafka_secrets(settings).rsyslog_auth(security.SHIPPER_USER),
    )
    config = settings.config_dir("rsyslog-shipper") / "rsyslog.conf"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(shipper_config(options))


def rsyslog_command(settings: Settings, role: str) -> list[str]:
    config = settings.config_dir(f"rsyslog-{role}") / "rsyslog.conf"
    pid_file = rsyslog_dir(settings, role) / "rsyslogd.pid"
    return ["rsyslogd", "-n", "-f", str(config), "-i", str(pid_file)]


def rsyslog_env(settings: Settings) -> dict[str, str]:
    """rsyslogd's omkafka/imkafka load librdkafka >= 2.6.1 (SCRAM against Kafka 4; see
    kafka_security.MIN_LIBRDKAFKA), the one bundled with confluent-kafka."""
    return {"LD_LIBRARY_PATH": str(security.librdkafka_dir(settings.data_dir("librdkafka")))}


def rsyslog_ready(settings: Settings, role: str) -> bool:
    """rsyslogd writes its pid file once its configuration is loaded and inputs are running."""
    pid_file = rsyslog_dir(settings, role) / "rsyslogd.pid"
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return False
    return Path(f"/proc/{pid}").exists()


def rsyslog_missing(settings: Settings) -> str | None:
    modules = Path("/usr/lib/x86_64-linux-gnu/rsyslog")
    reason = missing_binary("rsyslogd")
    if reason is None and modules.is_dir() and not (modules / "omkafka.so").is_file():
        reason = "rsyslog-kafka is not installed (run `fleetsight setup --only rsyslog`)"
    if reason is None and modules.is_dir() and not (modules / "mmnormalize.so").is_file():
        # The node parses catalogued lines with it (liblognorm; part of Debian's rsyslog package).
        reason = "rsyslog's mmnormalize module is missing (install rsyslog with liblognorm)"
    return reason


COMPONENTS = [
    Component(
        name="kafka",
        description="Kafka (KRaft): one topic per log class; SASL_SSL (SCRAM) and ACLs",
        command=lambda s: kafka_install.kafka_java_command(s, "kafka.Kafka", str(kafka_properties(s))),
        prepare=prepare_kafka,
        ready=kafka_ready,
        urls=lambda s: {"bootstrap": kafka_bootstrap(s)},
        missing=lambda s: (
            ("not installed: Kafka (run `fleetsight setup`)" if not kafka_install.kafka_present(s) else None)
            or missing_binary("openssl")  # makes the CA and the broker's certificate
        ),
        ready_timeout_s=120.0,
    ),
    Component(
        name="opensearch",
        description="OpenSearch: parsed logs, searchable (fleetsight logs search)",
        command=opensearch_install.opensearch_command,
        prepare=prepare_opensearch,
        env=opensearch_env,
        ready=lambda s: http_ok(s.url("opensearch", "/_cluster/health?wait_for_status=yellow&timeout=1s")),
        urls=lambda s: {"api": s.url("opensearch"), "search": "fleetsight logs search --help"},
        missing=opensearch_missing,
        ready_timeout_s=180.0,
    ),
    Component(
        name="logs-shipper",
        description="rsyslog imkafka -> OpenSearch through the ingest pipelines (Logstash's part locally)",
        command=lambda s: rsyslog_command(s, "shipper"),
        prepare=prepare_shipper,
        env=rsyslog_env,
        ready=lambda s: rsyslog_ready(s, "shipper"),
        urls=lambda s: {"rejected": str(rsyslog_dir(s, "shipper") / "rejected.jsonl")},
        missing=rsyslog_missing,
        depends_on=("kafka", "opensearch"),
    ),
    Component(
        name="logs-node",
        description="rsyslog on the nodes: the twin's kernel and job logs -> Kafka",
        command=lambda s: rsyslog_command(s, "node"),
        prepare=prepare_node,
        env=rsyslog_env,
        ready=lambda s: rsyslog_ready(s, "node"),
        urls=lambda s: {"reads": str(twin_nodes_root(s))},
        missing=rsyslog_missing,
        depends_on=("kafka", "logs-shipper", "twin"),
        stop_timeout_s=NODE_RSYSLOG_STOP_TIMEOUT_S,
    ),
]


PORTS = {
    "kafka": 120,
    "kafka_controller": 121,
    "opensearch": 130,
    "opensearch_transport": 131,
}
CLI = {"logs": (".cli", "the log path: apply topics/pipelines/templates, search parsed logs")}
INSTALL_STEPS = install.INSTALL_STEPS
START_PRIORITY = 30

__all__ = ["CLI", "COMPONENTS", "INSTALL_STEPS", "PORTS", "START_PRIORITY"]
