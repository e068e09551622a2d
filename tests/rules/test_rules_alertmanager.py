"""alerting/alertmanager.yml: routes by team and severity, inhibitions, and the Slack messages a real
Alertmanager sends to the Slack stand-in (node, GPU, job, value, runbook link; resolved messages)."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from alerting.slack_sink import read_records
from fleetsight.settings import REPO_ROOT
from support import StackEnv, wait_until

CONFIG = REPO_ROOT / "alerting" / "alertmanager.yml"
RUNBOOK_BASE = "https://github.com/fleetsight/fleetsight/blob/main/"

ROUTES = [
    ({"alertname": "NodeDown", "severity": "critical", "team": "sre"}, "slack-critical"),
    (
        {"alertname": "GPUFellOffBus", "severity": "critical", "team": "sre", "hpc_job": "2001"},
        "slack-critical,slack-job",
    ),
    (
        {"alertname": "GPURowRemapPending", "severity": "warning", "team": "sre", "hpc_job": "2001"},
        "slack-default",
    ),
    ({"alertname": "PSUFailed", "severity": "critical", "team": "facilities"}, "slack-facilities"),
    (
        {"alertname": "GPUPowerBrakeActive", "severity": "critical", "team": "facilities", "hpc_job": "7"},
        "slack-facilities,slack-job",
    ),
    ({"alertname": "GPUThermalThrottling", "severity": "warning", "team": "facilities"}, "slack-facilities"),
    (
        {"alertname": "StragglerNode", "severity": "warning", "team": "researcher", "hpc_job": "7"},
        "slack-job",
    ),
    ({"alertname": "SomethingFromLogs", "severity": "critical"}, "slack-critical"),
    # An alert naming a node also reaches the health service's webhook, and Slack exactly as before.
    (
        {"alertname": "NodeDown", "severity": "critical", "team": "sre", "node": "n1"},
        "fleetsight-health,slack-critical",
    ),
    (
        {"alertname": "GPURowRemapPending", "severity": "warning", "team": "sre", "node": "n1"},
        "fleetsight-health,slack-default",
    ),
    (
        {
            "alertname": "GPUPowerBrakeActive",
            "severity": "critical",
            "team": "facilities",
            "hpc_job": "7",
            "node": "n1",
        },
        "fleetsight-health,slack-facilities,slack-job",
    ),
    # A failure forecast is a warning for the SRE channel: never a page, never the job's channel (the
    # health service hears it and only degrades: health/policy.yml).
    (
        {"alertname": "ComponentFailureForecast", "severity": "warning", "team": "sre", "node": "n1"},
        "fleetsight-health,slack-default",
    ),
]


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["amtool", *args], capture_output=True, text=True, timeout=60, check=False)


def test_config_is_valid() -> None:
    result = amtool("check-config", str(CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6 inhibit rules" in result.stdout


@pytest.mark.parametrize(
    ("labels", "receivers"),
    ROUTES,
    ids=[f"{labels['alertname']}-{i}" for i, (labels, _) in enumerate(ROUTES)],
)
def test_routes(labels: dict[str, str], receivers: str) -> None:
    result = amtool(
        "config", "routes", "test", f"--config.file={CONFIG}", *(f"{k}={v}" for k, v in labels.items())
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == receivers


# --------------------------------------------------------------------------- a real Alertmanager


@pytest.mark.parametrize(
    ("common_labels", "channel"),
    [
        ({"hpc_job": "2001"}, "#job-2001"),
        ({"hpc_job": "Team-A/pretrain.v2"}, "#job-team-a-pretrain-v2"),  # a Kubernetes job: ns/name
        ({}, "#fleetsight-researchers"),
    ],
)
def test_the_job_channel_is_a_valid_slack_name(
    common_labels: dict[str, str], channel: str, tmp_path: Path
) -> None:
    """The job receiver's channel, rendered by amtool from the file's own template text."""
    receivers = yaml.safe_load(CONFIG.read_text())["receivers"]
    template = next(r for r in receivers if r["name"] == "slack-job")["slack_configs"][0]["channel"]
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"CommonLabels": common_labels, "Alerts": [], "Status": "firing"}))
    result = amtool(
        "template", "render", f"--template.glob={tmp_path}/none.tmpl", f"--template.text={template}",
        f"--template.data={data}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == channel


def alert(name: str, labels: dict[str, str], summary: str, ends: dt.datetime | None = None) -> dict[str, Any]:
    now = dt.datetime.now(dt.UTC)
    body: dict[str, Any] = {
        "labels": {"alertname": name, "cluster": "test", **labels},
        "annotations": {
            "summary": summary,
            "description": f"{summary} (description)",
            "runbook_url": f"docs/runbooks/{name}.md",
        },
        "startsAt": (now - dt.timedelta(minutes=1)).isoformat(),
    }
    if ends is not None:
        body["endsAt"] = ends.isoformat()
    return body


def messages(stack: StackEnv) -> list[dict[str, Any]]:
    return [
        entry["payload"] for entry in read_records(stack.run_dir / "data" / "slack-sink" / "messages.jsonl")
    ]


def post(stack: StackEnv, alerts: list[dict[str, Any]]) -> None:
    response = httpx.post(stack.url("alertmanager", "/api/v2/alerts"), json=alerts, timeout=10)
    assert response.status_code == 200, response.text


@pytest.mark.stack
def test_slack_messages_inhibition_and_resolution(stack_env: StackEnv) -> None:
    stack_env.cli("up", "alertmanager")
    brake = alert(
        "GPUPowerBrakeActive",
        {"severity": "critical", "team": "facilities", "node": "n0002", "gpu": "3", "hpc_job": "2001"},
        "Power brake on n0002 GPU 3: the GPU is capped at 150 W",
    )
    # Inhibited pairs: the node is down (its thermal alert is noise), the PSU failed (its brake is noise).
    node_down = alert(
        "NodeDown", {"severity": "critical", "team": "sre", "node": "n0005"}, "Node n0005 is down"
    )
    thermal_on_down_node = alert(
        "GPUThermalThrottling",
        {"severity": "warning", "team": "facilities", "node": "n0005", "gpu": "1"},
        "hot",
    )
    psu = alert(
        "PSUFailed",
        {"severity": "critical", "team": "facilities", "node": "n0007", "psu": "PSU3"},
        "PSU3 failed",
    )
    brake_from_psu = alert(
        "GPUPowerBrakeActive",
        {"severity": "critical", "team": "facilities", "node": "n0007", "gpu": "0"},
        "brake",
    )
    # A slow Lustre target (the culprit) and the Lustre errors of its clients (victims), which it holds;
    # a client with errors in a cluster where no target is slow still pages.
    culprit, victims, lone_client = lustre_culprit_and_victims()
    post(stack_env, [node_down, psu, culprit])
    # Let the inhibitors reach Alertmanager first, then the alerts they silence.
    wait_until(lambda: len(messages(stack_env)) >= 3, timeout=60, what="NodeDown, PSUFailed, LustreOSTSlow")
    post(stack_env, [brake, thermal_on_down_node, brake_from_psu, *victims, lone_client])

    def brake_messages() -> list[dict[str, Any]]:
        return [m for m in messages(stack_env) if "GPUPowerBrakeActive" in m["attachments"][0]["title"]]

    found = wait_until(
        lambda: len(brake_messages()) >= 2 and brake_messages(), timeout=60, what="power-brake messages"
    )
    assert sorted(m["channel"] for m in found) == ["#fleetsight-facilities", "#job-2001"]
    text = found[0]["attachments"][0]["text"]
    for expected in (
        "node: `n0002`",
        "gpu: `3`",
        "job: `2001`",
        "150 W",
        RUNBOOK_BASE + "docs/runbooks/GPUPowerBrakeActive.md",
    ):
        assert expected in text, (expected, text)
    assert found[0]["attachments"][0]["color"] == "danger"

    # Resolve the brake: a resolved message reaches the same channels.
    post(stack_env, [{**brake, "endsAt": dt.datetime.now(dt.UTC).isoformat()}])
    resolved = wait_until(
        lambda: [m for m in brake_messages() if m["attachments"][0]["title"].startswith("[RESOLVED")],
        timeout=150,
        what="the resolved message",
    )
    assert (
        "RESOLVED" in resolved[0]["attachments"][0]["text"]
        and resolved[0]["attachments"][0]["color"] == "good"
    )

    everything = json.dumps(messages(stack_env))
    assert "n0005" in everything and '"hot' not in everything, "NodeDown must silence the node's GPU alerts"
    assert not any(
        "n0007" in m["attachments"][0]["text"] and "GPUPowerBrakeActive" in m["attachments"][0]["title"]
        for m in messages(stack_env)
    )
    assert_lustre_victims_held(stack_env)
    # The webhook URL is a secret: never in Alertmanager's log.
    log_text = "".join(
        p.read_text(errors="replace") for p in (stack_env.run_dir / "logs").glob("alertmanager*")
    )
    assert "/services/local/webhook" not in log_text


def lustre_culprit_and_victims() -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    culprit = alert(
        "LustreOSTSlow",
        {"severity": "warning", "team": "sre", "fs": "eos", "component": "osc", "target": "eos-OST0002"},
        "Lustre target eos-OST0002 of eos is slow: 3ms per RPC against 970us for its peers",
    )
    culprit["annotations"]["description"] = (
        "Victims, the client nodes that wait over 2 ms on it: 3 (n0011, n0012, n0013). Their jobs: 2001."
    )
    victims = [
        alert("LustreClientErrors", {"severity": "warning", "team": "sre", "node": node}, f"errors on {node}")
        for node in ("n0011", "n0012", "n0013")
    ]
    lone_client = alert(
        "LustreClientErrors",
        {"severity": "warning", "team": "sre", "node": "n0021", "cluster": "other"},
        "errors on n0021",
    )
    return culprit, victims, lone_client


def assert_lustre_victims_held(stack: StackEnv) -> None:
    """One message for the slow target, naming its victims; none for them (Alertmanager holds them, so
    no receiver, the health service's webhook included, hears of them); the lone client still pages."""

    def titled(word: str) -> list[dict[str, Any]]:
        return [m for m in messages(stack) if word in m["attachments"][0]["title"]]

    wait_until(lambda: titled("LustreClientErrors on n0021"), timeout=60, what="the lone client's message")
    response = httpx.get(
        stack.url("alertmanager", "/api/v2/alerts"), params={"filter": 'alertname="LustreClientErrors"'}
    )
    states = {
        a["labels"]["node"]: (a["status"]["state"], a["status"]["inhibitedBy"]) for a in response.json()
    }
    assert {node: state for node, (state, _) in states.items()} == {
        "n0011": "suppressed",
        "n0012": "suppressed",
        "n0013": "suppressed",
        "n0021": "active",
    }
    assert all(by for node, (_, by) in states.items() if node != "n0021"), states
    culprit = titled("LustreOSTSlow")
    assert len(culprit) == 1, culprit
    assert "target: `eos-OST0002`" in culprit[0]["attachments"][0]["text"]
    assert "n0011, n0012, n0013" in culprit[0]["attachments"][0]["text"]
    assert not [m for m in titled("LustreClientErrors") if "n0021" not in m["attachments"][0]["title"]]
