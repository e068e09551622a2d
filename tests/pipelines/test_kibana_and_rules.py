"""Kibana saved objects (ndjson) and ElastAlert2 rules: well formed, their references resolve, their
fields exist in the index templates, and their queries run on the real OpenSearch."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from logs_helpers import LogStack

from alerting.log_alerts import RULES_DIR, venv_bin
from pipelines.apply import TEMPLATES_DIR
from pipelines.kibana import SAVED_OBJECTS, saved_objects

REPO = Path(__file__).resolve().parents[2]
RUNBOOKS = REPO / "docs" / "runbooks"


def mapped_fields() -> set[str]:
    fields: set[str] = set()

    def walk(properties: dict[str, Any], prefix: str) -> None:
        for name, spec in properties.items():
            fields.add(prefix + name)
            for sub in spec.get("fields", {}):
                fields.add(f"{prefix}{name}.{sub}")
            walk(spec.get("properties", {}), f"{prefix}{name}.")

    for template in TEMPLATES_DIR.glob("*.json"):
        walk(json.loads(template.read_text())["template"]["mappings"]["properties"], "")
    return fields


def test_every_saved_object_is_well_formed_and_its_references_resolve() -> None:
    objects = saved_objects()
    ids = {(o["type"], o["id"]) for o in objects}
    assert len(ids) == len(objects), "duplicate ids"
    kinds = {o["type"] for o in objects}
    assert {"index-pattern", "search", "dashboard"} <= kinds
    for obj in objects:
        assert obj["attributes"]["title"], obj["id"]
        for reference in obj["references"]:
            assert (reference["type"], reference["id"]) in ids, f"{obj['id']} -> {reference}"
        meta = obj["attributes"].get("kibanaSavedObjectMeta")
        if meta:
            source = json.loads(meta["searchSourceJSON"])
            if "indexRefName" in source:
                assert source["indexRefName"] in {r["name"] for r in obj["references"]}
    dashboard = next(o for o in objects if o["type"] == "dashboard")
    panels = json.loads(dashboard["attributes"]["panelsJSON"])
    assert {p["panelRefName"] for p in panels} == {r["name"] for r in dashboard["references"]}
    titles = {o["attributes"]["title"] for o in objects}
    assert {"Xids in the last 24 h by node", "Errors of job X"} <= titles


def test_saved_searches_name_mapped_fields_and_their_queries_run(log_stack: LogStack) -> None:
    fields = mapped_fields()
    for obj in saved_objects():
        if obj["type"] == "index-pattern":
            assert obj["attributes"]["timeFieldName"] in fields
            continue
        if obj["type"] == "visualization":
            state = json.loads(obj["attributes"]["visState"])
            for agg in state["aggs"]:
                assert agg["params"].get("field", "host.name") in fields, agg
        if obj["type"] not in ("search", "visualization"):
            continue
        for column in obj["attributes"].get("columns", []):
            assert column in fields, f"{obj['id']}: column {column} is not mapped"
        query = json.loads(obj["attributes"]["kibanaSavedObjectMeta"]["searchSourceJSON"])["query"]
        assert query["language"] == "lucene"
        response = httpx.post(
            f"{log_stack.search_url}/fleetsight-logs-*/_search?allow_no_indices=true",
            json={"size": 0, "query": {"query_string": {"query": query["query"]}}},
            timeout=30,
        )
        assert response.status_code == 200, f"{obj['id']}: {response.text[:300]}"


def test_the_xid_saved_search_finds_the_twins_xid(log_stack: LogStack) -> None:
    xids = next(o for o in saved_objects() if o["id"] == "fleetsight-xids-by-node")
    query = json.loads(xids["attributes"]["kibanaSavedObjectMeta"]["searchSourceJSON"])["query"]["query"]

    def hits() -> int:
        httpx.post(f"{log_stack.search_url}/fleetsight-logs-*/_refresh", timeout=30)
        body = {"query": {"bool": {"must": [{"query_string": {"query": query}}]}}}
        response = httpx.post(f"{log_stack.search_url}/fleetsight-logs-*/_count", json=body, timeout=30)
        return response.json().get("count", 0)

    from support import wait_until

    wait_until(hits, timeout=240, interval=2, what="the twin's Xid through the saved search's query")


def rules() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, yaml.safe_load(path.read_text())) for path in sorted(RULES_DIR.glob("*.yaml"))]


@pytest.mark.parametrize("path", sorted(RULES_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_each_rule_posts_to_alertmanager_with_a_runbook(path: Path) -> None:
    rule = yaml.safe_load(path.read_text())
    name = rule["name"]
    assert rule["alert"] == ["alertmanager"] and rule["alertmanager_api_version"] == "v2"
    assert rule["alertmanager_alertname"] == name
    assert rule["alertmanager_labels"]["severity"] in {"critical", "warning", "info"}
    assert rule["alertmanager_labels"]["team"] in {"sre", "researcher", "facilities"}
    assert rule["alertmanager_annotations"]["runbook_url"] == f"docs/runbooks/{name}.md"
    page = RUNBOOKS / f"{name}.md"
    assert page.read_text().startswith(f"# {name}\n")
    assert f"[{name}.md]({name}.md)" in (RUNBOOKS / "README.md").read_text()
    fields = mapped_fields()
    for term in rule.get("alertmanager_fields", {}).values():
        assert term in fields, f"{name}: {term} is not a mapped field"
    for condition in rule["filter"]:
        ((field, _value),) = condition["term"].items()
        assert field in fields


def test_elastalert_accepts_every_rule(log_stack: LogStack) -> None:
    """ElastAlert2's own rule loader and a dry run against the real OpenSearch."""
    config = log_stack.settings.config_dir("elastalert") / "config.yaml"
    for path in sorted((log_stack.settings.config_dir("elastalert") / "rules").glob("*.yaml")):
        result = subprocess.run(
            [str(venv_bin(log_stack.settings, "elastalert-test-rule")), "--config", str(config),
             "--days", "1", str(path)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        output = result.stdout + result.stderr
        assert result.returncode == 0 and "Error" not in output.split("Would have written")[0], output[-2000:]
    assert SAVED_OBJECTS.is_file()
