"""`fleetsight logs apply` creates topics, pipelines, templates (and policies where the server has a
lifecycle plugin) and is idempotent: a second run changes nothing."""

from __future__ import annotations

import json
import subprocess

import httpx
from confluent_kafka.admin import AdminClient, ConfigResource
from logs_helpers import LogStack

from pipelines.apply import POLICIES_DIR, TEMPLATES
from pipelines.logclasses import LOG_CLASSES, topic_specs
from support import FLEETSIGHT, REPO_ROOT


def apply(stack: LogStack) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*FLEETSIGHT, "logs", "apply"],
        env=stack.env(),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_apply_twice_changes_nothing_the_second_time(log_stack: LogStack) -> None:
    apply(log_stack)  # the shipper applied at start; this one may update nothing either
    second = apply(log_stack).stdout
    for log_class in LOG_CLASSES:
        assert f"{log_class.topic}" in second
    rows = [line for line in second.splitlines() if line.startswith("│")]
    statuses = {line.split("│")[3].strip() for line in rows} - {""}  # "" = a wrapped detail line
    assert statuses <= {"unchanged", "skipped"}, second


def test_topics_have_their_partitions_and_configs(log_stack: LogStack) -> None:
    admin = AdminClient(log_stack.kafka())
    topics = admin.list_topics(timeout=10).topics
    for topic, spec in topic_specs().items():
        assert topic in topics, topic
        assert len(topics[topic].partitions) == spec["partitions"]
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        config = admin.describe_configs([resource])[resource].result(30)
        assert config["retention.ms"].value == spec["config"]["retention.ms"]
        assert config["compression.type"].value == "zstd"
    assert "fleetsight-audit" in topics, "the audit/security topic stands apart"


def test_a_drifted_pipeline_is_put_back(log_stack: LogStack) -> None:
    pipeline = LOG_CLASSES[0].pipeline_id
    response = httpx.put(
        f"{log_stack.search_url}/_ingest/pipeline/{pipeline}",
        json={"processors": [{"set": {"field": "x", "value": 1}}]},
    )
    assert response.status_code == 200
    output = apply(log_stack).stdout
    assert any(pipeline in line and "updated" in line for line in output.splitlines()), output
    held = httpx.get(f"{log_stack.search_url}/_ingest/pipeline/{pipeline}").json()[pipeline]
    assert held == LOG_CLASSES[0].pipeline_body()


def test_templates_map_the_fields_explicitly(log_stack: LogStack) -> None:
    for name in TEMPLATES:
        held = httpx.get(f"{log_stack.search_url}/_index_template/{name}").json()["index_templates"][0]
        properties = held["index_template"]["template"]["mappings"]["properties"]
        assert properties["@timestamp"]["type"] == "date"
        assert properties["host"]["properties"]["name"]["type"] == "keyword"
    logs = httpx.get(f"{log_stack.search_url}/_index_template/fleetsight-logs").json()["index_templates"][0]
    xid = logs["index_template"]["template"]["mappings"]["properties"]["nvidia"]["properties"]["xid"][
        "properties"
    ]
    assert xid["code"]["type"] == "integer"
    assert {"code", "pci_bdf", "pid", "process", "message", "category", "action"} <= set(xid)


def test_lifecycle_policies_are_well_formed() -> None:
    """The local OpenSearch has no ISM plugin (apply reports `skipped`); production applies these files,
    so their shape is checked here: hot -> warm (read-only, merged) -> delete, and the ISM template
    attaches each policy to its indices."""
    for policy, pattern in (
        ("fleetsight-logs", "fleetsight-logs-*"),
        ("fleetsight-audit", "fleetsight-audit-*"),
    ):
        ism = json.loads((POLICIES_DIR / f"ism-{policy}.json").read_text())["policy"]
        states = {state["name"]: state for state in ism["states"]}
        assert ism["default_state"] == "hot" and set(states) == {"hot", "warm", "delete"}
        assert states["delete"]["actions"] == [{"delete": {}}]
        assert ism["ism_template"][0]["index_patterns"] == [pattern]
        ilm = json.loads((POLICIES_DIR / f"ilm-{policy}.json").read_text())["policy"]["phases"]
        assert list(ilm) == ["hot", "warm", "delete"]
        # Both engines keep the data equally long.
        delete_after = states["warm"]["transitions"][0]["conditions"]["min_index_age"]
        assert ilm["delete"]["min_age"] == delete_after
