"""A scenario's jobs, read and checked: their nodes (a count, names or ranges), model profile, pipeline
stages, schedule, restart policy and who runs them (Slurm or Kubernetes); and that jobs running at the
same time fit the cluster without sharing a node.

Its own module: the jobs section changes with the workload model (twin/workload.py), not with the
fault kinds or the file's other sections.
"""

from __future__ import annotations

import math
from typing import Any

from .scenario_fields import ScenarioError, as_mapping, check_known_keys, parse_duration
from .scenario_model import MODEL_PROFILES, JobSpec


def expand_node_list(value: Any, known: set[str], where: str) -> tuple[str, ...] | int:
    """A count, a list of names, or ranges like "n0001-n0008"."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ScenarioError(f"{where}: a job needs at least one node")
        if value > len(known):
            raise ScenarioError(f"{where}: {value} nodes, but the cluster has {len(known)}")
        return value
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise ScenarioError(f"{where}: expected a node count or a list of node names, got {value!r}")
    names: list[str] = []
    for item in items:
        text = str(item)
        if "-" in text:
            first, last = text.split("-", 1)
            try:
                lo, hi = int(first.lstrip("n")), int(last.lstrip("n"))
            except ValueError as exc:
                raise ScenarioError(f"{where}: bad node range {text!r}") from exc
            names.extend(f"n{i:04d}" for i in range(lo, hi + 1))
        else:
            names.append(text)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ScenarioError(f"{where}: unknown node(s) {', '.join(unknown[:5])}")
    if len(set(names)) != len(names):
        raise ScenarioError(f"{where}: a node is listed twice")
    return tuple(names)


JOB_KEYS = {
    "id",
    "name",
    "nodes",
    "profile",
    "start",
    "end",
    "checkpoint_interval",
    "checkpoint_duration",
    "restart",
    "restart_delay",
    "user",
    "pipeline_stages",
    "scheduler",
    "controller",
    "namespace",
    "replica_log",
    "declares_routing",
}
JOB_SCHEDULERS = ("", "slurm", "kubernetes")
JOB_CONTROLLERS = ("jobset", "pytorchjob")


def read_job(raw: Any, index: int, known: set[str], duration: float) -> JobSpec:
    where = f"jobs[{index}]"
    raw = as_mapping(raw, where)
    check_known_keys(raw, JOB_KEYS, where)
    profile = str(raw.get("profile", "llm-20b"))
    if profile not in MODEL_PROFILES:
        raise ScenarioError(f"{where}.profile: unknown {profile!r} (known: {', '.join(MODEL_PROFILES)})")
    restart = str(raw.get("restart", "requeue"))
    if restart not in ("requeue", "none"):
        raise ScenarioError(f"{where}.restart: expected requeue or none, got {restart!r}")
    nodes = expand_node_list(raw.get("nodes", 1), known, f"{where}.nodes")
    size = nodes if isinstance(nodes, int) else len(nodes)
    default_stages = int(MODEL_PROFILES[profile]["pipeline"])
    stages = raw.get("pipeline_stages", math.gcd(default_stages, size))
    if not isinstance(stages, int) or isinstance(stages, bool) or stages < 1 or size % stages:
        raise ScenarioError(
            f"{where}.pipeline_stages: expected a divisor of the job's {size} nodes, got {stages!r}"
        )
    scheduler, controller = _job_scheduler(raw, where)
    start = parse_duration(raw.get("start", 0), f"{where}.start")
    end = parse_duration(raw.get("end", duration), f"{where}.end")
    if start >= duration:
        raise ScenarioError(f"{where}.start: {start:g} s is at or after the scenario's end ({duration:g} s)")
    if end <= start:
        raise ScenarioError(f"{where}.end: {end:g} s is not after its start ({start:g} s)")
    return JobSpec(
        id=str(raw.get("id", 1000 + index)),
        name=str(raw.get("name", f"train-{index}")),
        nodes=nodes,
        profile=profile,
        start=start,
        end=end,
        checkpoint_interval=parse_duration(
            raw.get("checkpoint_interval", "30m"), f"{where}.checkpoint_interval"
        ),
        checkpoint_duration=parse_duration(
            raw.get("checkpoint_duration", "60s"), f"{where}.checkpoint_duration"
        ),
        restart=restart,
        restart_delay=parse_duration(raw.get("restart_delay", "60s"), f"{where}.restart_delay"),
        user=str(raw.get("user", "researcher")),
        pipeline_stages=stages,
        scheduler=scheduler,
        controller=controller,
        namespace=str(raw.get("namespace", "training")),
        replica_log=_flag(raw, "replica_log", False, where),
        declares_routing=_flag(
            raw, "declares_routing", MODEL_PROFILES[profile]["expert_imbalance"] > 0, where
        ),
    )


def _flag(raw: dict[str, Any], key: str, default: bool, where: str) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise ScenarioError(f"{where}.{key}: expected true or false, got {value!r}")
    return value


def _job_scheduler(raw: dict[str, Any], where: str) -> tuple[str, str]:
    scheduler = str(raw.get("scheduler", ""))
    if scheduler not in JOB_SCHEDULERS:
        raise ScenarioError(f"{where}.scheduler: expected slurm or kubernetes, got {scheduler!r}")
    controller = str(raw.get("controller", "jobset"))
    if controller not in JOB_CONTROLLERS:
        raise ScenarioError(
            f"{where}.controller: expected one of {', '.join(JOB_CONTROLLERS)}, got {controller!r}"
        )
    return scheduler, controller


def check_jobs_fit(jobs: tuple[JobSpec, ...], nodes: int) -> None:
    """Jobs running at the same time may not share a named node nor need more nodes than exist."""

    def overlapping(index: int) -> list[tuple[int, JobSpec]]:
        job = jobs[index]
        return [
            (other_index, other)
            for other_index, other in enumerate(jobs)
            if other_index != index and other.start < job.end and job.start < other.end
        ]

    for index, job in enumerate(jobs):
        if isinstance(job.nodes, int):
            continue
        for other_index, other in overlapping(index):
            if isinstance(other.nodes, int) or other_index > index:
                continue
            shared = sorted(set(job.nodes) & set(other.nodes))
            if shared:
                both = ", ".join(shared[:3])
                raise ScenarioError(
                    f"jobs[{index}].nodes: {both} also in jobs[{other_index}] at the same time"
                )
    for index, job in enumerate(jobs):
        running = [
            other
            for other_index, other in overlapping(index)
            if other.start < job.start or (other.start == job.start and other_index < index)
        ]
        needed = job.size + sum(other.size for other in running)
        if needed > nodes:
            raise ScenarioError(
                f"jobs[{index}].nodes: {needed} nodes in use when it starts, the cluster has {nodes}"
            )
