"""Lead time of the early warning (evaluation/lead_time.py) and its place in the alert scorer: the time
from the first ComponentFailureForecast that names a degrading part to that part's failure (the fault's
end); a warning about another part, another node or after the failure does not count."""

from __future__ import annotations

from typing import Any

from evaluation.alert_scoring import ScenarioResult, as_json, score
from evaluation.firings import Episode
from evaluation.lead_time import lead_times, warned_in_time
from twin.truth import Fault

H = 3600.0


def fault(fid: str, kind: str, node: str, onset_h: float, end_h: float, **target: Any) -> Fault:
    line = {
        "id": fid,
        "kind": kind,
        "target": {"node": node, **target},
        "onset_unix": onset_h * H,
        "end_unix": end_h * H,
        "benign": False,
    }
    return Fault.from_line(line)


def warning(node: str, component: str, start_h: float, end_h: float, **labels: str) -> Episode:
    return Episode(
        "ComponentFailureForecast", {"node": node, "component": component, **labels}, start_h * H, end_h * H
    )


FAULTS = [
    fault("f1", "nvlink_degrading", "n1", 0, 72, gpu=3),
    fault("f2", "hbm_degrading", "n2", 10, 60, gpu=5),
    fault("f3", "ib_degrading_link", "n3", 20, 56, port="mlx5_2"),
    fault("f4", "hbm_degrading", "n4", 0, 48, gpu=0),
]


def test_lead_is_failure_minus_the_first_warning_naming_the_part() -> None:
    episodes = [
        warning("n1", "nvlink", 40, 72, gpu="3"),  # 32 h ahead
        warning("n1", "nvlink", 30, 35, gpu="3"),  # earlier still: 42 h ahead
        warning("n2", "hbm", 50, 60, gpu="5"),  # 10 h ahead
        warning("n2", "hbm", 20, 22, gpu="1"),  # another GPU of the node: not this part
        warning("n3", "ib", 30, 56, device="mlx5_2", port="1"),  # 26 h ahead
        warning("n4", "nvlink", 10, 48, gpu="0"),  # the right GPU, the wrong component
        warning("n4", "hbm", 49, 50, gpu="0"),  # after the failure: no lead
    ]
    leads = {lead.fault: lead.lead_s for lead in lead_times(FAULTS, episodes)}
    assert leads == {"f1": 42 * H, "f2": 10 * H, "f3": 26 * H, "f4": None}
    assert warned_in_time(list(leads.values())) == 2


def test_the_scorer_reports_leads_per_kind_and_counts_warnings_in_time() -> None:
    episodes = [warning("n1", "nvlink", 30, 72, gpu="3"), warning("n9", "pcie", 5, 6, gpu="0")]
    alerts, kinds, false_alerts, _ = score("s", FAULTS, episodes, {"ComponentFailureForecast": True})
    assert kinds["nvlink_degrading"].leads_s == [42 * H]
    assert kinds["hbm_degrading"].leads_s == [None, None]
    assert [a["labels"]["node"] for a in false_alerts] == ["n9"], "a warning on a healthy part is false"
    result = ScenarioResult("s", "", "", 4, [], alerts, kinds, false_alerts, [], 0.0)
    rows = as_json([result])["total"]["kinds"]
    assert rows["nvlink_degrading"]["warned_24h"] == 1 and rows["hbm_degrading"]["warned_24h"] == 0
    assert "warned_24h" not in as_json([result])["total"]["alerts"]["ComponentFailureForecast"]
