"""Every panel's query over the twin's backfilled history (slices of it: the whole mixed day is
bench/dashboards_history.py), on a real Prometheus serving the blocks, with Prometheus's ALERTS and
the straggler flags written from the span's alert episodes and the offline detector."""

from __future__ import annotations

from pathlib import Path

import pytest

from dashboards import catalog, model
from evaluation.dashboards import HistoryCheck, check_history, why_empty
from evaluation.firings import Episode, alerts_series
from fleetsight.settings import REPO_ROOT

MIXED_DAY = REPO_ROOT / "twin" / "scenarios" / "mixed_day.yaml"
# 8 nodes for 20 minutes: a failed PSU (power brake, PSUFailed) and a crashed host (NodeDown).
ALERTS_SCENARIO = Path(__file__).with_name("alerts_scenario.yaml")


def assert_every_panel_explained(check: HistoryCheck) -> None:
    refused = [(r.panel, r.error) for r in check.results if r.error]
    assert not refused
    assert check.variables.get("hpc_job") and check.variables.get("node"), check.variables
    # An empty panel must have a reason: a live-only series (health states, straggler scores), a
    # fault filter, or a counter that appears with its first event.
    assert not check.unexplained(), check.unexplained()
    # The panels over series that always exist do show data, whatever the reasons above say.
    always = {
        (spec.uid, panel.title)
        for spec in catalog.DASHBOARDS
        for panel in spec.panels()
        if all(q.datasource == model.PROMETHEUS and not why_empty(panel, q.expr) for q in panel.queries)
    }
    assert always and not always & set(check.empty_panels()), always & set(check.empty_panels())


@pytest.mark.stack
def test_every_panel_returns_data_on_the_backfilled_mixed_day(tmp_path: Path) -> None:
    # Five minutes of the 64-node day, the node agents scraped every minute: every rate() window of
    # the panels holds at least two samples, and the check costs well under a minute. No alert
    # fires that early, nor does the detector flag (the next test covers both): the offline
    # detector's few seconds are spared.
    check = check_history(MIXED_DAY, "5m", "60s", tmp_path, stragglers=False)
    assert_every_panel_explained(check)


@pytest.mark.stack
def test_alert_panels_show_the_alerts_that_fired_over_the_history(tmp_path: Path) -> None:
    check = check_history(ALERTS_SCENARIO, duration="20m", agent_step="60s", work_root=tmp_path)
    assert_every_panel_explained(check)
    assert check.alert_episodes > 0
    alert_queries = [r for r in check.results if "ALERTS" in r.expr]
    assert alert_queries
    empty = [(r.dashboard, r.panel, r.expr) for r in alert_queries if r.series == 0]
    assert not empty, empty
    # The flags come from the anomaly detector run offline: where it flagged, the panel shows it.
    straggler = [r for r in check.results if "fleetsight_straggler{" in r.expr]
    assert straggler and all(r.series > 0 for r in straggler) == (check.straggler_samples > 0)


def test_alerts_series_are_the_ones_prometheus_writes() -> None:
    # PSUFailed's `for: 30s` at a 15 s interval: two pending evaluations, then firing until the
    # first evaluation without the condition (Episode.end).
    episode = Episode("PSUFailed", {"node": "n1", "psu": "2", "severity": "critical"}, 1030.0, 1090.0)
    series = alerts_series([episode], {"PSUFailed": 30.0}, end=2000.0, step=15.0)
    base = 'alertname="PSUFailed",alertstate="{}",node="n1",psu="2",severity="critical"'
    assert series == {
        "ALERTS{" + base.format("pending") + "}": [1000.0, 1015.0],
        "ALERTS{" + base.format("firing") + "}": [1030.0, 1045.0, 1060.0, 1075.0],
    }
    # The span's end cuts an episode still firing; label values are escaped as OpenMetrics needs.
    quoted = Episode("X", {"summary": 'a "b"\\'}, 1000.0, 1100.0)
    assert alerts_series([quoted], {}, end=1015.0, step=15.0) == {
        'ALERTS{alertname="X",alertstate="firing",summary="a \\"b\\"\\\\"}': [1000.0, 1015.0]
    }
