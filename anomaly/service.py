"""The anomaly service: every cycle it reads a window from Prometheus/Thanos, runs the detector and
publishes the stragglers as metrics (for Prometheus and the ``StragglerNode`` alert), as a REST API and
as one structured log line per flag and clear; and the nodes it cannot see (blind: profiling fields at 0
on a busy GPU, no profiling field, no sample at all) the same ways, apart from the stragglers.

A source that does not answer never stops the service: the cycle is skipped, the flags stay as they
were, ``fleetsight_anomaly_source_up`` says 0 with the error on ``GET /v1/status``, and the next cycle
tries again.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from fleetsight import auth

from .declared import routing_comment_pattern
from .detector import Blind, Detector, DetectorConfig, Event, Straggler
from .jobs import JobIdentity, JobRef, pod_label_keys
from .notify import HealthNotifier
from .owners import PodOwners
from .source import PrometheusSource, SourceError
from .window import Window

log = logging.getLogger("anomaly")


@dataclass
class ServiceConfig:
    prometheus_url: str
    slurm_url: str | None = None
    interval_s: float = 30.0
    window: str = "30s"
    step: str = "5s"
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    # Training-job controller pod-label keys, in order (anomaly/jobs.py; FLEETSIGHT_JOB_POD_LABELS).
    pod_label_keys: tuple[str, ...] = field(default_factory=pod_label_keys)
    cluster: str = ""  # the `cluster` of the job-node series where the GPU series carry none
    # The API server's pod owners, for GPU pods without controller labels (anomaly/owners.py).
    pod_owners: PodOwners | None = None
    # What a Slurm job's comment matches to declare expert routing (anomaly/declared.py); None:
    # FLEETSIGHT_ROUTING_COMMENT, else the word expert-routing.
    routing_comment: str | None = None


@dataclass(frozen=True)
class JobNode:
    """One (job, node) pair of a window, as ``fleetsight_job_node_info`` publishes it."""

    cluster: str
    node: str
    job: JobRef


def job_nodes(window: Window, cluster: str = "") -> list[JobNode]:
    """Every (job, node) of the window; ``cluster`` fills in where the series carry none."""
    out = []
    for job, members in sorted(window.jobs.items()):
        ref = window.job_refs.get(job) or JobRef(job, "")
        for i in members:
            out.append(JobNode(window.node_cluster.get(i) or cluster, window.nodes[i], ref))
    return out


def iso(unix: float) -> str:
    return dt.datetime.fromtimestamp(unix, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class AnomalyService:
    """The detection loop and its state (thread-safe reads for the API and /metrics)."""

    def __init__(self, config: ServiceConfig, source: PrometheusSource | None = None) -> None:
        from .queries import Queries

        self.config = config
        self.source = source or PrometheusSource(
            config.prometheus_url, Queries(config.window, config.step), config.slurm_url
        )
        self.source.identity = JobIdentity(tuple(config.pod_label_keys), config.pod_owners)
        if self.source.slurm is not None:
            self.source.slurm.routing_pattern = routing_comment_pattern(config.routing_comment)
        self.detector = Detector(config.detector)
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.scores: list[tuple[str, str, int, float]] = []
        self.stragglers: list[Straggler] = []
        self.source_up: bool | None = None
        self.source_error = ""
        self.cycles = 0
        self.cycle_errors = 0
        self.flags_total: dict[str, int] = {}
        self.last_cycle: float | None = None
        self.last_duration = 0.0
        self.last_counts = (0, 0, 0)  # nodes, jobs, quiet jobs
        self.job_nodes: list[JobNode] = []  # the last window's (job, node) pairs
        self.blind: list[Blind] = []  # the last cycle's blind nodes of jobs
        self.notifier = HealthNotifier.from_env()  # flags and clears to the health service (optional)

    # ----------------------------------------------------------------------------- loop
    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="anomaly-cycle", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(timeout=30)
        self.source.close()

    def _loop(self) -> None:
        while not self.stop_event.is_set():
            started = time.monotonic()
            self.cycle()
            self.stop_event.wait(max(0.0, self.config.interval_s - (time.monotonic() - started)))

    def cycle(self, at: float | None = None) -> None:
        started = time.monotonic()
        try:
            window = self.source.read(at)
        except SourceError as exc:
            with self.lock:
                self.cycle_errors += 1
                if self.source_up is not False or self.source_error != str(exc):  # new or changed
                    log.warning(json.dumps({"event": "source_down", "error": str(exc)}))
                self.source_up = False
                self.source_error = str(exc)
            return
        result = self.detector.step(window)
        for event in result.events:
            self._log_event(event)
        self._log_blind(result.blind, window.end)
        if self.notifier is not None:
            self.notifier.send(result.events)
        with self.lock:
            if self.source_up is False:
                log.info(json.dumps({"event": "source_recovered", "url": self.config.prometheus_url}))
            self.source_up = True
            self.source_error = ""
            self.scores = result.scores
            self.stragglers = self.detector.flagged()
            self.cycles += 1
            self.last_cycle = window.end
            self.last_duration = time.monotonic() - started
            self.last_counts = (len(window.nodes), len(window.jobs), result.quiet_jobs)
            self.job_nodes = job_nodes(window, self.config.cluster)
            self.blind = result.blind
            for event in result.events:
                if event.kind == "flag":
                    cause = event.straggler.cause
                    self.flags_total[cause] = self.flags_total.get(cause, 0) + 1

    def _log_event(self, event: Event) -> None:
        s = event.straggler
        log.info(
            json.dumps(
                {
                    "event": f"straggler_{event.kind}",
                    "time": iso(event.time),
                    "hpc_job": s.job,
                    "node": s.node,
                    "gpu": s.gpu,
                    "cause": s.cause,
                    "score": round(s.score, 2),
                    "evidence": s.evidence,
                },
                sort_keys=True,
            )
        )

    def _log_blind(self, blind: list[Blind], end: float) -> None:
        """One line when a node of a job becomes blind (or its reason changes), one when it is seen
        again: an event, not a line per cycle."""
        now = {(b.job, b.node): b for b in blind}
        before = {(b.job, b.node): b for b in self.blind}
        for key, b in sorted(now.items()):
            if key not in before or before[key].reason != b.reason:
                line = {"event": "node_blind", "time": iso(end), **b.as_dict(), "since": iso(b.since)}
                log.warning(json.dumps(line, sort_keys=True))
        for key, b in sorted(before.items()):
            if key not in now:
                line = {"event": "node_seen", "time": iso(end), "hpc_job": b.job, "node": b.node}
                log.info(json.dumps({**line, "was": b.reason}, sort_keys=True))

    # ----------------------------------------------------------------------------- views
    def _timed_items(self, kind: str, job: str | None) -> list[tuple[Any, dict[str, Any]]]:
        """The flags or blind nodes (``kind``: the attribute) of one job or all, by job and node, each
        with its dictionary and its start as ISO time and unix time."""
        with self.lock:
            chosen = [r for r in getattr(self, kind) if job is None or r.job == job]
        chosen.sort(key=lambda r: (r.job, r.node))
        return [(r, {**r.as_dict(), "since": iso(r.since), "since_unix": r.since}) for r in chosen]

    def blind_items(self, job: str | None = None) -> list[dict[str, Any]]:
        return [item for _, item in self._timed_items("blind", job)]

    def straggler_items(self, job: str | None = None) -> list[dict[str, Any]]:
        return [{**item, "updated": iso(s.updated)} for s, item in self._timed_items("stragglers", job)]

    def status(self) -> dict[str, Any]:
        with self.lock:
            nodes, jobs, quiet = self.last_counts
            return {
                "source": {
                    "url": self.config.prometheus_url,
                    "up": self.source_up,
                    "error": self.source_error,
                    "slurm_url": self.config.slurm_url,
                    "slurm_up": self.source.slurm_up,
                    "slurm_error": self.source.slurm_error,
                    "mode": self.source.mode_now,  # recorded (rules/anomaly.yml) or raw reductions
                },
                "cycles": self.cycles,
                "cycle_errors": self.cycle_errors,
                "interval_s": self.config.interval_s,
                "window": self.config.window,
                "last_cycle": iso(self.last_cycle) if self.last_cycle else None,
                "last_cycle_duration_s": round(self.last_duration, 4),
                "nodes": nodes,
                "jobs": jobs,
                "quiet_jobs": quiet,
                "stragglers": len(self.stragglers),
                "blind_nodes": len({(b.job, b.node) for b in self.blind}),
                "pod_owners": self._owners_status(),
            }

    def _owners_status(self) -> dict[str, Any] | None:
        owners = self.config.pod_owners
        if owners is None:
            return None
        return {"url": owners.api.url, "errors": owners.errors, "last_error": owners.last_error}


class ServiceCollector(Collector):
    """Exposes the current state; series of cleared flags and ended jobs vanish with them."""

    def __init__(self, service: AnomalyService) -> None:
        self.service = service

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = self.service
        with s.lock:
            scores = list(s.scores)
            stragglers = list(s.stragglers)
            up = s.source_up
            cycles, errors = s.cycles, s.cycle_errors
            flags_total = dict(s.flags_total)
            duration, last = s.last_duration, s.last_cycle
            pairs = list(s.job_nodes)
            blind = list(s.blind)
        yield from job_families(pairs)
        score = GaugeMetricFamily(
            "fleetsight_straggler_score",
            "Robust z-score of the GPU's tensor activity above its job peers (own offset removed).",
            labels=["hpc_job", "node", "gpu"],
        )
        for job, node, gpu, value in scores:
            score.add_metric([job, node, str(gpu)], value)
        yield score
        flagged = GaugeMetricFamily(
            "fleetsight_straggler",
            "1 while the node is flagged as the straggler of its job, with the cause.",
            labels=["hpc_job", "node", "cause"],
        )
        for straggler in stragglers:
            flagged.add_metric([straggler.job, straggler.node, straggler.cause], 1.0)
        yield flagged
        yield blind_family(blind, s.config.cluster)
        yield GaugeMetricFamily(
            "fleetsight_anomaly_source_up",
            "1 when the last cycle read Prometheus/Thanos, 0 when it failed.",
            value=1.0 if up else 0.0,
        )
        mode = GaugeMetricFamily(
            "fleetsight_anomaly_source_mode",
            "1 for how the last cycle read its window: recorded (rules/anomaly.yml) or raw reductions.",
            labels=["mode"],
        )
        if s.source.mode_now:
            mode.add_metric([s.source.mode_now], 1.0)
        yield mode
        yield CounterMetricFamily("fleetsight_anomaly_cycles", "Detection cycles completed.", value=cycles)
        if s.config.pod_owners is not None:
            yield CounterMetricFamily(
                "fleetsight_anomaly_pod_owner_errors",
                "Pod owner lookups in the API server that failed (the pod's node counts as in no job).",
                value=s.config.pod_owners.errors,
            )
        yield CounterMetricFamily(
            "fleetsight_anomaly_cycle_errors", "Cycles skipped because the source failed.", value=errors
        )
        flags = CounterMetricFamily(
            "fleetsight_anomaly_flags", "Stragglers flagged since start, by cause.", labels=["cause"]
        )
        for cause, count in sorted(flags_total.items()):
            flags.add_metric([cause], count)
        yield flags
        yield GaugeMetricFamily(
            "fleetsight_anomaly_cycle_duration_seconds", "Wall time of the last cycle.", value=duration
        )
        yield GaugeMetricFamily(
            "fleetsight_anomaly_last_cycle_timestamp_seconds",
            "End of the last window analysed (unix seconds).",
            value=last or 0.0,
        )


def blind_family(blind: list[Blind], cluster: str = "") -> GaugeMetricFamily:
    """``fleetsight_anomaly_node_blind``: 1 per (job, node) the detector cannot see, with the reason;
    ``cluster`` fills in where the node's series carry none. The series vanishes when the node is seen."""
    family = GaugeMetricFamily(
        "fleetsight_anomaly_node_blind",
        "1 while the straggler detector cannot see the node of the job, with the reason: "
        "profiling_dropout (tensor activity 0 on a GPU whose power says it computes), "
        "profiling_absent (power but no profiling field), no_samples (no sample at all).",
        labels=["cluster", "node", "hpc_job", "reason"],
    )
    for b in sorted(blind, key=lambda b: (b.job, b.node)):
        family.add_metric([b.cluster or cluster, b.node, b.job, b.reason], 1.0)
    return family


def job_families(pairs: list[JobNode]) -> Iterator[GaugeMetricFamily]:
    """The one job-to-node mapping every consumer joins on. The job id is in `hpc_job` because `job`
    is Prometheus's scrape job; a node's jobs are also one series with their ids comma-joined, so a
    rule or template can add them to an alert with a one-to-one match on the node."""
    info = GaugeMetricFamily(
        "fleetsight_job_node_info",
        "1 for every node a running job holds: hpc_job is the job id (Slurm id, hpc_job label, or "
        "<namespace>/<name> on Kubernetes), scheduler where it came from.",
        labels=["cluster", "node", "hpc_job", "namespace", "scheduler"],
    )
    per_node: dict[tuple[str, str], set[str]] = {}
    for pair in pairs:
        info.add_metric([pair.cluster, pair.node, pair.job.id, pair.job.namespace, pair.job.scheduler], 1.0)
        per_node.setdefault((pair.cluster, pair.node), set()).add(pair.job.id)
    yield info
    node_jobs = GaugeMetricFamily(
        "fleetsight_node_jobs_info",
        "1 for every node that runs at least one job; jobs: the sorted, comma-joined job ids.",
        labels=["cluster", "node", "jobs"],
    )
    for (cluster, node), jobs in sorted(per_node.items()):
        node_jobs.add_metric([cluster, node, ",".join(sorted(jobs))], 1.0)
    yield node_jobs


def create_app(
    service: AnomalyService, run_loop: bool = True, guard: auth.TokenGuard | None = None
) -> FastAPI:
    """The REST API. Every route is a read: open on the cluster network unless ``guard`` says reads need
    a token (scope ``read``, fleetsight.auth's scheme, FLEETSIGHT_ANOMALY_TOKENS)."""
    guard = guard or auth.TokenGuard()
    reader = [Depends(guard.require(auth.READ))]
    registry = CollectorRegistry()
    registry.register(ServiceCollector(service))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> Any:
        if run_loop:
            service.start()
        yield
        service.stop()

    app = FastAPI(
        title="FleetSight anomaly service",
        description="Straggler nodes of running jobs, with cause and evidence (node vs peers' median).",
        version="1",
        lifespan=lifespan,
        responses=auth.ERROR_RESPONSES,
    )

    # A read like the API (it names stragglers and jobs): with --token-reads, Prometheus sends a read token.
    @app.get("/metrics", include_in_schema=False, dependencies=reader)
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(auth.BodyLimit)

    @app.get(
        "/v1/stragglers",
        summary="Every flagged straggler, with cause and evidence, and the nodes it cannot see (blind)",
        dependencies=reader,
    )
    def stragglers() -> dict[str, Any]:
        return {
            "stragglers": service.straggler_items(),
            "blind": service.blind_items(),
            "status": service.status(),
        }

    # `:path`: a Kubernetes job id is <namespace>/<name>.
    @app.get(
        "/v1/jobs/{job_id:path}/stragglers", summary="The flagged stragglers of one job", dependencies=reader
    )
    def job_stragglers(job_id: str) -> dict[str, Any]:
        known = job_id in service.detector.jobs
        items = service.straggler_items(job_id)
        blind = service.blind_items(job_id)
        if not known and not items and not blind:
            raise HTTPException(
                status_code=404, detail=f"job {job_id} is not running (not in the last window)"
            )
        return {"hpc_job": job_id, "stragglers": items, "blind": blind}

    @app.get("/v1/status", summary="Source health and the last cycle", dependencies=reader)
    def status() -> dict[str, Any]:
        return service.status()

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
