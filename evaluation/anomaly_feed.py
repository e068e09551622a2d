"""The twin as the straggler detector's data source: one scenario run in-process at full speed (physics
only, no files), its last samples reduced every ``cycle`` seconds into a :class:`~anomaly.window.Window`
exactly as the service's PromQL reduces them (medians, throttle-bit shares, counter increases), with the
jobs formed as the service forms them; and the scenario's straggler episodes from the twin's truth.

Only the evaluation imports the twin; the service never does. Its own module: how the twin is sampled
follows the twin and the service's queries, not how flags are scored.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from anomaly import jobs as job_identity
from anomaly.declared import routing_comment_pattern
from anomaly.scheduler import routing_jobs
from anomaly.window import THROTTLE_HW_POWER_BRAKE, THROTTLE_HW_THERMAL, THROTTLE_SW_THERMAL, Window
from twin import dcgm
from twin import scenario as scenario_mod
from twin.sim import Simulation
from twin.truth import Fault

from .anomaly_truth import Episode

DCGM = {
    "tensor": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "power": "DCGM_FI_DEV_POWER_USAGE",
    "sm_clock": "DCGM_FI_DEV_SM_CLOCK",
    "util": "DCGM_FI_DEV_GPU_UTIL",
    "throttle": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",  # field 112 (legacy: CLOCK_THROTTLE_REASONS)
}
IB_ERROR_COUNTERS = ("symbol_error", "link_downed", "link_error_recovery")


class TwinFeed:
    """Runs one scenario in the twin and yields a window every cycle."""

    def __init__(
        self,
        path: Path,
        cycle: float = 30.0,
        duration: float | None = None,
        dcgm_labels: str | None = None,
        sample_window: float | None = None,
    ) -> None:
        scenario = with_dcgm_labels(scenario_mod.load(path), dcgm_labels)
        if sample_window is not None:  # what each DCGM sample averages (dcgm-exporter's interval)
            scenario = replace(scenario, realism=replace(scenario.realism, sample_window=sample_window))
        self.scenario = scenario
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
        self.routing_pattern = routing_comment_pattern()

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

    def _ib(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per node, summed over its ports: link errors, xmit-wait ticks and bytes received (the PMA
        counts 4-byte words, the exporter publishes bytes)."""
        counters = self.sim.ib_counters
        errors = sum(counters[name].astype(np.float64) for name in IB_ERROR_COUNTERS)
        received = counters["port_rcv_data"].astype(np.float64).sum(axis=1) * 4.0
        return errors.sum(axis=1), counters["port_xmit_wait"].astype(np.float64).sum(axis=1), received

    def windows(self, progress: Callable[[int], None] | None = None) -> Iterable[Window]:
        sim = self.sim
        per_window = max(1, round(self.cycle / self.tick))
        samples: list[dict[str, np.ndarray]] = []
        before = self._ib()
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
            now = self._ib()
            window = self._window(samples, *(after - prior for after, prior in zip(now, before, strict=True)))
            before = now
            samples = []
            yield window

    def _window(
        self, samples: list[dict[str, np.ndarray]], errors: np.ndarray, wait: np.ndarray, received: np.ndarray
    ) -> Window:
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
        window.ib_rcv_rate = np.maximum(received, 0.0) / max(self.cycle, 1e-9)
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
        # The Slurm jobs' comments as slurmrestd serves them, read by the service's own code.
        comments = {"jobs": [{"job_id": j.spec.id, "comment": j.spec.slurm_comment} for j in running]}
        routing = routing_jobs(comments, self.routing_pattern, slurm)
        labelled = job_identity.from_series(job_identity.JobIdentity(), series)
        found = job_identity.merge(slurm, labelled, routing)
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


@contextmanager
def _quiet() -> Iterator[None]:
    """numpy's RuntimeWarnings silenced (all-NaN medians of GPUs without samples are expected)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


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


def scenario_ticks(scenario: Any, duration: float | None = None) -> int:
    """Ticks to simulate: the scenario's duration, or less where ``duration`` says."""
    span = scenario.duration if duration is None else min(duration, scenario.duration)
    return max(1, math.ceil(span / scenario.tick))


def total_ticks(paths: list[Path], duration: float | None = None) -> int:
    """Ticks to simulate over all the scenarios (a progress bar's total)."""
    return sum(scenario_ticks(scenario_mod.load(path), duration) for path in paths)
