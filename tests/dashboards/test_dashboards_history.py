"""Every panel's query over the twin's backfilled mixed day (a slice of it: the whole day is
bench/dashboards_history.py), on a real Prometheus serving the blocks."""

from __future__ import annotations

from pathlib import Path

import pytest

from dashboards import catalog
from dashboards.history import check_history, why_empty
from fleetsight.settings import REPO_ROOT

MIXED_DAY = REPO_ROOT / "twin" / "scenarios" / "mixed_day.yaml"


@pytest.mark.stack
def test_every_panel_returns_data_on_the_backfilled_mixed_day(tmp_path: Path) -> None:
    # Five minutes of the 64-node day, the node agents scraped every minute: every rate() window of
    # the panels holds at least two samples, and the check costs well under a minute.
    check = check_history(MIXED_DAY, duration="5m", agent_step="60s", work_root=tmp_path)
    refused = [(r.panel, r.error) for r in check.results if r.error]
    assert not refused
    assert check.variables.get("hpc_job") and check.variables.get("node"), check.variables
    # An empty panel must have a reason: a live-only series (alerts, straggler flags, health states),
    # a fault filter, or a counter that appears with its first event.
    assert not check.unexplained(), check.unexplained()
    # The panels over series that always exist do show data, whatever the reasons above say.
    always = {
        (spec.uid, panel.title)
        for spec in catalog.DASHBOARDS
        for panel in spec.panels()
        if all(q.datasource == catalog.PROMETHEUS and not why_empty(panel, q.expr) for q in panel.queries)
    }
    assert always and not always & set(check.empty_panels()), always & set(check.empty_panels())
