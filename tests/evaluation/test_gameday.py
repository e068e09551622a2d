"""A seeded game day on the real stack (`fleetsight gameday`, evaluation/gameday.py): the twin plays four
hardware faults (a host crash among them) while 13 disruptions hit 13 kinds of FleetSight's own
processes and links in 90 s (OpenSearch and Thanos Query paused, Prometheus A killed, the health pair's
Lease server killed and then its leader, health-a's link to Prometheus cut, ...); real Prometheus pair,
Alertmanager pair, Thanos, Kafka, OpenSearch, rsyslog, the health pair on a real kube-apiserver Lease and
the services. Every invariant must hold: each fault's alert in Slack and acted on, no log line lost or
doubled, no node drained without a fault, no health decision by a non-leader, every component back. The
verdict's own checks (an invariant broken on purpose is caught) are tests/evaluation/test_gameday_verdict.py;
bench/gameday.py runs the hour."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from evaluation.cli_gameday import SCENARIOS
from evaluation.gameday_chaos import plan
from support import FLEETSIGHT, REPO_ROOT, free_port_base

SEED, DURATION_S, MEAN_GAP_S = 175, 90, 15
TIMEOUT_S = 1200  # the stack's start (~2 min here), 90 s of chaos, 2 min of settle, the log ledger, the stop


def test_a_seeded_game_day_keeps_every_invariant() -> None:
    # Not under pytest's tmp folder: that one is 0700, and OpenSearch runs as nobody.
    out = Path(tempfile.mkdtemp(prefix="fleetsight-gameday-test-"))
    out.chmod(0o755)
    command = [
        *FLEETSIGHT, "gameday", "--out", str(out), "--json",
        "--scenario", str(SCENARIOS / "gameday_short.yaml"),
        "--seed", str(SEED), "--duration", f"{DURATION_S}s", "--mean-gap", f"{MEAN_GAP_S}s",
        "--settle", "120s", "--alert-allowance", "150s", "--port-base", str(free_port_base()),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, timeout=TIMEOUT_S)
    print(done.stderr[-4000:])
    assert (out / "report.json").exists(), f"no report (exit {done.returncode}): {done.stderr[-3000:]}"
    report = json.loads((out / "report.json").read_text())
    print((out / "report.md").read_text())

    broken = [f"{i['name']}: {i['evidence']}" for i in report["invariants"] if not i["holds"]]
    assert not broken and report["holds"] and done.returncode == 0, broken
    assert report["problems"] == {}, "components of the stack did not run"

    # The whole plan was carried out on this stack: nothing skipped for lack of a component or a link.
    history = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    skipped = [e for e in history if e["event"] == "skipped"]
    assert not skipped, skipped
    planned = plan(SEED, DURATION_S, MEAN_GAP_S)
    assert report["disruptions"] == len(planned) >= 10
    assert report["component_kinds"] == len({d.kind for d in planned}) >= 10
    assert {d.action for d in planned} >= {"kill", "pause", "restart", "cut"}

    # Every fault of the scenario was due and made the whole journey; the log path carried the twin's lines.
    assert len(report["journeys"]) == 4 and all(j["due"] for j in report["journeys"])
    crashed = next(j for j in report["journeys"] if j["kind"] == "host_crash")
    assert crashed["slack_alert"] == "NodeDown", (
        crashed
    )  # every exporter of the host silent, joined by cluster
    assert all(j["slack_s"] is not None and j["acted_s"] is not None for j in report["journeys"])
    # The health decisions were read (each fault's state change at least) and each checked against the leader.
    assert report["health_decisions"] >= 4
    assert report["logs"]["written"] > 100 and report["logs"]["indexed"] == report["logs"]["written"]
    recovered = sum(row["recovered"] for row in report["recovery"].values())
    process_disruptions = sum(1 for d in planned if d.kind != "link")
    assert recovered == process_disruptions
