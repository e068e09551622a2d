"""The production layout's log-path security, checked statically (no Docker here; the local stack's Kafka
runs the same model for real in test_kafka_security.py): docker-compose.yml, Kafka's compose properties,
the ACL file, the Logstash pipeline and the Elasticsearch roles. docs/security.md T2, T3, T5."""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetsight.settings import Settings
from pipelines.es_security import SECURITY_FILE
from pipelines.kafka_install import kafka_java_command, kafka_present
from pipelines.kafka_security import (
    ACLS_FILE,
    NODE_USER,
    SHIPPER_USER,
    USERS,
    acl_rules,
    make_production_secrets,
)
from pipelines.logclasses import topic_specs
from pipelines.rsyslog_conf import NUDGE_TOPIC
from support import REPO_ROOT

COMPOSE = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
KAFKA_PROPERTIES = REPO_ROOT / "pipelines" / "kafka" / "compose" / "server.properties"
LOGSTASH_CONF = (REPO_ROOT / "pipelines" / "logstash" / "pipeline" / "fleetsight-logs.conf").read_text()
ELASTALERT_CONFIG = yaml.safe_load((REPO_ROOT / "alerting" / "elastalert" / "config.yaml").read_text())
SECURITY = yaml.safe_load(SECURITY_FILE.read_text())

LOG_INDEX = "fleetsight-logs-kernel-2026.11.25"
RAW_LOG_INDEX = "fleetsight-logs-kernel"  # where Logstash sends a raw record; its pipeline re-targets it
AUDIT_INDEX = "fleetsight-audit-2026.11.25"
ELASTALERT_INDEX = "elastalert_status"
READ = {"read", "all", "manage", "view_index_metadata", "monitor", "read_cross_cluster"}
DOCUMENT_READ = {"read", "all"}
WRITE = {"write", "index", "create", "create_doc", "delete", "all", "manage", "create_index", "delete_index"}
TOO_BROAD_CLUSTER = {"all", "manage", "manage_security", "manage_api_key", "manage_own_api_key"}


def properties(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and line[0] != "#")
    return {key.strip(): value.strip() for key, value in pairs}


def published_container_ports(service: dict[str, Any]) -> dict[int, str]:
    """container port -> host address it is published on ("" = every address)."""
    ports = {}
    for spec in service.get("ports", []):
        parts = str(spec).split(":")
        host = parts[0] if len(parts) == 3 else ""
        ports[int(parts[-1].split("/")[0])] = host
    return ports


# ---------------------------------------------------------------------------------------------- Kafka
def test_no_plaintext_kafka_listener_is_reachable_off_host() -> None:
    config = properties(KAFKA_PROPERTIES)
    protocols = dict(item.split(":") for item in config["listener.security.protocol.map"].split(","))
    listeners = {}
    for item in config["listeners"].split(","):
        name, address = item.split("://")
        listeners[name] = address
    published = published_container_ports(SERVICES["kafka"])
    assert published, "the nodes' listener is published"
    for name, address in listeners.items():
        host, port = address.rsplit(":", 1)
        if protocols[name] in ("PLAINTEXT", "SASL_PLAINTEXT") and host not in ("127.0.0.1", "localhost"):
            pytest.fail(f"listener {name} ({address}) is {protocols[name]} and not on loopback")
        if int(port) in published:
            assert protocols[name] == "SASL_SSL", f"published listener {name} must be SASL_SSL"
    # Only the SASL_SSL listeners are published; the controller is bound to loopback, mutual TLS.
    assert {int(a.rsplit(":", 1)[1]) for n, a in listeners.items() if protocols[n] == "SASL_SSL"} >= set(
        published
    )
    controller = config["controller.listener.names"]
    assert listeners[controller].startswith("127.0.0.1:") and protocols[controller] == "SSL"
    assert config[f"listener.name.{controller.lower()}.ssl.client.auth"] == "required"


def test_kafka_authenticates_with_scram_and_authorizes_with_acls_only() -> None:
    config = properties(KAFKA_PROPERTIES)
    assert config["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"  # no PLAIN, no GSSAPI
    assert config["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert config["allow.everyone.if.no.acl.found"] == "false"
    assert config["auto.create.topics.enable"] == "false"
    supers = set(config["super.users"].split(";"))
    assert supers == {"User:fleetsight-admin", "User:CN=fleetsight-kafka-broker"}
    assert NODE_USER not in config["super.users"] and SHIPPER_USER not in config["super.users"]
    # No password in the committed files: the start script adds the JAAS line from a Docker secret.
    assert "password" not in KAFKA_PROPERTIES.read_text().lower().replace("passwords", "")
    start = (KAFKA_PROPERTIES.parent / "start.sh").read_text()
    assert "/run/secrets" in start and "umask 077" in start and "@$tmp/scram.args" in start


def test_the_compose_start_script_formats_kraft_with_the_scram_users(tmp_path: Path) -> None:
    """pipelines/kafka/compose/start.sh, run for real with the image's paths pointed at this machine's
    Kafka jars and at the files `logs make-secrets` writes: Kafka's own StorageTool accepts the compose
    properties and the SCRAM users land in the KRaft bootstrap metadata; no password leaks out."""
    settings = Settings()
    if not kafka_present(settings):
        pytest.fail("Kafka is not installed here: run `fleetsight setup`")
    secrets_dir = tmp_path / "secrets"
    make_production_secrets(secrets_dir, ("kafka", "localhost"), ("elasticsearch", "localhost"))
    conf, data, home, scratch = (tmp_path / name for name in ("conf", "data", "kafka", "tmp"))
    for folder in (conf, home / "bin", scratch):
        folder.mkdir(parents=True)
    text = KAFKA_PROPERTIES.read_text().replace("log.dirs=/var/lib/kafka/data", f"log.dirs={data}")
    (conf / "server.properties").write_text(text)
    storage = shlex.join(kafka_java_command(settings, "kafka.tools.StorageTool", heap="128m"))
    (home / "bin" / "kafka-storage.sh").write_text(f'#!/bin/sh\nexec {storage} "$@"\n')
    (home / "bin" / "kafka-server-start.sh").write_text('#!/bin/sh\necho "would start Kafka with $1"\n')
    for shim in (home / "bin").iterdir():
        shim.chmod(0o755)
    environment = SERVICES["kafka"]["environment"]
    result = subprocess.run(
        ["bash", str(KAFKA_PROPERTIES.parent / "start.sh")],
        env={
            **os.environ,
            "CLUSTER_ID": environment["CLUSTER_ID"],
            "FLEETSIGHT_KAFKA_EXTERNAL_HOST": "localhost",
            "FLEETSIGHT_KAFKA_HOME": str(home),
            "FLEETSIGHT_KAFKA_SECRETS": str(secrets_dir),
            "FLEETSIGHT_KAFKA_CONF": str(conf),
            "FLEETSIGHT_KAFKA_TMP": str(scratch),
        },
        capture_output=True,
        text=True,
        timeout=180,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"would start Kafka with {scratch / 'server.properties'}" in output
    checkpoint = (data / "bootstrap.checkpoint").read_bytes()
    assert (data / "meta.properties").is_file()
    passwords = [
        (secrets_dir / f"kafka-{user.removeprefix('fleetsight-')}-password").read_text().strip()
        for user in USERS
    ]
    for user, password in zip(USERS, passwords, strict=True):
        assert user.encode() in checkpoint, f"no SCRAM credential for {user}"
        assert password.encode() not in checkpoint, "KRaft keeps salted hashes only"
        assert password not in output
    assert not (scratch / "scram.args").exists()
    runtime = scratch / "server.properties"
    assert (
        runtime.stat().st_mode & 0o077 == 0
        and (scratch / "admin-client.properties").stat().st_mode & 0o077 == 0
    )
    assert "advertised.listeners=INTERNAL://kafka:9092,EXTERNAL://localhost:19092" in runtime.read_text()


def test_the_acl_model_is_produce_only_for_nodes_and_consume_only_for_shippers() -> None:
    rows = acl_rules()
    by_user: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_user.setdefault(row["user"], []).append(row)
        assert row["name"] not in ("*", ""), f"a wildcard grant: {row}"
        assert row["operation"].upper() != "ALL", row
    assert set(by_user) == {NODE_USER, SHIPPER_USER}, "the admin is a super user, not in the file"
    node_ops = {(r["resource"], r["operation"]) for r in by_user[NODE_USER]}
    assert node_ops == {("topic", "WRITE"), ("topic", "DESCRIBE")}, "nodes: produce only, no group, no read"
    shipper_ops = {(r["resource"], r["operation"]) for r in by_user[SHIPPER_USER]}
    assert shipper_ops == {("topic", "READ"), ("topic", "DESCRIBE"), ("group", "READ"), ("group", "DESCRIBE")}

    def granted(user: str, operation: str, topic: str) -> bool:
        return any(
            r["user"] == user
            and r["resource"] == "topic"
            and r["operation"] == operation
            and (topic == r["name"] if r["pattern"] == "literal" else topic.startswith(r["name"]))
            for r in rows
        )

    for topic in topic_specs():  # every log topic, the audit topic included (ACLS_FILE says why)
        assert granted(NODE_USER, "WRITE", topic), topic
        # The nudge topic has no reader (rsyslog_conf.NUDGE_TOPIC).
        assert granted(SHIPPER_USER, "READ", topic) == (topic != NUDGE_TOPIC), topic
    assert not granted(NODE_USER, "WRITE", "__consumer_offsets")
    assert "audit" in ACLS_FILE.read_text()


def test_logstash_and_logs_apply_reach_kafka_over_sasl_ssl_with_their_own_users() -> None:
    inputs = re.findall(r"kafka \{(.*?)\n  \}", LOGSTASH_CONF, re.DOTALL)
    assert len(inputs) == 2
    for block in inputs:
        assert 'security_protocol => "SASL_SSL"' in block and 'sasl_mechanism => "SCRAM-SHA-512"' in block
        assert f"username='{SHIPPER_USER}'" in block and "password='${KAFKA_SHIPPER_PASSWORD}'" in block
        assert 'ssl_truststore_location => "/run/secrets/kafka-ca.pem"' in block
    init = SERVICES["logs-init"]["environment"]
    assert init["FLEETSIGHT_KAFKA_USERNAME"] == "fleetsight-admin"
    assert init["FLEETSIGHT_KAFKA_PASSWORD_FILE"].startswith("/run/secrets/")


# ------------------------------------------------------------------------------------- Elasticsearch
def test_elasticsearch_has_security_and_tls_on_and_stays_on_loopback() -> None:
    environment = SERVICES["elasticsearch"]["environment"]
    for key in (
        "xpack.security.enabled",
        "xpack.security.http.ssl.enabled",
        "xpack.security.transport.ssl.enabled",
    ):
        assert environment[key] == "true", key
    assert environment["ELASTIC_PASSWORD_FILE"].startswith("/run/secrets/")
    assert published_container_ports(SERVICES["elasticsearch"]) == {9200: "127.0.0.1"}
    # Every client speaks https, with a login.
    assert 'hosts => ["https://elasticsearch:9200"]' in LOGSTASH_CONF
    assert LOGSTASH_CONF.count('user => "fleetsight-logstash"') == 2
    assert "--url=https://elasticsearch:9200" in SERVICES["logs-init"]["command"]
    assert "https://" in SERVICES["kibana"]["environment"]["ELASTICSEARCH_HOSTS"]
    assert ELASTALERT_CONFIG["use_ssl"] is True and ELASTALERT_CONFIG["verify_certs"] is True


def index_privileges(role: dict[str, Any], index: str) -> set[str]:
    return {
        privilege
        for entry in role.get("indices", [])
        if any(fnmatch.fnmatchcase(index, pattern) for pattern in entry["names"])
        for privilege in entry["privileges"]
    }


def test_every_role_is_least_privilege() -> None:
    roles = SECURITY["roles"]
    for name, role in roles.items():
        assert not set(role.get("cluster", [])) & TOO_BROAD_CLUSTER, f"{name}: cluster privileges too broad"
        for entry in role.get("indices", []):
            assert "*" not in entry["names"], f"{name} names every index"
            assert "all" not in entry["privileges"], f"{name} has `all` on {entry['names']}"
        # Nobody both reads and writes the log indices.
        privileges = index_privileges(role, LOG_INDEX)
        assert not (privileges & DOCUMENT_READ and privileges & WRITE), f"{name} reads and writes the logs"

    writer = roles["fleetsight_logstash_writer"]
    for index in (LOG_INDEX, RAW_LOG_INDEX, AUDIT_INDEX):
        assert "index" in index_privileges(writer, index), f"Logstash cannot write {index}"
        assert not index_privileges(writer, index) & READ, f"Logstash can read {index}"
    assert not index_privileges(writer, ELASTALERT_INDEX)

    elastalert = roles["fleetsight_elastalert"]
    assert "read" in index_privileges(elastalert, LOG_INDEX)
    assert not index_privileges(elastalert, LOG_INDEX) & WRITE, "ElastAlert can write the logs"
    assert not index_privileges(elastalert, AUDIT_INDEX), "ElastAlert reads the audit indices"
    assert index_privileges(elastalert, ELASTALERT_INDEX) & WRITE, "its writeback index"

    admin = roles["fleetsight_logs_admin"]
    assert not admin["indices"], "`logs apply` touches no documents"
    assert {"manage_pipeline", "manage_index_templates"} <= set(admin["cluster"])

    reader = roles["fleetsight_logs_reader"]
    assert index_privileges(reader, LOG_INDEX) <= {"read", "view_index_metadata"}
    assert not index_privileges(reader, AUDIT_INDEX), "researchers do not read the audit trail"
    assert index_privileges(roles["fleetsight_audit_reader"], AUDIT_INDEX) == {"read", "view_index_metadata"}


def test_each_client_logs_in_as_its_own_user_whose_password_is_a_secret() -> None:
    users = SECURITY["users"]
    roles = SECURITY["roles"]
    for name, user in users.items():
        assert set(user["roles"]) <= set(roles), f"{name} has an unknown role"
        assert user["password_secret"] in COMPOSE["secrets"], f"{name}'s password is not a compose secret"
    given = set(SERVICES["logs-security-init"]["secrets"])
    wanted = {u["password_secret"] for u in users.values()} | set(SECURITY["builtin_passwords"].values())
    assert wanted <= given
    assert users["fleetsight-logstash"]["roles"] == ["fleetsight_logstash_writer"]
    assert SERVICES["elastalert"]["environment"]["ES_USERNAME"] == "fleetsight-elastalert"
    assert users["fleetsight-elastalert"]["roles"] == ["fleetsight_elastalert"]
    assert SERVICES["logs-init"]["environment"]["FLEETSIGHT_LOGS_USERNAME"] == "fleetsight-logs-admin"
    assert users["fleetsight-logs-admin"]["roles"] == ["fleetsight_logs_admin"]
    assert SERVICES["kibana"]["environment"]["ELASTICSEARCH_USERNAME"] == "kibana_system"
    assert SERVICES["kibana-init"]["environment"]["FLEETSIGHT_LOGS_USERNAME"] == "fleetsight-kibana-import"


def test_no_password_is_written_into_compose_or_the_pipeline() -> None:
    for name, service in SERVICES.items():
        environment = service.get("environment") or {}
        items = (
            environment.items()
            if isinstance(environment, dict)
            else (e.partition("=")[::2] for e in environment)
        )
        for key, value in items:
            if re.search(r"PASSWORD|SECRET|TOKEN|KEY$", key) and value:
                assert key.endswith("_FILE") or str(value).startswith("/run/secrets/"), (
                    f"{name}: {key} in clear"
                )
    assert re.search(r"password\s*=>\s*\"[^$]", LOGSTASH_CONF) is None


def test_grafana_reads_the_logs_as_the_reader_over_tls_with_its_password_a_secret() -> None:
    """docker-compose.yml's Grafana: the logs datasource it provisions logs in as fleetsight-reader, its
    password and the CA read from Docker secrets given to Grafana (the project's client logs in to the
    secured OpenSearch with this file's credentials in tests/pipelines/test_opensearch_security.py)."""
    grafana = SERVICES["grafana"]
    mounted = {}
    for spec in grafana["volumes"]:
        source, _, target = spec.partition(":")
        mounted[target.removesuffix(":ro")] = REPO_ROOT / source
    path = mounted["/etc/grafana/provisioning/datasources/logs.yml"]
    assert path == REPO_ROOT / "dashboards" / "compose" / "datasources" / "logs.yml"
    (logs,) = yaml.safe_load(path.read_text())["datasources"]
    reader = SECURITY["users"][logs["basicAuthUser"]]
    assert logs["basicAuth"] is True and logs["basicAuthUser"] == "fleetsight-reader"
    assert reader["roles"] == ["fleetsight_logs_reader"]
    assert grafana["environment"]["FLEETSIGHT_LOGS_URL"].startswith("https://elasticsearch:")
    secret = reader["password_secret"]
    assert logs["secureJsonData"]["basicAuthPassword"] == f"$__file{{/run/secrets/{secret}}}"
    assert logs["jsonData"]["tlsAuthWithCACert"] is True
    assert logs["secureJsonData"]["tlsCACert"] == "$__file{/run/secrets/elasticsearch-ca.pem}"
    assert {secret, "elasticsearch-ca.pem"} <= set(grafana["secrets"])
    assert {secret, "elasticsearch-ca.pem"} <= set(COMPOSE["secrets"])
    # The same datasource as the shared provisioning file's (name, uid, what it queries): same dashboards.
    (local,) = yaml.safe_load((REPO_ROOT / "dashboards/provisioning/datasources/logs.yml").read_text())[
        "datasources"
    ]
    assert {k: logs[k] for k in ("name", "uid", "type", "url")} == {
        k: local[k] for k in ("name", "uid", "type", "url")
    }
    assert {k: v for k, v in logs["jsonData"].items() if not k.startswith("tls")} == local["jsonData"]
