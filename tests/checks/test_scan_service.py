"""The checks service's scan coverage as a process: a pass's report (POST /v1/scans) and the results of
the scan's check give each node's last completed scan, its due date and why it waits, on GET /v1/scans,
on /metrics and in `fleetsight checks scan-plan`; an unknown does not count as a scan; everything is kept
over a restart. And one pass's side against the real service (checks/scan_cycle.py): what it reads,
what the plan starts, what it reports back."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml
from test_service import FLEETSIGHT, READ_TOKEN, WRITE_TOKEN, WRITER, serve

from checks.plan import plan
from checks.scan_cycle import plan_scans, post_reports
from support import stopping

CHECK = "dcgm_diag_r4"
DAY = 86400.0
LABELS = 'check="dcgm_diag_r4",cluster="test",node="{}",scan="memory"'


def policy_file(folder: Path) -> Path:
    (folder / "state").mkdir()
    path = folder / "policy.yml"
    scans = {"memory": {"check": CHECK, "every_days": 1, "rescan_after_days": 0.5, "budget": 1}}
    path.write_text(yaml.safe_dump({"after": {}, "default": [], "scans": scans}))
    return path


def result(node: str, finished: float, outcome: str, **extra: str) -> dict:
    return {
        "node": node,
        "check": CHECK,
        "outcome": outcome,
        "summary": outcome,
        "finished": finished,
        **extra,
    }


def metric(page: str, name: str, labels: str) -> float | None:
    for line in page.splitlines():
        if line.startswith(f"{name}{{{labels}}} "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_coverage_overdue_and_why_survive_a_restart(tmp_path: Path) -> None:
    now = time.time()
    policy = policy_file(tmp_path)
    process, url = serve(tmp_path / "state", "--policy", str(policy))
    nodes = {
        "n1": {"state": "not_idle", "why": "not idle: n1"},
        "n2": {"state": "started", "why": "scan started"},
        "n3": {"state": "leaf_busy", "why": "leaf busy: leaf-a"},
    }
    with stopping(process):
        assert httpx.post(
            f"{url}/v1/scans", json={"scan": "memory", "nodes": nodes}, headers=WRITER
        ).json() == {"recorded": 3}
        results = [
            result("n1", now - 2 * DAY, "passed"),  # past its 1-day due date
            result("n2", now - 3600, "failed"),  # a failed scan looked at the memory: it counts
            result("n2", now - 60, "unknown", reason="tool_missing"),  # a later unknown does not
        ]
        httpx.post(f"{url}/v1/results", json=results, headers=WRITER).raise_for_status()
        for bad, why in (
            ({"scan": "cpu", "nodes": {}}, "unknown scan 'cpu'; scans are memory"),
            (
                {"scan": "memory", "nodes": {"n1": {"state": "bored"}}},
                "node n1: state 'bored' must be one of",
            ),
            ({"nodes": {}}, "the body must be {scan, nodes"),
        ):
            response = httpx.post(f"{url}/v1/scans", json=bad, headers=WRITER)
            assert response.status_code == 422 and why in response.json()["detail"], response.text
        reader = {"Authorization": f"Bearer {READ_TOKEN}"}
        assert (
            httpx.post(f"{url}/v1/scans", json={"scan": "memory", "nodes": {}}, headers=reader).status_code
            == 403
        )
        before = check_coverage(url, now)
    process, url = serve(tmp_path / "state", "--policy", str(policy))
    with stopping(process):
        assert check_coverage(url, now) == before  # the same view, from scans.json
        done = subprocess.run(
            [*FLEETSIGHT, "checks", "scan-plan", "--checks-url", url],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0].startswith("scan memory: dcgm_diag_r4 every 1 days") and "1 overdue" in lines[0]
        assert "coverage 33.3 % (1 of 3 nodes)" in lines[0]
        assert lines[2].startswith("n1 ") and "OVERDUE" in lines[2] and lines[2].endswith("not idle: n1")
        n2 = next(line for line in lines if line.startswith("n2 "))
        assert " failed " in n2 and "tool_missing" in n2  # held back: its last try could not run dcgmi
        wrong = subprocess.run(
            [*FLEETSIGHT, "checks", "scan-plan", "--checks-url", url, "--scan", "cpu"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert wrong.returncode == 1 and "no scan 'cpu'; scans: memory" in wrong.stderr


def check_coverage(url: str, now: float) -> dict:
    [view] = httpx.get(f"{url}/v1/scans").json()["scans"]
    rows = {r["node"]: r for r in view["rows"]}
    assert (view["nodes"], view["covered"], view["overdue"]) == (3, 1, ["n1"])
    assert rows["n2"]["last_completed"] == now - 3600 and rows["n2"]["outcome"] == "failed"
    assert rows["n2"]["state"] == "tool_missing" and rows["n2"]["unknown_reason"] == "tool_missing"
    assert rows["n3"]["last_completed"] is None and rows["n3"]["overdue"] is False  # its clock started now
    assert rows["n1"]["due"] == now - DAY
    page = httpx.get(f"{url}/metrics").text
    assert metric(
        page, "fleetsight_scan_coverage_ratio", 'check="dcgm_diag_r4",cluster="test",scan="memory"'
    ) == (1 / 3)
    assert (
        metric(page, "fleetsight_scan_overdue_nodes", 'check="dcgm_diag_r4",cluster="test",scan="memory"')
        == 1
    )
    assert metric(page, "fleetsight_scan_last_completed_timestamp_seconds", LABELS.format("n2")) == now - 3600
    assert metric(page, "fleetsight_scan_last_completed_timestamp_seconds", LABELS.format("n3")) is None
    assert metric(page, "fleetsight_scan_due_timestamp_seconds", LABELS.format("n1")) == now - DAY
    why = 'check="dcgm_diag_r4",cluster="test",node="n1",scan="memory",why="not_idle"'
    assert metric(page, "fleetsight_scan_waiting_info", why) == 1
    return view


def test_a_pass_offers_the_oldest_idle_node_and_reports_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = time.time()
    process, url = serve(tmp_path / "state", "--policy", str(policy_file(tmp_path)))
    env = {"FLEETSIGHT_CHECKS_TOKEN": WRITE_TOKEN}
    with stopping(process):
        old = [result("a", now - 0.9 * DAY, "passed"), result("b", now - 0.7 * DAY, "passed")]
        old.append(result("c", now - 0.1 * DAY, "passed"))
        httpx.post(f"{url}/v1/results", json=old, headers=WRITER).raise_for_status()
        os.environ.update(env)
        try:
            scans = plan_scans(True, url, ["a", "b", "c", "d"], running=[], now=now)
            assert [u.nodes[0] for u in scans.units] == ["d", "a", "b"]  # never scanned, then the oldest
            assert scans.caps == {CHECK: 1}
            decision = plan(scans.units, {"a", "b", "c"}, [], {}, budget=4, caps=scans.caps)
            reports = post_reports(url, scans, decision)
        finally:
            for key in env:
                os.environ.pop(key, None)
        states = {node: row["state"] for node, row in reports["memory"].items()}
        assert states == {"a": "started", "b": "scan_budget", "c": "not_due", "d": "not_idle"}
        rows = {r["node"]: r for r in httpx.get(f"{url}/v1/scans").json()["scans"][0]["rows"]}
        assert {n: r["state"] for n, r in rows.items()} == states
        assert rows["d"]["why"] == "not idle: d"
        # a pass without the results token (a closed service) still runs its jobs: the report is logged
        os.environ.pop("FLEETSIGHT_CHECKS_TOKEN", None)
        assert post_reports(url, scans, decision) == reports
        assert "event=scan_report_not_posted scan=memory" in caplog.text and "401" in caplog.text
        assert plan_scans(True, "http://127.0.0.1:1", ["a"], running=[]).units == []  # no service: no scans
        assert "event=scan_plans_unreadable" in caplog.text
