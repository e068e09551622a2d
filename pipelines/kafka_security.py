"""Kafka's security on the log path: TLS + SASL/SCRAM-SHA-512 on the listener the nodes use, and ACLs
(``kafka/acls.yaml``) enforced by KRaft's StandardAuthorizer. docs/security.md, T2 and T3.

Three SCRAM users: ``fleetsight-node`` (every node's rsyslog: produce to the log topics, nothing else),
``fleetsight-shipper`` (rsyslog imkafka locally, Logstash in production: consume the log topics in its
groups, nothing else) and ``fleetsight-admin`` (a super user: ``logs apply`` creates topics and ACLs with
it; the broker also uses it between its own listeners).

The local stack makes its material once per run folder (:func:`ensure_secrets`): a CA and the broker's
certificate (openssl, EC P-256; the CA key never leaves the folder), and one random password per user, each
in its own 0600 file. The SCRAM credentials go into the KRaft storage when it is formatted
(``--add-scram``), through a java argument file (0600) so that no password is ever on a command line.
Nothing here is committed; production brings its own (secrets/*.example, docs/logs.md).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fleetsight.certificates import CertificateError, sign_certificate
from fleetsight.secrets import SecretFileError, read_secret_file

from .logclasses import PIPELINES_DIR

ACLS_FILE = PIPELINES_DIR / "kafka" / "acls.yaml"
MECHANISM = "SCRAM-SHA-512"
ADMIN_USER = "fleetsight-admin"
NODE_USER = "fleetsight-node"
SHIPPER_USER = "fleetsight-shipper"
USERS = (ADMIN_USER, NODE_USER, SHIPPER_USER)
BROKER_CN = "fleetsight-kafka-broker"
"""The broker's certificate subject: its principal (``User:CN=...``) on the mutual-TLS controller
listener, and a super user there."""
CERT_DAYS = 825

# Environment of the clients outside the local stack (``logs apply`` in docker-compose, benchmarks).
ENV_USERNAME = "FLEETSIGHT_KAFKA_USERNAME"
ENV_PASSWORD_FILE = "FLEETSIGHT_KAFKA_PASSWORD_FILE"
ENV_CA_FILE = "FLEETSIGHT_KAFKA_CA_FILE"


class KafkaSecurityError(RuntimeError):
    """The security material could not be made or read; the message says which file and why."""


@dataclass(frozen=True)
class ClientAuth:
    """What a client needs to reach the SASL_SSL listener: a user, its password file and the CA."""

    username: str
    password_file: Path
    ca_file: Path

    def password(self) -> str:
        # one reader for every secret file (fleetsight.secrets); its refusal as this module's error
        try:
            return read_secret_file(self.password_file, f"the Kafka password file of {self.username}")
        except SecretFileError as exc:
            raise KafkaSecurityError(str(exc)) from None

    def librdkafka(self) -> dict[str, str]:
        """librdkafka (confluent-kafka) settings: SASL_SSL, SCRAM-SHA-512, the CA, host name checked."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": MECHANISM,
            "sasl.username": self.username,
            "sasl.password": self.password(),
            "ssl.ca.location": str(self.ca_file),
            "ssl.endpoint.identification.algorithm": "https",
        }


@dataclass(frozen=True)
class RsyslogAuth:
    """rsyslog's view of a credential: the user, a file holding exactly ``sasl.password=PASSWORD`` (no
    trailing newline: rsyslog keeps it, and the password would be wrong), and the CA."""

    username: str
    password_param_file: Path
    ca_file: Path


def rsyslog_conf_params(auth: RsyslogAuth) -> list[str]:
    """Elements of an omkafka/imkafka ``confParam=[...]`` array (rsyslog syntax, quoted): SASL_SSL with
    SCRAM-SHA-512, the CA, the host name checked; the password through rsyslog's backtick
    ``cat FILE``, evaluated when rsyslogd loads its configuration."""
    return [
        '"security.protocol=SASL_SSL"',
        f'"sasl.mechanism={MECHANISM}"',
        f'"sasl.username={auth.username}"',
        f"`cat {auth.password_param_file}`",
        f'"ssl.ca.location={auth.ca_file}"',
        '"ssl.endpoint.identification.algorithm=https"',
    ]


@dataclass(frozen=True)
class KafkaSecrets:
    """The local stack's material in one 0700 folder."""

    directory: Path

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def keystore(self) -> Path:
        """The broker's private key (PKCS#8) and certificate, one PEM file, as Kafka's PEM keystore."""
        return self.directory / "broker.pem"

    def password_file(self, user: str) -> Path:
        return self.directory / f"{user}.password"

    def password(self, user: str) -> str:
        return self.client(user).password()

    def client(self, user: str) -> ClientAuth:
        return ClientAuth(user, self.password_file(user), self.ca_file)

    def rsyslog_param_file(self, user: str) -> Path:
        """``sasl.password=...`` with no newline: what rsyslog's omkafka/imkafka read with a backtick
        ``cat`` (:func:`rsyslog_conf_params`), so that the password is not in rsyslog.conf."""
        return self.directory / f"{user}.rsyslog-param"

    def rsyslog_auth(self, user: str) -> RsyslogAuth:
        return RsyslogAuth(user, self.rsyslog_param_file(user), self.ca_file)

    def complete(self) -> bool:
        files = [self.ca_file, self.keystore, *(self.password_file(u) for u in USERS)]
        return all(path.is_file() and path.stat().st_size > 0 for path in files)


def write_private(path: Path, text: str) -> None:
    """Create path readable by its owner only (0600 from the start, no window where it is wider)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(text)


def make_certificates(
    target: Path, hosts: tuple[str, ...], cn: str = BROKER_CN, keep_parts: bool = False
) -> None:
    """A CA (ca.pem, ca.key) and a server certificate for hosts (IP addresses or DNS names) signed by it:
    broker.pem (key + certificate, Kafka's PEM keystore), and with keep_parts also broker.key and
    broker.crt apart (Elasticsearch's form)."""
    try:
        signed = sign_certificate(target, "fleetsight-kafka-ca", cn, hosts, CERT_DAYS, client_auth=True)
    except CertificateError as error:
        raise KafkaSecurityError(str(error)) from None
    signed.ca_cert.rename(target / "ca.pem")
    write_private(target / "broker.pem", signed.key.read_text() + signed.cert.read_text())
    if keep_parts:
        signed.key.rename(target / "broker.key")
        signed.cert.rename(target / "broker.crt")
    else:
        signed.key.unlink()
        signed.cert.unlink()


def ensure_secrets(directory: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> KafkaSecrets:
    """The material in directory, made once (complete or not at all: built beside it, then renamed)."""
    found = KafkaSecrets(directory)
    if found.complete():
        return found
    directory.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{directory.name}.partial-", dir=directory.parent))
    try:
        old = os.umask(0o077)  # openssl's key files: owner only from the start
        try:
            make_certificates(staged, hosts)
        finally:
            os.umask(old)
        for user in USERS:
            password = secrets.token_urlsafe(24)
            write_private(staged / f"{user}.password", password + "\n")
            write_private(staged / f"{user}.rsyslog-param", f"sasl.password={password}")
        (staged / "ca.pem").chmod(0o644)  # the CA certificate is public; its key is not
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(staged, directory)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return found


def scram_format_arguments(material: KafkaSecrets) -> list[str]:
    """StorageTool's ``--add-scram`` arguments for every user (they hold the passwords: write them to an
    argument file, never onto a command line)."""
    arguments = []
    for user in USERS:
        arguments += ["--add-scram", f"{MECHANISM}=[name={user},password={material.password(user)}]"]
    return arguments


def broker_properties(
    material: KafkaSecrets, *, listener: str, controller: str, advertised: str, node_id: int
) -> str:
    """server.properties lines of a single-node KRaft broker whose only client listener is SASL_SSL
    (listener ``host:port``) and whose controller listener (on loopback) is mutual TLS."""
    admin_password = material.password(ADMIN_USER)
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{ADMIN_USER}" password="{admin_password}";'
    )
    return "\n".join(
        [
            "process.roles=broker,controller",
            f"node.id={node_id}",
            f"controller.quorum.voters={node_id}@{controller}",
            f"listeners=SASL_SSL://{listener},CONTROLLER://{controller}",
            f"advertised.listeners=SASL_SSL://{advertised}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=SASL_SSL",
            "listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:SSL",
            # SCRAM only: no PLAIN (a password in clear inside TLS), no GSSAPI.
            f"sasl.enabled.mechanisms={MECHANISM}",
            f"sasl.mechanism.inter.broker.protocol={MECHANISM}",
            f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config={jaas}",
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={material.keystore}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={material.ca_file}",
            "ssl.enabled.protocols=TLSv1.3,TLSv1.2",
            # The controller listener takes only the broker's own certificate (mutual TLS).
            "listener.name.controller.ssl.client.auth=required",
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found=false",
            f"super.users=User:{ADMIN_USER};User:CN={BROKER_CN}",
            "",
        ]
    )


def format_with_scram(java_prefix: list[str], main_arguments: list[str], material: KafkaSecrets) -> None:
    """Run StorageTool format (java_prefix ends with the main class) with the SCRAM users, the whole
    argument list in a 0600 java argument file (``java @file``) removed afterwards."""
    java, *options = java_prefix
    argfile = material.directory / "format.args"
    lines = [*options, *main_arguments, *scram_format_arguments(material)]
    write_private(argfile, "\n".join(f'"{arg}"' for arg in lines) + "\n")
    try:
        result = subprocess.run([java, f"@{argfile}"], capture_output=True, text=True, timeout=120)
    finally:
        argfile.unlink(missing_ok=True)
    if result.returncode != 0:
        # StorageTool's errors name arguments, never echo them: safe to show.
        raise KafkaSecurityError(f"Kafka's StorageTool format failed: {result.stderr.strip()[-800:]}")


# -- ACLs ------------------------------------------------------------------------------------------


def acl_rules(path: Path = ACLS_FILE) -> list[dict[str, Any]]:
    """The ACL model as (user, resource, pattern, name, operation) rows."""
    document = yaml.safe_load(path.read_text())
    rows = []
    for user, grants in document["users"].items():
        for grant in grants:
            for operation in grant["operations"]:
                rows.append(
                    {
                        "user": user,
                        "resource": grant["resource"],
                        "pattern": grant.get("pattern", "literal"),
                        "name": grant["name"],
                        "operation": operation,
                    }
                )
    return rows


def client_auth_from_env() -> ClientAuth | None:
    """A client's credentials from FLEETSIGHT_KAFKA_USERNAME / _PASSWORD_FILE / _CA_FILE (all three or
    none)."""
    values = {name: os.environ.get(name, "") for name in (ENV_USERNAME, ENV_PASSWORD_FILE, ENV_CA_FILE)}
    if not any(values.values()):
        return None
    missing = [name for name, value in values.items() if not value]
    if missing:
        raise KafkaSecurityError(f"Kafka credentials need {', '.join(missing)} as well")
    return ClientAuth(values[ENV_USERNAME], Path(values[ENV_PASSWORD_FILE]), Path(values[ENV_CA_FILE]))


# -- librdkafka -------------------------------------------------------------------------------------

MIN_LIBRDKAFKA = (2, 6, 1)
"""librdkafka before 2.6.1 builds a SCRAM proof that Kafka 4.x refuses ("invalid credentials"; the
client nonce was sent twice, librdkafka PR #4895). Debian 12 ships 2.0.2, so the local rsyslog runs with
the newer librdkafka that confluent-kafka's wheel bundles (same C ABI, ``librdkafka.so.1``)."""


def bundled_librdkafka() -> Path:
    """The librdkafka shared library inside confluent-kafka's wheel."""
    import confluent_kafka

    libs = Path(confluent_kafka.__file__).resolve().parent.parent / "confluent_kafka.libs"
    found = sorted(libs.glob("librdkafka*.so*"))
    if not found:
        raise KafkaSecurityError(
            f"no librdkafka in {libs}: rsyslog needs librdkafka >= 2.6.1 for SCRAM against Kafka 4 "
            "(reinstall confluent-kafka from its wheel)"
        )
    return found[0]


def librdkafka_dir(target: Path) -> Path:
    """A folder holding ``librdkafka.so.1`` -> the bundled library: rsyslogd's LD_LIBRARY_PATH."""
    target.mkdir(parents=True, exist_ok=True)
    link = target / "librdkafka.so.1"
    wanted = bundled_librdkafka()
    if not link.is_symlink() or link.resolve() != wanted:
        link.unlink(missing_ok=True)
        link.symlink_to(wanted)
    return target


# -- production material ------------------------------------------------------------------------------

PASSWORD_SECRETS = (
    "kafka-admin-password",
    "kafka-node-password",
    "kafka-shipper-password",
    "elastic-password",
    "es-logstash-password",
    "es-elastalert-password",
    "es-logs-admin-password",
    "es-kibana-import-password",
    "es-reader-password",
    "es-kibana-system-password",
    "exporters-scrape-password",
)
EXPORTER_SERVER_NAME = "fleetsight-exporter"
"""The one name the exporters' shared certificate is issued for; Prometheus checks it (tls_config
server_name in metrics/prometheus.yml), whatever address it scrapes."""


def exporters_web_config(password: str) -> str:
    """exporter-toolkit's web configuration: TLS with the shared certificate, basic auth for the user
    ``prometheus`` (the bcrypt hash of password)."""
    import bcrypt

    digest = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=10)).decode()
    return (
        "# Written by `fleetsight logs make-secrets`; check with `promtool check web-config FILE`.\n"
        "tls_server_config:\n"
        "  cert_file: /etc/fleetsight/exporters-tls.pem\n"
        "  key_file: /etc/fleetsight/exporters-tls.key\n"
        f"basic_auth_users:\n  prometheus: {digest}\n"
    )


def make_production_secrets(out: Path, kafka_hosts: tuple[str, ...], es_hosts: tuple[str, ...]) -> list[Path]:
    """Every secret file docker-compose.yml names for the log path, into out (refusing to overwrite):
    Kafka's CA and broker keystore, Elasticsearch's CA and HTTP certificate, the exporters' certificate
    and web configuration (with Prometheus's scrape password), random passwords, and
    ``kafka-node.rsyslog-param`` for the nodes (/etc/fleetsight/kafka/fleetsight-node.rsyslog-param)."""
    passwords = {name: secrets.token_urlsafe(24) for name in PASSWORD_SECRETS}
    files: dict[str, str] = {f"{name}": value + "\n" for name, value in passwords.items()}
    files["kafka-node.rsyslog-param"] = f"sasl.password={passwords['kafka-node-password']}"
    with tempfile.TemporaryDirectory() as scratch:
        kafka, es = Path(scratch) / "kafka", Path(scratch) / "es"
        kafka.mkdir()
        es.mkdir()
        make_certificates(kafka, kafka_hosts)
        make_certificates(es, es_hosts, cn="fleetsight-elasticsearch", keep_parts=True)
        files["kafka-ca.pem"] = (kafka / "ca.pem").read_text()
        files["kafka-broker.pem"] = (kafka / "broker.pem").read_text()
        files["elasticsearch-ca.pem"] = (es / "ca.pem").read_text()
        files["elasticsearch-http.pem"] = (es / "broker.crt").read_text()
        files["elasticsearch-http.key"] = (es / "broker.key").read_text()
        exporters = Path(scratch) / "exporters"
        exporters.mkdir()
        make_certificates(exporters, (EXPORTER_SERVER_NAME,), cn=EXPORTER_SERVER_NAME, keep_parts=True)
        files["exporters-ca.pem"] = (exporters / "ca.pem").read_text()
        files["exporters-tls.pem"] = (exporters / "broker.crt").read_text()
        files["exporters-tls.key"] = (exporters / "broker.key").read_text()
    files["exporters-web-config.yml"] = exporters_web_config(passwords["exporters-scrape-password"])
    existing = [name for name in files if (out / name).exists()]
    if existing:
        raise KafkaSecurityError(f"{out} already has {', '.join(sorted(existing))}: move them away first")
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        write_private(out / name, text)
    return [out / name for name in sorted(files)]
