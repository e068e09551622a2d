"""A scenario's training kinds (twin/fault_kinds.py TRAINING_KINDS: checkpoint_stall, eval_pause,
moe_imbalance, pipeline_bubble, job_resize), checked against physics and against the job they name:
their own target keys (how often the busiest MoE node changes, micro-batches per step, the node count a
resized job restarts on) and what their job must be (an MoE job for expert routing, a pipeline-parallel
job whose layout is set at launch, a new size its pipeline stages divide).

Its own module: these kinds need the jobs section, which the fault reader (twin/scenario_faults.py)
does not see; the loader (twin/scenario.py) calls ``check_training_faults`` once both are read.
"""

from __future__ import annotations

from typing import Any

from .scenario_fields import ScenarioError, parse_duration
from .scenario_model import MODEL_PROFILES, FaultSpec, JobSpec

DEFAULT_EVERY_S = 180.0  # how long one node stays the busiest under moe_imbalance ("every few minutes")
EVERY_RANGE_S = (30.0, 3600.0)
DEFAULT_MICRO_BATCHES = 8  # Megatron-LM's 1F1B: micro-batches per step and data-parallel replica
MICRO_BATCH_RANGE = (1, 512)


def read_training_target(kind: str, target: dict[str, Any], nodes: int, where: str) -> dict[str, Any]:
    """The target with its kind's own keys read and checked: ``every`` in seconds, ``micro_batches``
    and ``nodes`` as integers."""
    target = dict(target)
    if kind == "moe_imbalance":
        every = parse_duration(target.get("every", DEFAULT_EVERY_S), f"{where}.every")
        low, high = EVERY_RANGE_S
        if not low <= every <= high:
            raise ScenarioError(f"{where}.every: expected {low:g} s..{high:g} s, got {every:g} s")
        target["every"] = every
    if kind == "pipeline_bubble":
        target["micro_batches"] = _integer(
            target.get("micro_batches", DEFAULT_MICRO_BATCHES), f"{where}.micro_batches", *MICRO_BATCH_RANGE
        )
    if kind == "job_resize":
        if "nodes" not in target:
            raise ScenarioError(f"{where}.nodes: a job_resize needs the node count the job restarts on")
        target["nodes"] = _integer(target["nodes"], f"{where}.nodes", 1, nodes)
    return target


def _integer(value: Any, where: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ScenarioError(f"{where}: expected an integer {low}..{high}, got {value!r}")
    return value


def check_training_faults(faults: list[FaultSpec], jobs: tuple[JobSpec, ...]) -> None:
    """Each training kind against its job: what the job must be for the kind to make sense."""
    by_id = {job.id: job for job in jobs}
    for index, fault in enumerate(faults):
        where = f"faults[{index}]"
        job = by_id.get(str(fault.target.get("job")))
        if job is None:
            continue
        if fault.kind == "moe_imbalance" and not MODEL_PROFILES[job.profile]["expert_imbalance"]:
            raise ScenarioError(
                f"{where}.target.job: a moe_imbalance needs a mixture-of-experts job; job {job.id} runs "
                f"{job.profile}"
            )
        if fault.kind == "pipeline_bubble":
            _check_pipeline(fault, job, where)
        if fault.kind == "job_resize" and fault.target["nodes"] % job.pipeline_stages:
            raise ScenarioError(
                f"{where}.target.nodes: {fault.target['nodes']} nodes cannot hold job {job.id}'s "
                f"{job.pipeline_stages} pipeline stages (a multiple of them)"
            )


def _check_pipeline(fault: FaultSpec, job: JobSpec, where: str) -> None:
    if job.pipeline_stages < 2:
        raise ScenarioError(
            f"{where}.target.job: a pipeline_bubble needs a pipeline-parallel job; job {job.id} has "
            f"{job.pipeline_stages} stage"
        )
    if fault.onset > job.start:
        raise ScenarioError(
            f"{where}.onset: a job's pipeline layout is set when it launches: onset {fault.onset:g} s is "
            f"after job {job.id}'s start ({job.start:g} s)"
        )
