"""``fleetsight logs apply``: Kafka topics, ingest pipelines, lifecycle policies and index templates.

Idempotent: each object is compared with what the server holds and written only when it differs, so a
second run reports every object ``unchanged``. Works against OpenSearch (ISM policies) and
Elasticsearch (ILM policies, ``index.lifecycle.name`` in the templates); the pipelines and templates
are the same files for both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from .logclasses import LOG_CLASSES, PIPELINES_DIR, topic_specs

TEMPLATES_DIR = PIPELINES_DIR / "templates"
POLICIES_DIR = PIPELINES_DIR / "policies"
# template name -> lifecycle policy id (the same id for ISM and ILM)
TEMPLATES = {"fleetsight-logs": "fleetsight-logs", "fleetsight-audit": "fleetsight-audit"}


class ApplyError(ValueError):
    """A server refused an object or could not be reached; the message names which and why."""


@dataclass(frozen=True)
class Outcome:
    kind: str  # topic, pipeline, policy, template
    name: str
    status: str  # created, updated, unchanged, skipped
    detail: str = ""


# -- Kafka ------------------------------------------------------------------------------------------


def apply_topics(
    bootstrap: str, timeout_s: float = 30.0, client: dict[str, str] | None = None
) -> list[Outcome]:
    """Create missing topics, add partitions, and bring topic configs to topics.yaml's values. client:
    librdkafka settings of the admin credential (SASL_SSL), none for a PLAINTEXT broker."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewPartitions,
        NewTopic,
    )

    admin = AdminClient(
        {"bootstrap.servers": bootstrap, "socket.timeout.ms": int(timeout_s * 1000), **(client or {})}
    )
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise ApplyError(f"Kafka at {bootstrap} did not answer: {exc}") from exc
    brokers = max(1, len(metadata.brokers))
    outcomes = []
    for topic, spec in topic_specs().items():
        replication = min(spec["replication_factor"], brokers)
        config = {**spec["config"]}
        config["min.insync.replicas"] = str(min(int(config.get("min.insync.replicas", 1)), replication))
        existing = metadata.topics.get(topic)
        try:
            if existing is None:
                new = NewTopic(topic, spec["partitions"], replication, config=config)
                admin.create_topics([new])[topic].result(timeout_s)
                outcomes.append(Outcome("topic", topic, "created", f"{spec['partitions']} partitions"))
                continue
            changes = []
            if len(existing.partitions) < spec["partitions"]:
                admin.create_partitions([NewPartitions(topic, spec["partitions"])])[topic].result(timeout_s)
                changes.append(f"partitions {len(existing.partitions)}->{spec['partitions']}")
            resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
            current = admin.describe_configs([resource])[resource].result(timeout_s)
            differing = {k: v for k, v in config.items() if k not in current or current[k].value != v}
            if differing:
                entries = [
                    ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                    for k, v in differing.items()
                ]
                altered = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=entries)
                admin.incremental_alter_configs([altered])[altered].result(timeout_s)
                changes.append("config " + ", ".join(sorted(differing)))
            status = "updated" if changes else "unchanged"
            outcomes.append(Outcome("topic", topic, status, "; ".join(changes)))
        except KafkaException as exc:
            raise ApplyError(f"Kafka refused topic {topic}: {exc}") from exc
    return outcomes


def acl_binding(row: dict[str, Any]) -> Any:
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    return AclBinding(
        ResourceType[row["resource"].upper()],
        row["name"],
        ResourcePatternType[row["pattern"].upper()],
        f"User:{row['user']}",
        "*",
        AclOperation[row["operation"].upper()],
        AclPermissionType.ALLOW,
    )


def apply_acls(bootstrap: str, client: dict[str, str], timeout_s: float = 30.0) -> list[Outcome]:
    """Create the ACLs of kafka/acls.yaml that the broker lacks (one outcome per user). ACLs the file
    no longer names are reported, not removed: an operator may have added them on purpose."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    from .kafka_security import acl_rules

    admin = AdminClient({"bootstrap.servers": bootstrap, **client})
    any_acl = AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY
    )
    try:
        existing = set(admin.describe_acls(any_acl, request_timeout=timeout_s).result(timeout_s))
        wanted = [acl_binding(row) for row in acl_rules()]
        missing = [binding for binding in wanted if binding not in existing]
        if missing:
            for future in admin.create_acls(missing, request_timeout=timeout_s).values():
                future.result(timeout_s)
    except KafkaException as exc:
        raise ApplyError(f"Kafka at {bootstrap} refused the ACLs: {exc}") from exc
    outcomes = []
    for principal in sorted({binding.principal for binding in wanted}):
        added = sum(binding.principal == principal for binding in missing)
        total = sum(binding.principal == principal for binding in wanted)
        status = "created" if added == total else "updated" if added else "unchanged"
        outcomes.append(Outcome("acl", principal, status, f"{total} grants, {added} added"))
    extra = existing - set(wanted)
    if extra:
        names = ", ".join(sorted({binding.principal for binding in extra}))
        outcomes.append(Outcome("acl", "(not in acls.yaml)", "skipped", f"{len(extra)} kept: {names}"))
    return outcomes


# -- OpenSearch / Elasticsearch --------------------------------------------------------------------


class SearchServer:
    """The few REST calls apply and search need, against OpenSearch or Elasticsearch."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        from .es_security import client_options  # basic auth + CA from the environment (production)

        self.http = httpx.Client(base_url=self.url, timeout=timeout_s, **client_options())
        self._flavour: str | None = None

    def request(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = ()) -> httpx.Response:
        try:
            response = self.http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise ApplyError(f"{self.url} did not answer {method} {path}: {exc}") from exc
        if response.is_success or response.status_code in ok:
            return response
        raise ApplyError(f"{method} {path} on {self.url}: HTTP {response.status_code} {response.text[:500]}")

    @property
    def flavour(self) -> str:
        """``opensearch`` or ``elasticsearch``."""
        if self._flavour is None:
            response = self.request("GET", "/", ok=(400, 404, 405, 410))
            distribution = (
                response.json().get("version", {}).get("distribution", "") if response.is_success else ""
            )
            self._flavour = "opensearch" if distribution == "opensearch" else "elasticsearch"
        return self._flavour

    def data_nodes(self) -> int:
        health = self.request("GET", "/_cluster/health").json()
        return int(health.get("number_of_data_nodes", 1))

    def put_if_changed(self, kind: str, name: str, path: str, body: dict[str, Any], current: Any) -> Outcome:
        if current == body:
            return Outcome(kind, name, "unchanged")
        self.request("PUT", path, body)
        return Outcome(kind, name, "created" if current is None else "updated")


def apply_pipelines(server: SearchServer) -> list[Outcome]:
    outcomes = []
    for log_class in LOG_CLASSES:
        body = log_class.pipeline_body()
        path = f"/_ingest/pipeline/{log_class.pipeline_id}"
        response = server.request("GET", path, ok=(404,))
        current = response.json().get(log_class.pipeline_id) if response.is_success else None
        outcomes.append(server.put_if_changed("pipeline", log_class.pipeline_id, path, body, current))
    return outcomes


def policy_file(flavour: str, policy: str) -> Path:
    return POLICIES_DIR / f"{'ism' if flavour == 'opensearch' else 'ilm'}-{policy}.json"


def apply_policies(server: SearchServer) -> list[Outcome]:
    return [apply_policy(server, policy) for policy in TEMPLATES.values()]


def apply_policy(server: SearchServer, policy: str) -> Outcome:
    body = json.loads(policy_file(server.flavour, policy).read_text())
    if server.flavour == "elasticsearch":
        response = server.request("GET", f"/_ilm/policy/{policy}", ok=(404,))
        current = response.json()[policy]["policy"] if response.is_success else None
        return server.put_if_changed("policy", f"{policy} (ILM)", f"/_ilm/policy/{policy}", body, current)
    path = f"/_plugins/_ism/policies/{policy}"
    response = server.request("GET", path, ok=(400, 404, 405))
    if response.status_code in (400, 405) or (
        response.status_code == 404 and "no handler found" in response.text.lower()
    ):
        # A minimal OpenSearch (the local one) has no ISM plugin: retention is then not enforced.
        return Outcome("policy", f"{policy} (ISM)", "skipped", "this OpenSearch has no ISM plugin")
    if not response.is_success:
        server.request("PUT", path, body)
        return Outcome("policy", f"{policy} (ISM)", "created")
    held = response.json()
    if same_ism_policy(held.get("policy", {}), body["policy"]):
        return Outcome("policy", f"{policy} (ISM)", "unchanged")
    server.request("PUT", f"{path}?if_seq_no={held['_seq_no']}&if_primary_term={held['_primary_term']}", body)
    return Outcome("policy", f"{policy} (ISM)", "updated")


def same_ism_policy(held: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """ISM adds ids, versions and timestamps to what it stores; compare what we wrote."""
    keys = ("description", "default_state", "states")
    held_templates = [
        {"index_patterns": t.get("index_patterns"), "priority": t.get("priority")}
        for t in held.get("ism_template") or []
    ]
    return all(held.get(k) == wanted.get(k) for k in keys) and held_templates == wanted.get("ism_template")


def template_body(server: SearchServer, name: str, replicas: int) -> dict[str, Any]:
    body = json.loads((TEMPLATES_DIR / f"{name}.json").read_text())
    index_settings = body["template"]["settings"]["index"]
    index_settings["number_of_replicas"] = replicas
    if server.flavour == "elasticsearch":
        index_settings["lifecycle"] = {"name": TEMPLATES[name]}
    return body


def apply_templates(server: SearchServer) -> list[Outcome]:
    replicas = min(1, server.data_nodes() - 1)  # a replica only where another node can hold it
    outcomes = []
    for name in TEMPLATES:
        body = template_body(server, name, replicas)
        response = server.request("GET", f"/_index_template/{name}", ok=(404,))
        current = None
        if response.is_success:
            held = response.json()["index_templates"][0]["index_template"]
            current = normalise_template(held)
        wanted = normalise_template(body)
        if current == wanted:
            outcome = Outcome("template", name, "unchanged")
        else:
            server.request("PUT", f"/_index_template/{name}", body)
            outcome = Outcome("template", name, "created" if current is None else "updated")
        outcomes.append(outcome)
    return outcomes


def normalise_template(template: dict[str, Any]) -> dict[str, Any]:
    """The server returns settings as strings and drops nothing else we use; compare on that form."""

    def strings(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strings(v) for k, v in value.items()}
        if isinstance(value, list):
            return [strings(v) for v in value]
        return str(value).lower() if isinstance(value, bool | int | float) else value

    settings = strings(template.get("template", {}).get("settings", {}))
    return {
        "index_patterns": template.get("index_patterns"),
        "priority": template.get("priority"),
        "_meta": template.get("_meta"),
        "settings": settings,
        "mappings": template.get("template", {}).get("mappings"),
    }


def apply_search(url: str) -> list[Outcome]:
    server = SearchServer(url)
    return [*apply_pipelines(server), *apply_policies(server), *apply_templates(server)]


def apply_all(
    bootstrap: str | None, search_url: str | None, kafka_client: dict[str, str] | None = None
) -> list[Outcome]:
    """Topics (and, on a secured broker, i.e. with kafka_client's credentials, the ACLs), then the
    search side."""
    outcomes: list[Outcome] = []
    if bootstrap:
        outcomes += apply_topics(bootstrap, client=kafka_client)
        if kafka_client and kafka_client.get("security.protocol", "PLAINTEXT") != "PLAINTEXT":
            outcomes += apply_acls(bootstrap, kafka_client)
    if search_url:
        outcomes += apply_search(search_url)
    return outcomes
