"""The dashboards through a real Grafana (the 10.0.0-preview server `fleetsight setup` builds), provisioned
from the repository's files, over the twin's backfilled history: every target runs through Grafana's
/api/ds/query. One backfill and one Prometheus serve both the provisioned dashboards and a broken copy."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from dashboards import build, catalog, grafana, grafana_verify
from dashboards.cli import cli
from evaluation.dashboards import ANOMALY_ONLY, EVENT_COUNTERS, LIVE_ONLY, check_history, why_empty
from fleetsight.settings import REPO_ROOT, Settings
from tests.support import free_port_base

MIXED_DAY = REPO_ROOT / "twin" / "scenarios" / "mixed_day.yaml"
# Series a backfill cannot hold (live services, first events, the offline detector when not run).
ABSENT_HERE = re.compile("|".join(p.pattern for p in (LIVE_ONLY, EVENT_COUNTERS, ANOMALY_ONLY)))
NO_LOGS = "http://127.0.0.1:1"  # no log pipeline here: the logs datasource is declared offline
BROKEN = "fleetsight-node"
WRONG_METRIC, WRONG_UID, BAD_SYNTAX = range(3)


@dataclass
class Run:
    checks: list[grafana_verify.DashboardCheck]
    broken_exit: int
    broken_output: str
    broken_titles: list[str]
    direct_data: set[tuple[str, str]]  # panels with data when their PromQL runs on Prometheus itself


def break_node_dashboard(folder: Path) -> list[str]:
    """Copies of the committed dashboards, three panels of one broken; the broken panels' titles."""
    for spec in catalog.DASHBOARDS:
        (folder / build.path_of(spec).name).write_text(build.path_of(spec).read_text())
    path = folder / "node.json"
    dashboard = json.loads(path.read_text())
    panels = [p for p in dashboard["panels"] if p.get("type") != "row" and p.get("targets")][:3]
    target = panels[WRONG_METRIC]["targets"][0]
    target["expr"] = 'fleetsight_no_such_metric_total{node="$node"}'
    for part in [panels[WRONG_UID], *panels[WRONG_UID]["targets"]]:
        part["datasource"] = {"type": "prometheus", "uid": "no-such-datasource"}
    panels[BAD_SYNTAX]["targets"][0]["expr"] = "sum(rate(DCGM_FI_DEV_POWER_USAGE[5m])"
    path.write_text(json.dumps(dashboard, indent=2))
    return [panel["title"] for panel in panels]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    settings = Settings()
    work = tmp_path_factory.mktemp("grafana")
    found: dict[str, object] = {}

    def through_grafana(prometheus: str, start: float, end: float, _truth: Path) -> None:
        port = free_port_base() + 145
        options = {"offline": ("logs",), "min_interval": "60s", "absent_ok": ABSENT_HERE}
        with grafana.running(settings, port, work / "good", prometheus, NO_LOGS) as url:
            found["checks"] = grafana_verify.verify(url, start, end, **options)
        broken = work / "broken-dashboards"
        broken.mkdir()
        found["titles"] = break_node_dashboard(broken)
        with grafana.running(settings, port, work / "broken", prometheus, NO_LOGS, broken) as url:
            command = ["verify", "--grafana", url, "--at", f"{end:.0f}", "--window", f"{end - start:.0f}"]
            command += ["--offline-datasource", "logs", "--min-interval", "60s"]
            result = CliRunner().invoke(cli, [*command, "--may-be-absent", ABSENT_HERE.pattern])
            found["exit"], found["output"] = result.exit_code, result.output

    history = check_history(MIXED_DAY, "5m", "60s", work, stragglers=False, also=through_grafana)
    direct = {(r.dashboard, r.panel) for r in history.results if r.series > 0}
    return Run(found["checks"], found["exit"], found["output"], found["titles"], direct)  # type: ignore[arg-type]


@pytest.mark.stack
def test_grafana_serves_every_dashboard_in_its_persona_folder_and_runs_every_panel(run: Run) -> None:
    print(grafana_verify.table(run.checks))
    assert [check.uid for check in run.checks] == [spec.uid for spec in catalog.DASHBOARDS]
    failed = [(c.uid, c.problems, [(p.panel, p.errors) for p in c.panels if p.errors]) for c in run.checks]
    assert not [f for f in failed if f[1] or f[2]], failed
    for spec, check in zip(catalog.DASHBOARDS, run.checks, strict=True):
        assert len(check.panels) == len(spec.panels())
    # Grafana's query path shows data wherever the PromQL run on Prometheus itself always does.
    grafana_data = {(c.uid, p.panel) for c in run.checks for p in c.panels if p.with_data}
    always = {
        (spec.uid, panel.title)
        for spec in catalog.DASHBOARDS
        for panel in spec.panels()
        if all(q.datasource == catalog.PROMETHEUS and not why_empty(panel, q.expr) for q in panel.queries)
    }
    assert always & run.direct_data <= grafana_data, sorted(always & run.direct_data - grafana_data)
    # Every empty panel carries its reason.
    assert all(p.empty_reasons for c in run.checks for p in c.panels if p.status == "empty")


@pytest.mark.stack
def test_a_broken_panel_fails_naming_dashboard_and_panel(run: Run) -> None:
    print(run.broken_output)
    assert run.broken_exit == 1, run.broken_output
    errors = [line for line in run.broken_output.splitlines() if line.startswith("ERROR ")]
    wrong_metric, wrong_uid, bad_syntax = (f"ERROR {BROKEN} / {title}: " for title in run.broken_titles)
    assert any(e.startswith(wrong_metric) and "fleetsight_no_such_metric_total" in e for e in errors), errors
    assert any(e.startswith(wrong_uid) for e in errors), errors
    assert any(e.startswith(bad_syntax) and "parse error" in e for e in errors), errors
    # The copy differs from the committed file, and nothing else is reported broken.
    assert f"ERROR {BROKEN}: the stored JSON differs from the committed file" in errors
    assert all(e.startswith(f"ERROR {BROKEN}") for e in errors), errors
