"""The executive report on backfilled twin history: its figures against the failures the scenario
injected at known times, its HTML in a real headless Chromium, its summary through Slack's protocol."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from browser import console_errors, headless_chromium
from evaluation import report as report_truth
from fleetsight.components import http_ok
from fleetsight.settings import REPO_ROOT
from support import FLEETSIGHT, free_port, wait_until
from twin.truth import load_faults

SCENARIO = Path(__file__).with_name("report_scenario.yaml")
# An NVSwitch fatal error and a slow OST, with the node agents: what only their series show.
AGENT_SCENARIO = Path(__file__).with_name("report_agents_scenario.yaml")
CATEGORY = {"psu_failure": "power", "xid": "gpu", "hbm_row_remap": "gpu", "host_crash": "host",
            "thermal_throttle": "gpu"}  # fmt: skip
SLACK_SINK = REPO_ROOT / "alerting" / "slack_sink.py"


@dataclass
class History:
    prometheus: str
    start: float
    end: float
    faults: list[dict]
    nodes: int
    truth: Path


def seconds(value: str) -> int:
    return int(value[:-1]) * {"s": 1, "m": 60, "h": 3600}[value[-1]]


@contextmanager
def served_backfill(scenario_path: Path, folder: Path, *options: str) -> Iterator[History]:
    """The scenario backfilled so that it ends now, in a real Prometheus."""
    scenario = yaml.safe_load(scenario_path.read_text())
    end = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    tsdb = str(folder / "tsdb")
    backfill = ["evaluate", "backfill", "--scenario", str(scenario_path), "--out", tsdb, *options]
    subprocess.run(
        [*FLEETSIGHT, *backfill, "--end", end.isoformat()], check=True, capture_output=True, timeout=600
    )
    (folder / "prometheus.yml").write_text("global: {scrape_interval: 1m}\n")
    port = free_port()
    prometheus = subprocess.Popen(
        ["prometheus", f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'tsdb'}",
         "--storage.tsdb.retention.time=10y", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_ok(f"{url}/-/ready"), what="Prometheus on the backfill")
        span = seconds(scenario["duration"])
        yield History(
            url, end.timestamp() - span, end.timestamp(), scenario["faults"], scenario["cluster"]["nodes"],
            folder / "tsdb.truth.jsonl",
        )  # fmt: skip
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[History]:
    # dcgm-exporter's series only: the report's GPU, power and host figures read those, and running
    # the node agents over 3 hours of 12 nodes would cost minutes of CI.
    with served_backfill(SCENARIO, tmp_path_factory.mktemp("report"), "--no-agents") as served:
        yield served


def run_report(prometheus: str, start: float, end: float, out: Path) -> dict:
    """`fleetsight report` over [start, end] into out; its JSON, with the HTML's path under `_html`."""
    result = subprocess.run(
        [*FLEETSIGHT, "report", "--prometheus", prometheus, "--out", str(out),
         "--from", iso(start), "--to", iso(end)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((out / "report.json").read_text())
    data["_html"] = out / "report.html"
    return data


@pytest.fixture(scope="module")
def report(history: History, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_report(history.prometheus, history.start, history.end, tmp_path_factory.mktemp("out"))


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat()


def figure(report: dict, key: str) -> float | None:
    return next(f["value"] for f in report["figures"] if f["key"] == key)


def test_each_injected_failure_is_one_episode_at_its_time(report: dict, history: History) -> None:
    episodes = report["episodes"]
    for fault in history.faults:
        onset = history.start + seconds(fault["onset"])
        node = fault["target"]["node"]
        mine = [e for e in episodes if e["node"] == node and abs(e["start"] - onset) <= 6 * 60]
        assert mine, f"{fault['kind']} on {node} at +{fault['onset']} not in the report: {episodes}"
        assert {e["category"] for e in mine} == {CATEGORY[fault["kind"]]}
        lasted = sum(e["end"] - e["start"] for e in mine)
        assert abs(lasted - seconds(fault["duration"])) <= 7 * 60, (fault, mine)
    assert len(episodes) <= len(history.faults) + 1, f"failures that were never injected: {episodes}"


def test_kpis_match_the_injected_truth(report: dict, history: History) -> None:
    node_hours = history.nodes * (history.end - history.start) / 3600
    down_hours = sum(seconds(f["duration"]) for f in history.faults) / 3600
    assert figure(report, "availability") == pytest.approx(1 - down_hours / node_hours, abs=0.01)
    assert figure(report, "failures") == len(history.faults)
    assert figure(report, "mtbf_hours") == pytest.approx(node_hours / len(history.faults), rel=0.1)
    assert report["failures_by_category"] == {"gpu": 3, "network": 0, "storage": 0, "host": 1, "power": 1}
    assert report["top_nodes"][0]["node"] == "n0002"  # the 30-minute power brake cost the most
    assert 0 < figure(report, "gpu_utilization") <= 1 and figure(report, "energy_kwh") > 0
    # No history before the scenario: no trend is invented.
    assert all(f["trend"] == "no earlier period to compare" for f in report["figures"])


def test_the_truth_comparison_agrees(report: dict, history: History) -> None:
    """The scorer that puts the report's KPIs next to the twin's truth (docs/dashboards.md quotes it
    on the mixed day) on this scenario: every KPI within its tolerance, each failure found within
    3 minutes of its onset (a crashed host too, not only after Prometheus's 5-minute lookback),
    nothing invented."""
    truth = report_truth.truth_figures(load_faults(history.truth), history.start, history.end, history.nodes)
    assert truth["failures"] == len(history.faults)
    rows = report_truth.comparison(report, truth)
    assert all(ok for *_, ok in rows), report_truth.table(rows)
    assert report_truth.unmatched(report, truth, slack_s=180) == {"missed": [], "extra": []}


def test_an_nvswitch_fatal_error_is_a_gpu_failure_until_the_reboot(tmp_path: Path) -> None:
    """The fatal SXid leaves no dcgm-exporter signal: the node agent's counter opens the episode, the
    reboot (IB counters from zero) closes it. A 20x slower OST is a slowdown, not a failure."""
    with served_backfill(AGENT_SCENARIO, tmp_path, "--agent-step", "60s") as served:
        data = run_report(served.prometheus, served.start, served.end, tmp_path / "out")
    fault = next(f for f in served.faults if f["kind"] == "nvswitch_fatal")
    onset = served.start + seconds(fault["onset"])
    (episode,) = data["episodes"]
    assert (episode["node"], episode["category"]) == (fault["target"]["node"], "gpu")
    assert "NVSwitch" in episode["detail"] and abs(episode["start"] - onset) <= 3 * 60
    assert abs(episode["end"] - episode["start"] - seconds(fault["duration"])) <= 3 * 60
    assert data["failures_by_category"]["storage"] == 0


def test_the_html_renders_in_chromium_without_errors(report: dict) -> None:
    with headless_chromium(1200, 1600) as browser:
        browser.get(report["_html"].as_uri())
        assert "FleetSight: fleet report" in browser.page_source
        images = browser.execute_script(
            "return [...document.images].map(i => i.complete && i.naturalWidth > 0)"
        )
        assert images and all(images)
        assert console_errors(browser) == []
        assert browser.get_screenshot_as_png()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_summary_reaches_slack_through_the_stand_in(history: History, tmp_path: Path) -> None:
    port, record = free_port(), tmp_path / "slack.jsonl"
    command = [sys.executable, "-m", "alerting.slack_sink", "--listen", f"127.0.0.1:{port}", "--record"]
    sink = subprocess.Popen(
        [*command, str(record)], cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/"), what="the Slack stand-in")
        webhook = tmp_path / "webhook"
        webhook.write_text(f"http://127.0.0.1:{port}/services/T0/B0/secret\n")
        result = subprocess.run(
            [*FLEETSIGHT, "report", "--prometheus", history.prometheus, "--out", str(tmp_path / "out"),
             "--from", iso(history.start), "--to", iso(history.end), "--slack-webhook-file", str(webhook)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
        assert "secret" not in result.stdout + result.stderr  # the webhook URL is never printed
        messages = [json.loads(line) for line in record.read_text().splitlines()]
        assert len(messages) == 1 and "Availability" in messages[0]["payload"]["text"]
    finally:
        sink.terminate()
        sink.wait(timeout=10)


def test_a_period_without_data_is_a_clear_error(history: History, tmp_path: Path) -> None:
    result = subprocess.run(
        [*FLEETSIGHT, "report", "--prometheus", history.prometheus, "--out", str(tmp_path),
         "--from", "2001-01-01T00:00:00Z", "--to", "2001-01-02T00:00:00Z"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1 and "no dcgm-exporter series" in result.stderr
    assert not (tmp_path / "report.html").exists()
