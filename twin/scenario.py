"""Scenario files: the cluster's shape, its jobs and its faults, read from YAML and checked.

Every mistake in a scenario file is reported as a ``ScenarioError`` that names the field, so that
`fleetsight twin run` can print one clear line instead of a traceback.

This module is the twin's public API for scenarios: it finds a file (``resolve``), reads it (``load``,
``from_dict``) and hands back a ``Scenario``; the readers of its sections live beside it
(twin/scenario_jobs.py, twin/scenario_faults.py, twin/scenario_fields.py) and the model it returns in
twin/scenario_model.py. ``Scenario``, ``ScenarioError`` and the duration and time parsers (which raise
it) are part of that API, so they are named here for callers outside the twin.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from .scenario_faults import random_faults, read_fault
from .scenario_fields import (
    ScenarioError,
    as_mapping,
    bounded_int,
    check_known_keys,
    parse_duration,
    parse_time,
)
from .scenario_jobs import check_jobs_fit, read_job
from .scenario_model import (
    DCGM_LABEL_MODES,
    DCGM_XID_FORMS,
    REALISM_OFF,
    ClusterSpec,
    DcgmSettings,
    Realism,
    Scenario,
    node_names,
)
from .scenario_training import check_training_faults

__all__ = [
    "SHIPPED_DIR",
    "Scenario",
    "ScenarioError",
    "dcgm_settings",
    "from_dict",
    "load",
    "parse_duration",
    "parse_time",
    "resolve",
]


def _cluster(raw: dict[str, Any]) -> ClusterSpec:
    check_known_keys(
        raw,
        {"name", "nodes", "sku", "nodes_per_rack", "nodes_per_su", "psus_per_node", "lustre"},
        "cluster",
    )
    lustre = as_mapping(raw.get("lustre"), "cluster.lustre")
    check_known_keys(lustre, {"fsname", "osts", "mdts"}, "cluster.lustre")
    return ClusterSpec(
        name=str(raw.get("name", "twin")),
        nodes=bounded_int(raw, "nodes", 16, "cluster", 1, 9999),
        sku=str(raw.get("sku", "h100-sxm-80gb")),
        nodes_per_rack=bounded_int(raw, "nodes_per_rack", 4, "cluster", 1, 64),
        nodes_per_su=bounded_int(raw, "nodes_per_su", 32, "cluster", 1, 4096),
        psus_per_node=bounded_int(raw, "psus_per_node", 6, "cluster", 1, 16),
        lustre_fsname=str(lustre.get("fsname", "lustre")),
        lustre_osts=bounded_int(lustre, "osts", 8, "cluster.lustre", 1, 1024),
        lustre_mdts=bounded_int(lustre, "mdts", 1, "cluster.lustre", 1, 64),
    )


def _realism(value: Any) -> Realism:
    if value is None or value in ("full", "on", True):
        return Realism()
    if value in ("off", False):
        return REALISM_OFF
    raw = as_mapping(value, "realism")
    allowed = set(Realism.__dataclass_fields__)
    check_known_keys(raw, allowed, "realism")
    values: dict[str, Any] = {}
    for key, default in Realism().__dict__.items():
        if key not in raw:
            continue
        item = raw[key]
        if isinstance(default, bool):
            if not isinstance(item, bool):
                raise ScenarioError(f"realism.{key}: expected true or false, got {item!r}")
        elif key == "sample_window":
            item = parse_duration(item, "realism.sample_window")
            if not 0.05 <= item <= 60:
                raise ScenarioError(f"realism.sample_window: expected 0.05 s..60 s, got {item:g} s")
        elif not isinstance(item, int | float) or isinstance(item, bool) or not 0 <= item <= 100:
            raise ScenarioError(f"realism.{key}: expected a number 0..100, got {item!r}")
        values[key] = item
    return replace(Realism(), **values)


def dcgm_settings(value: Any, base: DcgmSettings | None = None) -> DcgmSettings:
    """The ``dcgm`` mapping of a scenario (or CLI overrides) over ``base``; a counters path must exist."""
    raw = as_mapping(value, "dcgm") if value is not None else {}
    check_known_keys(raw, set(DcgmSettings.__dataclass_fields__), "dcgm")
    settings = replace(base or DcgmSettings(), **raw)
    if settings.xid not in DCGM_XID_FORMS:
        raise ScenarioError(f"dcgm.xid: expected one of {', '.join(DCGM_XID_FORMS)}, got {settings.xid!r}")
    if settings.labels not in DCGM_LABEL_MODES:
        raise ScenarioError(
            f"dcgm.labels: expected one of {', '.join(DCGM_LABEL_MODES)}, got {settings.labels!r}"
        )
    if not isinstance(settings.pod_labels, bool) or not isinstance(settings.pod_uid, bool):
        raise ScenarioError("dcgm.pod_labels and dcgm.pod_uid: expected true or false")
    if settings.counters not in ("shipped", "stock") and not Path(str(settings.counters)).is_file():
        raise ScenarioError(
            f"dcgm.counters: expected shipped, stock or a counters file, got {settings.counters!r}"
        )
    return settings


TOP_KEYS = {
    "dcgm",
    "name",
    "description",
    "seed",
    "start",
    "duration",
    "tick",
    "scrape_failure_rate",
    "cluster",
    "jobs",
    "faults",
    "random_faults",
    "realism",
}


SHIPPED_DIR = Path(__file__).resolve().parent / "scenarios"


def resolve(value: str | Path, folders: tuple[Path, ...] = (SHIPPED_DIR,)) -> Path:
    """A scenario file: ``value`` itself when it is a file, else ``<folder>/<value>.yaml`` in the first
    of ``folders`` that has it (``demo`` -> twin/scenarios/demo.yaml). The one resolver of every
    command that takes ``--scenario``."""
    path = Path(value)
    if path.is_file():
        return path
    for folder in folders:
        candidate = folder / f"{value}.yaml"
        if candidate.is_file():
            return candidate
    where = ", ".join(str(f) for f in folders)
    raise ScenarioError(f"no scenario file {str(value)!r}, and no scenario of that name in {where}")


def load(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML: {exc}") from exc
    scenario = from_dict(as_mapping(raw, str(path)))
    return replace(scenario, source=path)


def from_dict(raw: dict[str, Any]) -> Scenario:
    check_known_keys(raw, TOP_KEYS, "")
    cluster = _cluster(as_mapping(raw.get("cluster"), "cluster"))
    names = node_names(cluster.nodes)
    known = set(names)
    duration = parse_duration(raw.get("duration", "1h"), "duration")
    tick = parse_duration(raw.get("tick", "5s"), "tick")
    if tick <= 0 or duration <= 0:
        raise ScenarioError("duration and tick must be positive")
    seed = raw.get("seed", 1)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ScenarioError(f"seed: expected an integer, got {seed!r}")
    jobs_raw = raw.get("jobs") or []
    faults_raw = raw.get("faults") or []
    if not isinstance(jobs_raw, list) or not isinstance(faults_raw, list):
        raise ScenarioError("jobs and faults must be lists")
    jobs = tuple(read_job(j, i, known, duration) for i, j in enumerate(jobs_raw))
    if len({j.id for j in jobs}) != len(jobs):
        raise ScenarioError("jobs: two jobs share an id")
    check_jobs_fit(jobs, cluster.nodes)
    job_ids = {j.id for j in jobs}
    faults = [read_fault(f, i, cluster, job_ids, f"f{i + 1:04d}", duration) for i, f in enumerate(faults_raw)]
    if raw.get("random_faults"):
        faults += random_faults(
            as_mapping(raw["random_faults"], "random_faults"), seed, cluster, duration, len(faults) + 1
        )
    check_training_faults(faults, jobs)
    faults.sort(key=lambda f: f.onset)
    rate = raw.get("scrape_failure_rate", 0.0)
    if not isinstance(rate, int | float) or isinstance(rate, bool) or not 0 <= rate < 1:
        raise ScenarioError(f"scrape_failure_rate: expected a probability 0..1, got {rate!r}")
    return Scenario(
        name=str(raw.get("name", "twin")),
        seed=seed,
        start=parse_time(raw.get("start", "2026-11-21T10:00:00Z"), "start"),
        duration=duration,
        tick=tick,
        cluster=cluster,
        jobs=jobs,
        faults=tuple(faults),
        scrape_failure_rate=float(rate),
        description=str(raw.get("description", "")),
        realism=_realism(raw.get("realism")),
        dcgm=dcgm_settings(raw.get("dcgm")),
    )
