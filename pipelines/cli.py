"""``fleetsight logs``: set up the log path (topics, pipelines, policies, templates) and search it."""

from __future__ import annotations

import json
import sys

import click
import httpx
from rich.console import Console
from rich.table import Table

from fleetsight.settings import Settings

from . import search as search_mod
from .apply import ApplyError, apply_all
from .kafka_security import KafkaSecurityError

console = Console()


def default_kafka() -> str:
    return f"127.0.0.1:{Settings().port('kafka')}"


def kafka_credentials(explicit: bool) -> dict[str, str] | None:
    """The admin credential: FLEETSIGHT_KAFKA_USERNAME/_PASSWORD_FILE/_CA_FILE, else (for the local
    stack's broker, i.e. no --kafka) the local stack's own; None: a PLAINTEXT broker."""
    from . import kafka_security as security
    from .component import kafka_secrets

    auth = security.client_auth_from_env()
    if auth is None and not explicit:
        local = kafka_secrets(Settings())
        auth = local.client(security.ADMIN_USER) if local.complete() else None
    return auth.librdkafka() if auth else None


def default_search_url() -> str:
    return Settings().url("opensearch")


@click.group()
def cli() -> None:
    """The log path: rsyslog -> Kafka -> ingest pipelines -> OpenSearch/Elasticsearch.

    \b
    Examples:
      fleetsight logs apply
      fleetsight logs search --node n0003 --xid
      fleetsight logs search --job 2001 --errors
    """


@cli.command()
@click.option(
    "--kafka", "bootstrap", default=None, help="Kafka bootstrap servers [default: the local stack's]."
)
@click.option(
    "--url", "search_url", default=None, help="OpenSearch/Elasticsearch URL [default: the local stack's]."
)
@click.option("--skip-kafka", is_flag=True, help="Leave Kafka alone (only the search side).")
@click.option("--skip-search", is_flag=True, help="Leave OpenSearch/Elasticsearch alone (only topics).")
def apply(bootstrap: str | None, search_url: str | None, skip_kafka: bool, skip_search: bool) -> None:
    """Create or update the Kafka topics and ACLs (kafka/acls.yaml), ingest pipelines, lifecycle policies
    (ISM on OpenSearch, ILM on Elasticsearch) and index templates. Idempotent: a second run reports
    everything unchanged.

    A secured broker (SASL_SSL, SCRAM-SHA-512) takes the admin credential from the environment:
    FLEETSIGHT_KAFKA_USERNAME, FLEETSIGHT_KAFKA_PASSWORD_FILE (a file holding the password) and
    FLEETSIGHT_KAFKA_CA_FILE; the ACLs are applied only then. The local stack's broker needs none.

    \b
    Examples:
      fleetsight logs apply
      FLEETSIGHT_KAFKA_USERNAME=fleetsight-admin FLEETSIGHT_KAFKA_PASSWORD_FILE=/run/secrets/kafka_admin \\
        FLEETSIGHT_KAFKA_CA_FILE=/etc/fleetsight/kafka-ca.pem \\
        fleetsight logs apply --kafka kafka-1:9094,kafka-2:9094 --url https://elasticsearch:9200
      fleetsight logs apply --skip-kafka --url http://127.0.0.1:9200
    """
    kafka = None if skip_kafka else (bootstrap or default_kafka())
    url = None if skip_search else (search_url or default_search_url())
    try:
        credentials = kafka_credentials(explicit=bootstrap is not None) if kafka else None
        outcomes = apply_all(kafka, url, credentials)
    except (ApplyError, KafkaSecurityError) as exc:
        raise click.ClickException(str(exc)) from exc
    table = Table(title="fleetsight logs apply")
    for column in ("kind", "name", "status"):
        table.add_column(column, no_wrap=True)
    table.add_column("detail", overflow="fold")
    for outcome in outcomes:
        table.add_row(outcome.kind, outcome.name, outcome.status, outcome.detail)
    console.print(table)


@cli.command()
@click.argument("text", required=False)
@click.option("--node", help="Only this node (host.name).")
@click.option("--job", help="Only this scheduler job (its ranks' logs).")
@click.option("--xid", "xid_only", is_flag=True, help="Only NVRM Xid events.")
@click.option(
    "--action", "actions", multiple=True, help="Only this event.action (repeatable), e.g. cuda_error."
)
@click.option("--errors", "errors_only", is_flag=True, help="Only error and critical events.")
@click.option("--class", "log_class", help="Only this log class: kernel, fabricmanager, application, bmc.")
@click.option("--since", default="24h", show_default=True, help="How far back: 30m, 24h, 7d.")
@click.option("--limit", default=50, show_default=True, help="At most this many rows (newest first).")
@click.option(
    "--url", "search_url", default=None, help="OpenSearch/Elasticsearch URL [default: the local stack's]."
)
@click.option("--json", "as_json", is_flag=True, help="Print the documents as JSON lines instead of a table.")
def search(
    text: str | None,
    node: str | None,
    job: str | None,
    xid_only: bool,
    actions: tuple[str, ...],
    errors_only: bool,
    log_class: str | None,
    since: str,
    limit: int,
    search_url: str | None,
    as_json: bool,
) -> None:
    """Search the parsed logs; TEXT is an optional query on the raw line (Lucene syntax).

    \b
    Examples:
      fleetsight logs search --node n0003 --xid                the Xids of a node in the last day
      fleetsight logs search --job 2001 --errors               the errors of job 2001
      fleetsight logs search --action nccl_timeout --since 2h
      fleetsight logs search '"fallen off the bus"' --since 7d
    """
    question = search_mod.Question(
        node=node,
        job=job,
        actions=[*actions, *(["xid"] if xid_only else [])],
        errors_only=errors_only,
        since=since,
        text=text,
        log_class=log_class,
        limit=limit,
    )
    try:
        total, sources = search_mod.run(search_url or default_search_url(), question)
    except (ApplyError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        for source in sources:
            sys.stdout.write(json.dumps(source, sort_keys=True) + "\n")
        return
    table = Table(title=f"{total} event(s), newest {len(sources)} shown", expand=True)
    for column, options in (
        ("time", {"no_wrap": True}),
        ("node", {"no_wrap": True}),
        ("job/rank", {"no_wrap": True}),
        ("event", {"no_wrap": True}),
        ("level", {"no_wrap": True}),
        ("what", {"overflow": "fold", "ratio": 1}),
    ):
        table.add_column(column, **options)
    for source in sources:
        meta = source.get("fleetsight", {})
        job_rank = f"{meta['hpc_job']}/{meta.get('rank', '-')}" if "hpc_job" in meta else ""
        table.add_row(
            str(source.get("@timestamp", ""))[:19].replace("T", " "),
            source.get("host", {}).get("name", ""),
            job_rank,
            source.get("event", {}).get("action", ""),
            source.get("log", {}).get("level", ""),
            search_mod.summary(source),
        )
    console.print(table)


@cli.command()
@click.option("--check", is_flag=True, help="Exit 1 if a generated file differs; write nothing.")
def generate(check: bool) -> None:
    """Write what is generated from the pattern catalogue (pipelines/catalogue.py) and the Xid catalogue
    (fleetsight/xid_catalog.py): the catalogued ingest pipelines' grok, dates and classify parameters,
    and the node side's liblognorm rulebases and Xid lookup tables under pipelines/edge/.

    \b
    Examples:
      fleetsight logs generate
      fleetsight logs generate --check     # in CI: the files agree with the catalogues
    """
    from . import generate as gen

    if check:
        stale = gen.stale()
        if stale:
            names = ", ".join(str(path.relative_to(gen.PIPELINES_DIR)) for path in stale)
            raise click.ClickException(f"out of date: {names}: run `fleetsight logs generate`")
        console.print("generated files: up to date")
        return
    changed = gen.write()
    for path in changed:
        console.print(f"{path.relative_to(gen.PIPELINES_DIR)}: rewritten")
    if not changed:
        console.print("generated files: already up to date")


@cli.command("kibana-import")
@click.option("--url", "kibana_url", required=True, help="Kibana's URL, e.g. http://kibana:5601.")
def kibana_import(kibana_url: str) -> None:
    """Import the log path's data views, saved searches and dashboard into Kibana (idempotent: our
    objects have fixed ids and are overwritten).

    \b
    Examples:
      fleetsight logs kibana-import --url http://kibana:5601
    """
    from .kibana import SAVED_OBJECTS, import_saved_objects

    try:
        answer = import_saved_objects(kibana_url)
    except (ValueError, httpx.HTTPError) as exc:
        raise click.ClickException(str(exc)) from exc
    console.print(
        f"{SAVED_OBJECTS.name}: {answer.get('successCount', 0)} object(s) imported into {kibana_url}"
    )


@cli.command("make-secrets")
@click.option("--out", default="secrets", show_default=True, help="Folder to write into (never overwritten).")
@click.option(
    "--kafka-host",
    "kafka_hosts",
    multiple=True,
    default=("kafka", "localhost"),
    show_default=True,
    help="A name (or IP) the broker certificate is valid for: add the one nodes connect to (repeatable).",
)
@click.option(
    "--es-host",
    "es_hosts",
    multiple=True,
    default=("elasticsearch", "localhost"),
    show_default=True,
    help="A name (or IP) Elasticsearch's HTTP certificate is valid for (repeatable).",
)
def make_secrets(out: str, kafka_hosts: tuple[str, ...], es_hosts: tuple[str, ...]) -> None:
    """Write the log path's secret files for docker-compose.yml: a CA and a certificate each for Kafka and
    Elasticsearch, and a random password per Kafka and Elasticsearch user (files 0600; passwords are
    never printed). Also kafka-node.rsyslog-param, the nodes' credential file (docs/logs.md).

    \b
    Examples:
      fleetsight logs make-secrets --out secrets --kafka-host kafka --kafka-host logs.cluster.example.org
    """
    from pathlib import Path

    from .kafka_security import make_production_secrets

    hosts = tuple(dict.fromkeys(kafka_hosts))
    try:
        written = make_production_secrets(Path(out), hosts, tuple(dict.fromkeys(es_hosts)))
    except KafkaSecurityError as exc:
        raise click.ClickException(str(exc)) from exc
    for path in written:
        console.print(f"wrote {path}")


@cli.command("es-security")
@click.option("--url", "search_url", required=True, help="Elasticsearch URL (https).")
@click.option(
    "--secrets-dir",
    default="/run/secrets",
    show_default=True,
    help="Where the users' password files (security/elasticsearch.yml's password_secret) are.",
)
def es_security(search_url: str, secrets_dir: str) -> None:
    """Create or update the Elasticsearch roles and users of pipelines/security/elasticsearch.yml (least
    privilege: Logstash writes the log indices, ElastAlert and readers read them, `logs apply` manages
    templates and pipelines) and kibana_system's password. Run as the `elastic` superuser, whose
    credential comes from FLEETSIGHT_LOGS_USERNAME / FLEETSIGHT_LOGS_PASSWORD_FILE / FLEETSIGHT_LOGS_CA_FILE.

    \b
    Examples:
      FLEETSIGHT_LOGS_USERNAME=elastic FLEETSIGHT_LOGS_PASSWORD_FILE=/run/secrets/elastic-password \\
        FLEETSIGHT_LOGS_CA_FILE=/run/secrets/elasticsearch-ca.pem \\
        fleetsight logs es-security --url https://elasticsearch:9200
    """
    from pathlib import Path

    from .es_security import SecurityError, apply_security

    try:
        written = apply_security(search_url, Path(secrets_dir))
    except SecurityError as exc:
        raise click.ClickException(str(exc)) from exc
    for kind, name in written:
        console.print(f"{kind} {name}: applied")


@cli.command("rsyslog-config")
@click.option("--role", type=click.Choice(["node", "shipper"]), default="node", show_default=True)
@click.option(
    "--broker", "brokers", multiple=True, required=True, help="Kafka bootstrap host:port (repeatable)."
)
@click.option(
    "--cluster",
    envvar="FLEETSIGHT_CLUSTER",
    default="default",
    show_default=True,
    help="Cluster name carried by every record (as Prometheus's external label `cluster`).",
)
@click.option(
    "--work-dir", default="/var/spool/rsyslog", show_default=True, help="rsyslog's state and queues."
)
@click.option(
    "--url", "search_url", default="http://elasticsearch:9200", show_default=True, help="Shipper only."
)
@click.option(
    "--edge-dir",
    default=None,
    help="Node only: where the node has pipelines/edge/ (rulebases, Xid tables); default this checkout's.",
)
@click.option(
    "--no-edge-parse", is_flag=True, help="Node only: ship every class raw, for the ingest pipelines."
)
@click.option(
    "--kafka-user",
    default=None,
    help="SCRAM user [default: fleetsight-node for a node, fleetsight-shipper for a shipper].",
)
@click.option(
    "--kafka-secrets",
    default="/etc/fleetsight/kafka",
    show_default=True,
    help="Folder with ca.pem and USER.rsyslog-param (exactly `sasl.password=...`, no newline, mode 0600).",
)
@click.option(
    "--kafka-plaintext",
    is_flag=True,
    help="No TLS, no SASL: only for a development broker that has no security (never on a cluster).",
)
def rsyslog_config(
    role: str,
    brokers: tuple[str, ...],
    cluster: str,
    work_dir: str,
    search_url: str,
    edge_dir: str | None,
    no_edge_parse: bool,
    kafka_user: str | None,
    kafka_secrets: str,
    kafka_plaintext: bool,
) -> None:
    """Print the rsyslog configuration of a real node (files under /var/log -> parsed on the node ->
    Kafka) or of a shipper (Kafka -> Elasticsearch: edge topics with no pipeline, raw topics through the
    ingest pipelines). Check it with `rsyslogd -N1 -f FILE`; copy pipelines/edge/ to the node with it.

    Kafka is reached over SASL_SSL with SCRAM-SHA-512 (docs/logs.md, "Node credentials"): the password
    stays in --kafka-secrets, read by rsyslog when it starts; the configuration holds none. rsyslog needs
    librdkafka 2.6.1 or later for SCRAM against Kafka 4.

    \b
    Examples:
      fleetsight logs rsyslog-config --broker kafka-1:19092 --cluster prod-a > /etc/rsyslog.d/fleetsight.conf
      fleetsight logs rsyslog-config --broker kafka-1:19092 --edge-dir /usr/share/fleetsight/edge
      fleetsight logs rsyslog-config --role shipper --broker kafka:19092 --url http://es:9200
    """
    from pathlib import Path
    from urllib.parse import urlparse

    from .kafka_security import NODE_USER, SHIPPER_USER, RsyslogAuth
    from .rsyslog_conf import NodeOptions, ShipperOptions, node_config, shipper_config

    user = kafka_user or (NODE_USER if role == "node" else SHIPPER_USER)
    secrets_dir = Path(kafka_secrets)
    auth = (
        None
        if kafka_plaintext
        else RsyslogAuth(user, secrets_dir / f"{user}.rsyslog-param", secrets_dir / "ca.pem")
    )

    if role == "node":
        from .generate import EDGE_DIR

        options = NodeOptions(
            brokers=list(brokers),
            work_dir=Path(work_dir),
            cluster=cluster,
            edge_parse=not no_edge_parse,
            edge_dir=Path(edge_dir) if edge_dir else EDGE_DIR,
            kafka_auth=auth,
        )
        sys.stdout.write(node_config(options))
        return
    url = urlparse(search_url)
    options = ShipperOptions(
        brokers=list(brokers),
        es_host=url.hostname or "localhost",
        es_port=url.port or 9200,
        work_dir=Path(work_dir),
        error_file=Path(work_dir) / "rejected.jsonl",
        kafka_auth=auth,
    )
    sys.stdout.write(shipper_config(options))
