"""Lead time of the early warning: for each component the twin degrades until it fails, how long before
its failure ComponentFailureForecast first fired for it (the failure is the fault's end in the truth:
twin/precursor_faults.py, and the fabric's ib_degrading_link).

Its own module: the other kinds are scored on the delay after their onset (alert_scoring.py); a
precursor is scored on the time left before its end, and only by the warning that names its component.
"""

from __future__ import annotations

from dataclasses import dataclass

from twin.truth import Fault

from .firings import Episode

WARNING_ALERT = "ComponentFailureForecast"
# The component label the warning gives each degrading kind.
COMPONENT_OF_KIND = {"nvlink_degrading": "nvlink", "hbm_degrading": "hbm", "ib_degrading_link": "ib"}
TARGET_LEAD_S = 24 * 3600.0  # the target: a warning at least a day before the failure


@dataclass(frozen=True)
class Lead:
    fault: str
    kind: str
    node: str | None
    lead_s: float | None  # None: no warning before the failure


def names_component(episode: Episode, fault: Fault) -> bool:
    """The warning is about this fault's part: its node, component, and GPU or port where it names one."""
    labels = episode.labels
    if episode.alertname != WARNING_ALERT or labels.get("node") != fault.node:
        return False
    if labels.get("component") != COMPONENT_OF_KIND[fault.kind]:
        return False
    if fault.gpu is not None and labels.get("gpu") not in (None, str(fault.gpu)):
        return False
    port = fault.target.get("port")
    return port is None or labels.get("device") in (None, str(port))


def lead_times(faults: list[Fault], episodes: list[Episode]) -> list[Lead]:
    """Per degrading component: failure time minus the first warning that started before it."""
    leads = []
    for fault in faults:
        if fault.benign or fault.kind not in COMPONENT_OF_KIND:
            continue
        starts = [
            e.start for e in episodes if names_component(e, fault) and fault.onset <= e.start <= fault.end
        ]
        lead = fault.end - min(starts) if starts else None
        leads.append(Lead(fault.id, fault.kind, fault.node, lead))
    return leads


def warned_in_time(leads: list[float | None], target_s: float = TARGET_LEAD_S) -> int:
    """How many components were warned about at least ``target_s`` before they failed."""
    return sum(1 for lead in leads if lead is not None and lead >= target_s)
