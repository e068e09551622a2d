"""The alerts' firings scored against the twin's ground truth: which alerts catch which fault kind,
each episode matched to a fault by node and time (caught, missed, false alerts, and the delay from fault
onset to firing), per scenario and summed over scenarios, and the JSON of the results.

Its own module: what an alert is expected to catch, and what counts as caught, is the evaluation's
policy, apart from how the history is served and queried (replay.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fleetsight.xid_catalog import lookup as xid_lookup
from twin.truth import Fault, TruthError, load_faults

from .firings import Episode
from .lead_time import lead_times, warned_in_time
from .replay import EvaluationError, unix_to_iso

# An alert that starts within this long after a fault ends still belongs to it (windows of 10 minutes
# in the rules, and `for:` durations, keep alerts firing a little after the fault).
AFTER_END_GRACE_S = 15 * 60

# Which alerts catch which fault kind (Xid faults depend on their code: see expected_alerts).
EXPECTED_BY_KIND: dict[str, tuple[str, ...]] = {
    "psu_failure": ("PSUFailed", "GPUPowerBrakeActive"),
    "thermal_throttle": ("GPUThermalThrottling",),
    "pcie_downgrade": ("PCIeLinkDowngraded", "PCIeBandwidthDegraded"),
    "ib_link_flap": ("InfiniBandLinkFlapping", "InfiniBandSymbolErrors"),
    "ib_port_down": ("InfiniBandPortDown",),
    "hbm_row_remap": ("GPURowRemapPending",),
    "host_crash": ("NodeDown",),
    "nvswitch_fatal": ("NVSwitchFatal",),
    "lustre_ost_slow": ("LustreOSTSlow", "LustreClientErrors"),
    "gray_slow_node": ("StragglerNode",),
    "loss_spike": (),  # application logs: the log pipeline's alerts, not Prometheus rules
    # The fabric's gray failures (issue 43): a sub-second cut, a downshifted link, a link whose errors
    # climb until it fails (the errors warn, the port's death is the end); congestion is no fault of a
    # link: nothing should fire, and a page during it is a false alert (evaluation/fabric_confusion.py).
    "ib_flash_cut": ("InfiniBandFlashCut",),
    "ib_lane_downshift": ("InfiniBandPortRateDegraded",),
    "ib_degrading_link": ("InfiniBandSymbolErrors", "InfiniBandPortDown"),
    "ib_congestion": (),
    # Parts that announce their failure (issue 43): the early warning is what catches them; the failure
    # at the end raises the kind's own alerts too (Xid 74, Xid 48/63), which match the fault as well.
    "nvlink_degrading": ("ComponentFailureForecast",),
    "hbm_degrading": ("ComponentFailureForecast",),
    # Silent corruption in training (issue 43): only the job's own logs show it; the check names the
    # replica's node where the job logs per-replica lines (`fleetsight anomaly sdc serve`).
    "sdc_training": ("TrainingSilentCorruptionSuspected",),
    # Stragglers with no GPU signature (issue 42): only the job's own step split shows them, read from its
    # training logs by the training watch (`fleetsight anomaly sdc serve`, rules/training.yml).
    "slow_nic": ("TrainingPaceStraggler",),
    "slow_host": ("TrainingPaceStraggler",),
}


def expected_alerts(fault: Fault) -> tuple[str, ...]:
    """The alerts that catch this fault (none for a benign disturbance)."""
    if fault.benign:
        return ()
    if fault.kind != "xid":
        return EXPECTED_BY_KIND.get(fault.kind, ())
    if fault.code == 79:
        return ("GPUFellOffBus",)
    if fault.code == 74:
        return ("GPUNVLinkErrors",)
    if fault.code is not None and xid_lookup(fault.code).action in (
        "reset_gpu",
        "check_hardware",
        "reboot_node",
    ):
        return ("GPUXidUncorrectable", "GPURowRemapPending", "GPURowRemapFailed")
    return ()  # application Xids (13, 31, 43, ...): the job's own error, no hardware alert


@dataclass
class AlertScore:
    alertname: str
    observable: bool
    episodes: int = 0
    true_episodes: int = 0
    false_episodes: int = 0
    faults_caught: int = 0
    delays_s: list[float] = field(default_factory=list)


@dataclass
class KindScore:
    kind: str
    faults: int = 0
    expected: tuple[str, ...] = ()
    caught: int = 0
    missed: int = 0
    not_observable: int = 0
    no_alert_expected: int = 0
    delays_s: list[float] = field(default_factory=list)
    # Degrading parts only (lead_time.py): seconds from the first early warning to the failure, None
    # where no warning came before it.
    leads_s: list[float | None] = field(default_factory=list)


@dataclass
class ScenarioResult:
    scenario: str
    start: str
    end: str
    faults: int
    metrics_present: list[str]
    alerts: dict[str, AlertScore]
    kinds: dict[str, KindScore]
    false_alerts: list[dict[str, Any]]
    missed_faults: list[dict[str, Any]]
    wall_seconds: float
    # Every firing episode with the fault it was matched to (None: a false alert), for scorers that need
    # each episode's time (evaluation/fabric_confusion.py times each flash cut).
    episodes: list[Episode] = field(default_factory=list)


def load_truth(path: Path) -> list[Fault]:
    """The twin's ground truth, typed by the twin's one reader (twin.truth.load_faults)."""
    try:
        return load_faults(path)
    except TruthError as exc:
        raise EvaluationError(f"not a truth file the scorer understands: {exc}") from exc


def matches(episode: Episode, fault: Fault) -> bool:
    if fault.node is not None and episode.labels.get("node") not in (None, fault.node):
        return False
    if fault.node is not None and "node" not in episode.labels:
        return False
    return episode.start <= fault.end + AFTER_END_GRACE_S and episode.end >= fault.onset


def score(
    scenario: str,
    faults: list[Fault],
    episodes: list[Episode],
    observable: dict[str, bool],
) -> tuple[dict[str, AlertScore], dict[str, KindScore], list[dict[str, Any]], list[dict[str, Any]]]:
    alerts = {name: AlertScore(name, observable[name]) for name in observable}
    kinds: dict[str, KindScore] = {}
    false_alerts: list[dict[str, Any]] = []
    missed: list[dict[str, Any]] = []
    for episode in episodes:
        alerts[episode.alertname].episodes += 1
        fault = next((f for f in faults if not f.benign and matches(episode, f)), None)
        if fault is None:
            alerts[episode.alertname].false_episodes += 1
            false_alerts.append(
                {
                    "scenario": scenario,
                    "alertname": episode.alertname,
                    "labels": episode.labels,
                    "start": unix_to_iso(episode.start),
                    "end": unix_to_iso(episode.end),
                }
            )
        else:
            episode.fault = fault.id
            alerts[episode.alertname].true_episodes += 1
    for fault in faults:
        if fault.benign:
            continue
        kind = kinds.setdefault(fault.kind, KindScore(fault.kind))
        kind.faults += 1
        expected = expected_alerts(fault)
        kind.expected = tuple(dict.fromkeys((*kind.expected, *expected)))
        if not expected:
            kind.no_alert_expected += 1
            continue
        hits = [e for e in episodes if e.fault == fault.id and e.alertname in expected]
        if hits:
            kind.caught += 1
            delay = min(e.start for e in hits) - fault.onset
            kind.delays_s.append(max(0.0, delay))
            for name in {e.alertname for e in hits}:
                alerts[name].faults_caught += 1
                alerts[name].delays_s.append(
                    max(0.0, min(e.start for e in hits if e.alertname == name) - fault.onset)
                )
        elif not any(observable.get(name, False) for name in expected):
            kind.not_observable += 1
        else:
            kind.missed += 1
            missed.append(
                {
                    "scenario": scenario,
                    "fault": fault.id,
                    "kind": fault.kind,
                    "node": fault.node,
                    "onset": unix_to_iso(fault.onset),
                    "expected": list(expected),
                }
            )
    for lead in lead_times(faults, episodes):
        kinds.setdefault(lead.kind, KindScore(lead.kind)).leads_s.append(lead.lead_s)
    return alerts, kinds, false_alerts, missed


# ------------------------------------------------------------------------------------- summaries


def merge(results: list[ScenarioResult]) -> tuple[dict[str, AlertScore], dict[str, KindScore]]:
    alerts: dict[str, AlertScore] = {}
    kinds: dict[str, KindScore] = {}
    for result in results:
        for name, a in result.alerts.items():
            total = alerts.setdefault(name, AlertScore(name, False))
            total.observable = total.observable or a.observable
            total.episodes += a.episodes
            total.true_episodes += a.true_episodes
            total.false_episodes += a.false_episodes
            total.faults_caught += a.faults_caught
            total.delays_s += a.delays_s
        for name, k in result.kinds.items():
            total_k = kinds.setdefault(name, KindScore(name))
            total_k.faults += k.faults
            total_k.expected = tuple(dict.fromkeys((*total_k.expected, *k.expected)))
            total_k.caught += k.caught
            total_k.missed += k.missed
            total_k.not_observable += k.not_observable
            total_k.no_alert_expected += k.no_alert_expected
            total_k.delays_s += k.delays_s
            total_k.leads_s += k.leads_s
    return alerts, kinds


def median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def as_json(results: list[ScenarioResult]) -> dict[str, Any]:
    alerts, kinds = merge(results)

    def alert_row(a: AlertScore) -> dict[str, Any]:
        return {
            **asdict(a),
            "median_delay_s": median(a.delays_s),
            "max_delay_s": max(a.delays_s, default=None),
        }

    def kind_row(k: KindScore) -> dict[str, Any]:
        row = {
            **asdict(k),
            "median_delay_s": median(k.delays_s),
            "max_delay_s": max(k.delays_s, default=None),
        }
        if k.leads_s:
            row["warned_24h"] = warned_in_time(k.leads_s)
            row["median_lead_s"] = median([lead or 0.0 for lead in k.leads_s])
        return row

    return {
        "scenarios": [
            {
                "scenario": r.scenario,
                "start": r.start,
                "end": r.end,
                "faults": r.faults,
                "wall_seconds": r.wall_seconds,
                "metrics_present": r.metrics_present,
                "alerts": {n: alert_row(a) for n, a in r.alerts.items()},
                "kinds": {n: kind_row(k) for n, k in r.kinds.items()},
                "false_alerts": r.false_alerts,
                "missed_faults": r.missed_faults,
                "episodes": [
                    {
                        "alertname": e.alertname,
                        "labels": e.labels,
                        "start": unix_to_iso(e.start),
                        "end": unix_to_iso(e.end),
                        "fault": e.fault,
                    }
                    for e in r.episodes
                ],
            }
            for r in results
        ],
        "total": {
            "alerts": {n: alert_row(a) for n, a in alerts.items()},
            "kinds": {n: kind_row(k) for n, k in kinds.items()},
            "false_alerts": sum(a.false_episodes for a in alerts.values()),
        },
    }
