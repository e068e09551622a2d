"""Helpers of the metrics-stack tests: what the Slack stand-in received, when the twin's faults began,
the stack's processes, and queries to Prometheus and Thanos."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from alerting.slack_sink import read_records
from fleetsight.procs import pid_alive
from support import StackEnv, wait_until

HERE = Path(__file__).resolve().parent
COMPONENTS_DIR = HERE / "components"
STACK_CLUSTER = "metrics-e2e"  # the stack's one name: not the default, so that a part that ignores it shows
ALERT_SCENARIO = HERE / "alert_faults.yaml"
HISTORY_SCENARIO = HERE / "backfill_history.yaml"
STATUS_IN_TITLE = re.compile(r"^\[(FIRING|RESOLVED)\b", re.IGNORECASE)


@dataclass
class MetricsStack:
    env: StackEnv
    up_output: str
    history: Path
    """TSDB blocks of four hours of twin history, for the sidecar test."""
    frozen_alertmanager_pid: int
    alertmanager_stopped_at: float

    @property
    def run_dir(self) -> Path:
        return self.env.run_dir

    @property
    def twin_out(self) -> Path:
        return self.run_dir / "data" / "e2e-twin"

    @property
    def slack_record(self) -> Path:
        return self.run_dir / "data" / "slack-sink" / "messages.jsonl"

    def url(self, port_name: str) -> str:
        return self.env.url(port_name)


# ------------------------------------------------------------------------------------ Slack messages
@dataclass(frozen=True)
class SlackMessage:
    received_at: float
    channel: str
    title: str
    text: str

    @property
    def status(self) -> str:
        match = STATUS_IN_TITLE.match(self.title)
        if match:
            return match.group(1).lower()
        return "resolved" if "resolved" in self.title.lower() else "firing"

    def names(self, alertname: str, node: str) -> bool:
        return alertname in self.title + self.text and node in self.title + self.text


def slack_messages(record: Path) -> list[SlackMessage]:
    """Every message the stand-in recorded, in arrival order (Slack's attachment format)."""
    messages = []
    for entry in read_records(record):
        payload = entry["payload"]
        attachment = (payload.get("attachments") or [{}])[0]
        title = attachment.get("title") or payload.get("text", "")
        text = attachment.get("text", "") + "\n" + json.dumps(payload)
        messages.append(SlackMessage(entry["received_at"], payload.get("channel", ""), title, text))
    return messages


def about(messages: list[SlackMessage], alertname: str, node: str, status: str) -> list[SlackMessage]:
    return [m for m in messages if m.status == status and m.names(alertname, node)]


def per_channel(messages: list[SlackMessage]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for message in messages:
        counts[message.channel] = counts.get(message.channel, 0) + 1
    return counts


# ------------------------------------------------------------------------------------ twin faults
@dataclass(frozen=True)
class PlannedFault:
    kind: str
    node: str
    onset_unix: float
    end_unix: float


def planned_faults(twin_out: Path, scenario: Path = ALERT_SCENARIO) -> list[PlannedFault]:
    """The scenario's faults in wall-clock time: the twin's start (meta.json) plus each onset."""
    from twin.scenario import parse_duration

    start = json.loads((twin_out / "meta.json").read_text())["start_unix"]
    faults = []
    for spec in yaml.safe_load(scenario.read_text())["faults"]:
        onset = start + parse_duration(spec["onset"], "onset")
        end = onset + parse_duration(spec["duration"], "duration")
        faults.append(PlannedFault(spec["kind"], spec["target"]["node"], onset, end))
    return faults


def fault(twin_out: Path, kind: str, node: str) -> PlannedFault:
    (found,) = [f for f in planned_faults(twin_out) if f.kind == kind and f.node == node]
    return found


# ------------------------------------------------------------------------------------ processes
def component_pid(run_dir: Path, name: str) -> int:
    state = json.loads((run_dir / "state.json").read_text())
    (entry,) = [c for c in state["components"] if c["name"] == name]
    assert entry["pid"] and pid_alive(entry["pid"]), f"{name} is not running: {entry}"
    return entry["pid"]


def component_state(run_dir: Path, name: str) -> dict[str, Any]:
    state = json.loads((run_dir / "state.json").read_text())
    (entry,) = [c for c in state["components"] if c["name"] == name]
    return entry


def freeze(pid: int) -> None:
    """Stop a process where it stands (SIGSTOP): it answers nothing, as a hung or cut-off server; the
    supervisor keeps it (it did not exit), so the outage lasts as long as the test wants."""
    os.kill(pid, signal.SIGSTOP)


def thaw(pid: int) -> None:
    os.kill(pid, signal.SIGCONT)


def kill_for_restart(run_dir: Path, name: str, pid: int, timeout: float = 90) -> int:
    """SIGKILL a (possibly frozen) component and wait until the supervisor has restarted it and it is
    ready again; returns the new pid."""
    os.kill(pid, signal.SIGKILL)

    def restarted() -> int | None:
        entry = component_state(run_dir, name)
        return entry["pid"] if entry["status"] == "ready" and entry["pid"] not in (None, pid) else None

    return wait_until(restarted, timeout=timeout, interval=0.5, what=f"{name} to be restarted and ready")


def drop_blocks(source: Path, tsdb: Path) -> list[str]:
    """Copy TSDB blocks into a live Prometheus's folder: each under a temporary name, then renamed, so
    that Prometheus never loads half a block."""
    ulids = []
    for block in sorted(p.parent for p in source.glob("*/meta.json")):
        partial = tsdb / f"{block.name}.copying"
        shutil.copytree(block, partial)
        partial.rename(tsdb / block.name)
        ulids.append(block.name)
    return ulids


# ------------------------------------------------------------------------------------ queries
def api(url: str, path: str, **params: Any) -> Any:
    response = httpx.get(f"{url}{path}", params=params, timeout=30)
    response.raise_for_status()
    body = response.json()
    assert body["status"] == "success", body
    return body["data"]


def raw_samples(url: str, selector: str, start: float, end: float, **params: Any) -> list[dict[str, Any]]:
    """Every stored sample of the selector in (start, end]: a range-vector query evaluated at end."""
    window = max(1, round(end - start))
    data = api(url, "/api/v1/query", query=f"{selector}[{window}s]", time=f"{end:.3f}", **params)
    assert data["resultType"] == "matrix", data
    return data["result"]


def spacing(timestamps: list[float], interval: float) -> tuple[int, int, float]:
    """(gaps, duplicates, longest step) of consecutive sample timestamps. Where Thanos's penalty
    deduplication switches from a replica that stopped to the other, it skips the other's samples for
    twice the last step (pkg/dedup/iter.go: penalty = 2 x (t - lastT)) and takes the next one: a step
    of up to three intervals, which is not a hole. A gap is a step longer than that (half an interval
    of slack for scrape jitter). A duplicate is a step under half an interval: two samples of one
    scrape kept."""
    steps = [b - a for a, b in itertools.pairwise(timestamps)]
    gaps = sum(1 for step in steps if step > 3.5 * interval)
    duplicates = sum(1 for step in steps if step < 0.5 * interval)
    return gaps, duplicates, max(steps, default=0.0)


def now() -> float:
    return time.time()
