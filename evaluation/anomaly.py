"""Offline evaluation: the detector and two baselines over the twin's simulated data, scored against the
twin's ground truth.

The twin runs in-process at full speed (physics only, no files); every ``cycle`` seconds its last
samples are reduced into a :class:`~anomaly.window.Window` exactly as the service's PromQL reduces them
(medians, throttle-bit shares, counter increases), and the detector, the static power threshold and the
plain z-score each see the same window. Only this module imports the twin; the service never does.

Ground truth: a straggler episode is a fault on a node of a running job while it slows that job. The
twin's truth says when each fault set its job's pace (``pacing``), when a slower node masked it
(``masked``) and what it costs on its own while it paces (``fault_slowdown``); older truth files give
the job's whole ``job_slowdown`` over the fault, else it is measured here from the step times. A flag
on a masked fault's node is neither right nor wrong; episodes that slow the job by less than
``NEUTRAL_SLOWDOWN`` or pace it for less than ``NEUTRAL_PACING_S`` are neutral (a flag on them is
neither right nor wrong and they do not count for recall); faults that pace nothing (a loss spike in
the application) are no episode at all.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from anomaly import jobs as job_identity
from anomaly.detector import Detector, DetectorConfig, Event
from anomaly.window import THROTTLE_HW_POWER_BRAKE, THROTTLE_HW_THERMAL, THROTTLE_SW_THERMAL, Window
from fleetsight import durations
from twin import dcgm
from twin import scenario as scenario_mod
from twin.sim import Simulation
from twin.truth import Fault

from .baselines import StaticPowerBaseline, ZScoreBaseline

NEUTRAL_SLOWDOWN = 0.05
# A fault that sets its job's pace for less than this in all (an IB link down for a few ticks, a mild
# node masked all but a minute) is neutral too: two detection cycles, the least a flag can confirm.
NEUTRAL_PACING_S = 60.0
GRACE_S = 60.0  # a flag this long after the fault's end still belongs to it (window + cycle)
EXPECTED_CAUSE = {
    "psu_failure": "power_brake",
    "thermal_throttle": "thermal",
    "pcie_downgrade": "pcie",
    "gray_slow_node": "unknown",
    "ib_link_flap": "network",
}
# The targets: these kinds of fault, down to a 10 % slowdown of the job. Episodes from 5 %
# (NEUTRAL_SLOWDOWN) count in the figures too; ``at_target`` gives recall over the targets' own set.
TARGET_KINDS = frozenset({"psu_failure", "thermal_throttle", "pcie_downgrade", "gray_slow_node"})
TARGET_SLOWDOWN = 0.10
BANDS = (("~10%", 0.0, 0.15), ("~20%", 0.15, 0.35), ("~50%", 0.35, 1.0), ("2x+", 1.0, math.inf))
DCGM = {
    "tensor": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "power": "DCGM_FI_DEV_POWER_USAGE",
    "sm_clock": "DCGM_FI_DEV_SM_CLOCK",
    "util": "DCGM_FI_DEV_GPU_UTIL",
    "throttle": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",  # field 112 (legacy: CLOCK_THROTTLE_REASONS)
}
IB_ERROR_COUNTERS = ("symbol_error", "link_downed", "link_error_recovery")


def band_of(slowdown: float) -> str:
    for name, low, high in BANDS:
        if low <= slowdown < high:
            return name
    return BANDS[-1][0]


@dataclass
class Episode:
    scenario: str
    fault_id: str
    kind: str
    job: str
    node: str
    onset: float
    end: float
    slowdown: float
    benign: bool = False
    # When the fault set its job's pace, and when a slower node masked it (the twin's truth; without
    # it, the whole fault paces). A fault with neither never acted on its node's pace.
    pacing: list[tuple[float, float]] = field(default_factory=list)
    masked: list[tuple[float, float]] = field(default_factory=list)

    @property
    def counted(self) -> bool:
        return self.slowdown >= NEUTRAL_SLOWDOWN and not self.benign and self.pacing_s >= NEUTRAL_PACING_S

    @property
    def pacing_s(self) -> float:
        return sum(b - a for a, b in self.pacing)

    @property
    def neutral(self) -> bool:
        """A real fault that slowed its job too little to call the node a straggler."""
        return not self.benign and not self.counted

    def pacing_at(self, time: float) -> tuple[float, float] | None:
        """The span (start, end) in which the fault set its job's pace at ``time`` (or just before)."""
        return _span_at(self.pacing, time)

    def masked_at(self, time: float) -> bool:
        return _span_at(self.masked, time) is not None


def _span_at(spans: list[tuple[float, float]], time: float) -> tuple[float, float] | None:
    return next(((a, b) for a, b in spans if a <= time <= b + GRACE_S), None)


@dataclass
class ScenarioRun:
    name: str
    nodes: int
    hours: float
    fault_free: bool
    episodes: list[Episode]
    events: dict[str, list[Event]]  # method -> its events
    cycle_cpu_s: list[float] = field(default_factory=list)
    truth_source: str = "measured step times"


class TwinFeed:
    """Runs one scenario in the twin and yields a window every cycle."""

    def __init__(
        self, path: Path, cycle: float = 30.0, duration: float | None = None, dcgm_labels: str | None = None
    ) -> None:
        self.scenario = with_dcgm_labels(scenario_mod.load(path), dcgm_labels)
        self.sim = Simulation(self.scenario, self.scenario.start)
        # The detector's job id of each twin job (its Slurm id, or <namespace>/<name> from pod labels),
        # to score flags against the truth, which names jobs by their Slurm-style id.
        self.job_ids: dict[str, str] = {}
        self.cycle = cycle
        self.tick = self.scenario.tick
        self.ticks = scenario_ticks(self.scenario, duration)
        self.fields = dict(DCGM)
        self.published_ids = {f.id for f in dcgm.metric_fields(str(self.scenario.dcgm.counters))}
        self.step_times: dict[str, list[tuple[float, float]]] = {}
        self.truth_source = "measured step times"

    def _sample(self) -> dict[str, np.ndarray]:
        sim = self.sim
        present = sim.gpu_present & sim.alive[:, None] & (sim.silenced["dcgm-exporter"] == 0)[:, None]
        out = {}
        for key, name in self.fields.items():
            if dcgm.field_id(name) not in self.published_ids:
                # The scenario's counters file does not publish it (a stock file has no clock events):
                # the service would read no series, so the detector gets nothing either.
                out[key] = np.full(present.shape, np.nan)
                continue
            values = np.asarray(dcgm.values_by_name(sim, name), dtype=float)
            out[key] = np.where(present, values, np.nan)
        return out

    def _ib(self) -> tuple[np.ndarray, np.ndarray]:
        counters = self.sim.ib_counters
        errors = sum(counters[name].astype(np.float64) for name in IB_ERROR_COUNTERS)
        return errors.sum(axis=1), counters["port_xmit_wait"].astype(np.float64).sum(axis=1)

    def windows(self, progress: Callable[[int], None] | None = None) -> Iterable[Window]:
        sim = self.sim
        per_window = max(1, round(self.cycle / self.tick))
        samples: list[dict[str, np.ndarray]] = []
        errors_before, wait_before = self._ib()
        for tick in range(self.ticks):
            sim.advance()
            sim.kernel_lines.clear()
            sim.app_lines.clear()
            samples.append(self._sample())
            for job in sim.jobs:
                if job.state == "RUNNING" and job.phase == "compute":
                    self.step_times.setdefault(job.spec.id, []).append((sim.unix(), job.step_time))
            if progress is not None:
                progress(1)
            if len(samples) < per_window and tick != self.ticks - 1:
                continue
            errors_now, wait_now = self._ib()
            window = self._window(samples, errors_now - errors_before, wait_now - wait_before)
            errors_before, wait_before = errors_now, wait_now
            samples = []
            yield window

    def _window(self, samples: list[dict[str, np.ndarray]], errors: np.ndarray, wait: np.ndarray) -> Window:
        sim = self.sim
        gpus = samples[0]["power"].shape[1]
        window = Window.empty(sim.unix() + self.tick, list(sim.nodes), gpus)
        stacked = {key: np.stack([s[key] for s in samples]) for key in samples[0]}
        with np.errstate(all="ignore"), _quiet():
            window.tensor = np.nanmedian(stacked["tensor"], axis=0)
            window.power = np.nanmedian(stacked["power"], axis=0)
            window.sm_clock = np.nanmedian(stacked["sm_clock"], axis=0)
            window.util = np.nanmedian(stacked["util"], axis=0)
            throttle = np.nan_to_num(stacked["throttle"], nan=0.0).astype(np.int64)
            window.brake = ((throttle & THROTTLE_HW_POWER_BRAKE) > 0).mean(axis=0)
            window.thermal = ((throttle & (THROTTLE_SW_THERMAL | THROTTLE_HW_THERMAL)) > 0).mean(axis=0)
        gen, width = sim.pci_gen[:, :gpus], sim.pci_width[:, :gpus]
        window.pcie_downgraded = (
            (gen < sim.pci_max_gen[:, :gpus]) | (width < sim.pci_max_width[:, :gpus])
        ).astype(float)
        window.h2d_bandwidth = np.asarray(sim.h2d_bandwidth, dtype=float).copy()
        window.ib_errors = np.maximum(errors, 0.0)  # a reboot resets counters: no negative increase
        window.ib_xmit_wait = np.maximum(wait, 0.0) / max(self.cycle, 1e-9)
        self._assign_jobs(window)
        window.gpu_model = {i: "H100" for i in range(len(sim.nodes))}
        return window

    def _assign_jobs(self, window: Window) -> None:
        """Jobs as the service forms them: slurmrestd's list for the twin's Slurm jobs; for its
        Kubernetes jobs, the labels its dcgm-exporter puts on their GPUs (pod labels only), read by
        anomaly/jobs.py, the service's own code."""
        sim, settings = self.sim, self.scenario.dcgm
        running = [job for job in sim.jobs if job.state == "RUNNING"]
        slurm = {j.spec.id: [sim.nodes[i] for i in j.nodes] for j in running if _on_slurm(settings, j)}
        series = [
            (sim.nodes[i], _gpu_label_dict(sim, int(i), job))
            for job in running
            if not _on_slurm(settings, job)
            for i in job.nodes
        ]
        found = job_identity.merge(slurm, job_identity.from_series(job_identity.JobIdentity(), series))
        index = {name: i for i, name in enumerate(window.nodes)}
        window.jobs = {job: sorted(index[n] for n in nodes) for job, nodes in sorted(found.nodes.items())}
        window.job_refs = dict(found.refs)
        for job in running:
            node = sim.nodes[int(job.nodes[0])]
            self.job_ids[job.spec.id] = next((j for j, n in found.nodes.items() if node in n), job.spec.id)

    def episodes(self) -> list[Episode]:
        """Straggler episodes from the twin's truth: events on nodes of running jobs, with the slowdown
        of the job. The twin's ``job``/``job_slowdown`` (a step-time ratio) when its truth has them,
        else the jobs hit and a slowdown measured here from the step times. Benign disturbances are
        episodes of slowdown 0 marked benign: a flag on them is a false flag."""
        refresh = getattr(self.sim, "refresh_truth", None)
        if refresh is not None:  # the twin brings job_slowdown up to date on demand
            refresh()
        out = []
        for truth in self.sim.truth_lines:
            node = (truth.get("target") or {}).get("node")
            if "job" in truth:
                jobs = [truth["job"]] if truth["job"] else []
            else:
                jobs = list(truth.get("jobs") or [])
            if node is None or not jobs:
                continue
            fault = Fault.from_line(truth)
            benign, onset, end = fault.benign, fault.onset, fault.end
            for job in jobs:
                pacing, masked = [(onset, end)], []
                if benign:
                    slowdown = 0.0
                elif truth.get("pacing") is not None and "job" in truth:
                    # The fault's own cost while it set the pace, not its job's whole slowdown: a mild
                    # straggler beside a loud one waits like its peers.
                    slowdown = float(truth.get("fault_slowdown", 1.0)) - 1.0
                    pacing = [(float(a), float(b)) for a, b in truth["pacing"]]
                    masked = [(float(a), float(b)) for a, b in truth.get("masked") or []]
                    self.truth_source = "twin fault_slowdown and pacing"
                elif truth.get("job_slowdown") is not None and "job" in truth:
                    slowdown = float(truth["job_slowdown"]) - 1.0
                    self.truth_source = "twin job_slowdown"
                else:
                    slowdown = self._measured_slowdown(str(job), onset, end)
                out.append(
                    Episode(
                        scenario=self.scenario.name,
                        fault_id=str(truth.get("id")),
                        kind=truth["kind"],
                        job=str(job),
                        node=node,
                        onset=onset,
                        end=end,
                        slowdown=max(0.0, slowdown),
                        benign=benign,
                        pacing=pacing,
                        masked=masked,
                    )
                )
        return out

    def _measured_slowdown(self, job: str, onset: float, end: float) -> float:
        samples = self.step_times.get(job, [])
        faults = [(f.onset, f.end) for f in map(Fault.from_line, self.sim.truth_lines)]
        during = [s for t, s in samples if onset <= t < end]
        healthy = [s for t, s in samples if not any(a <= t < b for a, b in faults)]
        if not during or not healthy:
            return 0.0
        return max(0.0, statistics.median(during) / statistics.median(healthy) - 1.0)


class _quiet:
    def __enter__(self) -> None:
        import warnings

        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc: object) -> None:
        self._catch.__exit__(*exc)


METHODS: dict[str, Callable[[], Any]] = {
    "detector": lambda: Detector(DetectorConfig()),
    "static_power": StaticPowerBaseline,
    "zscore": ZScoreBaseline,
}


def with_dcgm_labels(scenario: Any, labels: str | None) -> Any:
    """The scenario with its dcgm-exporter's label mode replaced: ``kubernetes`` (pod labels on, every
    job a Kubernetes job: the same physics, jobs found from pod labels) or ``slurm``."""
    if labels is None:
        return scenario
    jobs = tuple(replace(j, scheduler=labels) for j in scenario.jobs)
    dcgm_settings = replace(scenario.dcgm, labels=labels, pod_labels=labels == "kubernetes")
    return replace(scenario, dcgm=dcgm_settings, jobs=jobs)


def _on_slurm(settings: Any, job: Any) -> bool:
    return dcgm.job_scheduler(settings, job) != "kubernetes"


def _gpu_label_dict(sim: Simulation, node: int, job: Any) -> dict[str, str]:
    labels, attributes = dcgm.workload_labels(sim, node, sim.scenario.dcgm, job)
    return {**labels, **attributes}


def run_scenario(
    path: Path,
    cycle: float = 30.0,
    progress: Callable[[int], None] | None = None,
    duration: float | None = None,
    dcgm_labels: str | None = None,
) -> ScenarioRun:
    """One scenario through the detector and the baselines; ``duration`` (s) stops the simulation
    early, as the twin's runner does for ``--duration``: the same data up to then."""
    import time

    feed = TwinFeed(path, cycle, duration, dcgm_labels)
    methods = {name: factory() for name, factory in METHODS.items()}
    events: dict[str, list[Event]] = {name: [] for name in methods}
    cpu: list[float] = []
    for window in feed.windows(progress):
        for name, method in methods.items():
            started = time.process_time()
            result = method.step(window)
            if name == "detector":
                cpu.append(time.process_time() - started)
            events[name].extend(result.events)
    scenario = feed.scenario
    fault_free = all(_benign(f) for f in scenario.faults)
    return ScenarioRun(
        name=scenario.name,
        nodes=len(feed.sim.nodes),
        hours=feed.ticks * feed.tick / 3600.0,
        fault_free=fault_free,
        episodes=[replace(e, job=feed.job_ids.get(e.job, e.job)) for e in feed.episodes()],
        events=events,
        cycle_cpu_s=cpu,
        truth_source=feed.truth_source,
    )


def _benign(fault: Any) -> bool:
    return bool(getattr(fault, "benign", False))


def scenario_ticks(scenario: Any, duration: float | None = None) -> int:
    """Ticks to simulate: the scenario's duration, or less where ``duration`` says."""
    span = scenario.duration if duration is None else min(duration, scenario.duration)
    return max(1, math.ceil(span / scenario.tick))


def parse_duration(value: str) -> float:
    """Seconds from a duration as scenarios write it (90s, 5m, 2h) or a plain number of seconds."""
    try:
        seconds = durations.seconds(value)
    except ValueError as exc:
        raise ValueError(f"--duration: {exc}") from None
    if seconds <= 0:
        raise ValueError(f"--duration: must be positive, got {value!r}")
    return float(seconds)


def total_ticks(paths: list[Path], duration: float | None = None) -> int:
    return sum(scenario_ticks(scenario_mod.load(path), duration) for path in paths)


# ----------------------------------------------------------------------------------- scoring
@dataclass
class _Tally:
    tp: int = 0
    fp: int = 0
    episodes: int = 0
    detected: int = 0
    latencies: list[float] = field(default_factory=list)
    cause_right: int = 0

    def figures(self) -> dict[str, Any]:
        precision = self.tp / (self.tp + self.fp) if self.tp + self.fp else None
        recall = self.detected / self.episodes if self.episodes else None
        f1 = (
            2 * precision * recall / (precision + recall)
            if precision is not None and recall is not None and precision + recall
            else None
        )
        lat = sorted(self.latencies)
        return {
            "episodes": self.episodes,
            "detected": self.detected,
            "true_flags": self.tp,
            "wrong_flags": self.fp,
            "precision": _r(precision),
            "recall": _r(recall),
            "f1": _r(f1),
            "latency_median_s": _r(statistics.median(lat)) if lat else None,
            "latency_p95_s": _r(float(np.percentile(lat, 95))) if lat else None,
            "cause_accuracy": _r(self.cause_right / self.tp) if self.tp else None,
        }


def _r(value: float | None) -> float | None:
    return None if value is None else round(float(value), 4)


def score(runs: list[ScenarioRun], method: str) -> dict[str, Any]:
    """Precision, recall, F1 and latency overall, per fault kind and per slowdown band; false flags per
    1,000 node-hours on the fault-free scenarios."""
    overall = _Tally()
    at_target = _Tally()
    by_kind: dict[str, _Tally] = {}
    by_band: dict[str, _Tally] = {}
    by_kind_band: dict[tuple[str, str], _Tally] = {}
    false_free = 0
    free_hours = 0.0
    missed: list[dict[str, Any]] = []
    wrong: list[dict[str, Any]] = []
    held_into = 0

    def tallies(episode: Episode) -> list[_Tally]:
        targeted = episode.kind in TARGET_KINDS and episode.slowdown >= TARGET_SLOWDOWN
        return [
            overall,
            by_kind.setdefault(episode.kind, _Tally()),
            by_band.setdefault(band_of(episode.slowdown), _Tally()),
            by_kind_band.setdefault((episode.kind, band_of(episode.slowdown)), _Tally()),
            *([at_target] if targeted else []),
        ]

    for run in runs:
        flags = [e for e in run.events[method] if e.kind == "flag"]
        if run.fault_free:
            false_free += len(flags)
            free_hours += run.nodes * run.hours
        for episode in run.episodes:
            if episode.counted:
                for tally in tallies(episode):
                    tally.episodes += 1
        first_flag: dict[int, tuple[float, float]] = {}  # episode -> (flag time, its pacing start)
        for event in flags:
            s = event.straggler
            if _masked(run.episodes, s.job, s.node, event.time):
                continue  # the node's fault waits for a slower node: no one could see it, no one is wrong
            match = _matching(run.episodes, s.job, s.node, event.time)
            if match is not None and match.neutral:
                continue  # the fault slowed the job too little to call it a straggler
            if match is not None and match.counted:
                for tally in tallies(match):
                    tally.tp += 1
                    tally.cause_right += int(EXPECTED_CAUSE.get(match.kind) == s.cause)
                span = match.pacing_at(event.time)
                key = id(match)
                if key not in first_flag or event.time < first_flag[key][0]:
                    first_flag[key] = (event.time, span[0] if span else match.onset)
                continue
            # A wrong flag: blame the episode pacing the same job at the time (a peer blamed for the
            # straggler), else count it against no fault at all.
            active = [e for e in run.episodes if e.job == s.job and e.pacing_at(event.time)]
            wrong.append(
                {"scenario": run.name, "job": s.job, "node": s.node, "time": event.time, "cause": s.cause}
                | {"during": active[0].fault_id if active else None}
            )
            if active:
                for tally in tallies(active[0]):
                    tally.fp += 1
            else:
                overall.fp += 1
                by_kind.setdefault("none", _Tally()).fp += 1
        held = _held_flags(run.events[method])
        for episode in run.episodes:
            if episode.counted and id(episode) in first_flag:
                flagged, since = first_flag[id(episode)]
                for tally in tallies(episode):
                    tally.detected += 1
                    tally.latencies.append(flagged - since)
            elif episode.counted and _held_into(held, episode):
                # The node was already flagged (for an earlier fault of it) when this one started
                # setting the pace, and stayed flagged: the operator saw it. No latency to report.
                held_into += 1
                for tally in tallies(episode):
                    tally.detected += 1
            elif episode.counted:
                missed.append(_describe(run.name, episode))
    result = overall.figures()
    target = at_target.figures()
    result["at_target"] = {key: target[key] for key in ("episodes", "detected", "recall", "latency_median_s")}
    result["false_flags"] = _r(1000.0 * false_free / free_hours) if free_hours else None
    result["false_flag_count"] = false_free
    result["fault_free_node_hours"] = round(free_hours, 1)
    result["detected_by_held_flag"] = held_into
    result["missed"] = missed
    result["wrong"] = wrong
    result["by_kind"] = {kind: tally.figures() for kind, tally in sorted(by_kind.items())}
    result["by_band"] = {band: by_band[band].figures() for band, _, _ in BANDS if band in by_band}
    result["by_kind_band"] = [
        {"kind": kind, "band": band, **tally.figures()}
        for (kind, band), tally in sorted(by_kind_band.items())
    ]
    return result


def _matching(episodes: list[Episode], job: str, node: str, time: float) -> Episode | None:
    """The episode a flag belongs to: same node and job, raised while the fault set the job's pace
    (or just after)."""
    hits = [e for e in episodes if e.node == node and e.job == job and e.pacing_at(time)]
    if not hits:
        return None
    counted = [e for e in hits if e.counted] or [e for e in hits if e.neutral] or hits
    return max(counted, key=lambda e: e.slowdown)


def _held_flags(events: list[Event]) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """Per (job, node): the spans from each flag to its clear (open-ended while still flagged)."""
    spans: dict[tuple[str, str], list[tuple[float, float]]] = {}
    raised: dict[tuple[str, str], float] = {}
    for event in events:
        key = (event.straggler.job, event.straggler.node)
        if event.kind == "flag":
            raised[key] = event.time
        elif event.kind == "clear" and key in raised:
            spans.setdefault(key, []).append((raised.pop(key), event.time))
    for key, since in raised.items():
        spans.setdefault(key, []).append((since, math.inf))
    return spans


def _held_into(held: dict[tuple[str, str], list[tuple[float, float]]], episode: Episode) -> bool:
    """A flag of the episode's node, raised before the fault started setting the pace, still held
    at the start of one of its pacing spans."""
    return any(
        raised < start <= cleared
        for raised, cleared in held.get((episode.job, episode.node), [])
        for start, _ in episode.pacing
    )


def _describe(scenario: str, episode: Episode) -> dict[str, Any]:
    return {
        "scenario": scenario,
        "fault_id": episode.fault_id,
        "kind": episode.kind,
        "job": episode.job,
        "node": episode.node,
        "slowdown": round(episode.slowdown, 4),
        "pacing_s": round(episode.pacing_s, 1),
        "masked_s": round(sum(b - a for a, b in episode.masked), 1),
    }


def _masked(episodes: list[Episode], job: str, node: str, time: float) -> bool:
    """The node has a fault that a slower node masks and none that sets the job's pace."""
    mine = [e for e in episodes if e.node == node and e.job == job and not e.benign]
    return any(e.masked_at(time) for e in mine) and not any(e.pacing_at(time) for e in mine)


def report(runs: list[ScenarioRun], cycle: float) -> dict[str, Any]:
    """The detector's figures at the top level, the baselines' under ``baselines``."""
    result = score(runs, "detector")
    result["baselines"] = {name: score(runs, name) for name in METHODS if name != "detector"}
    for figures in result["baselines"].values():  # thousands of wrong flags: only the detector's
        del figures["missed"], figures["wrong"]
    cpu = [c for run in runs for c in run.cycle_cpu_s]
    result["scenarios"] = [
        {
            "name": run.name,
            "nodes": run.nodes,
            "hours": round(run.hours, 2),
            "fault_free": run.fault_free,
            "episodes": len([e for e in run.episodes if e.counted]),
            "neutral_episodes": len([e for e in run.episodes if e.neutral]),
            "benign_events": len([e for e in run.episodes if e.benign]),
            "detector_flags": len([e for e in run.events["detector"] if e.kind == "flag"]),
            "truth_source": run.truth_source,
        }
        for run in runs
    ]
    result["cycle_s"] = cycle
    result["detector_cpu_per_cycle_s"] = {
        "median": _r(statistics.median(cpu)) if cpu else None,
        "max": _r(max(cpu)) if cpu else None,
    }
    sources = sorted({run.truth_source for run in runs})
    result["truth_source"] = ", ".join(sources)
    return result


def evaluate(
    paths: list[Path],
    cycle: float = 30.0,
    progress: Callable[[int], None] | None = None,
    duration: float | None = None,
    dcgm_labels: str | None = None,
) -> dict[str, Any]:
    return report([run_scenario(path, cycle, progress, duration, dcgm_labels) for path in paths], cycle)


def flag_log(runs: list[ScenarioRun]) -> list[dict[str, Any]]:
    return [
        {"scenario": run.name, "event": e.kind, "time": e.time, **e.straggler.as_dict()}
        for run in runs
        for e in run.events["detector"]
    ]
