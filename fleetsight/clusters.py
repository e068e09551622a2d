"""Several twin clusters on one machine (`fleetsight up --clusters N`, or one `--scenario` per cluster):
each cluster a whole stack of its own, and the global layer above them.

- The **global layer** runs from the run folder itself, on the stack's ports (FLEETSIGHT_PORT_BASE): the
  components that declare themselves part of it (``GLOBAL_LAYER`` in a component.py: the fleet's one
  Slack stand-in, the layer's own Alertmanager, the global Query, read API, Prometheus and viewer).
- **Cluster k** (k = 1..N) runs from ``<run>/clusters/<name>`` on the ports ``base + 1000 k``, exactly as
  `fleetsight up` runs one cluster, with its scenario, its name (the scenario's) and its scheduler; its
  Alertmanagers post to the global layer's Slack stand-in, as a fleet's clusters share one workspace.

The plan (which clusters, where) is written to ``<run>/clusters.json`` before anything starts: the global
components read it for their endpoints, and `status` and `down` for the clusters' run folders. How a
scenario is read (its file, cluster name and scheduler) is the twin's: ``SCENARIO_READERS``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from fleetsight import registry
from fleetsight.settings import SCHEDULER_ENV, SLACK_STAND_IN_ENV, TWIN_SCENARIO_ENV, Settings

# The shipped shapes, in order: a Slurm-scheduled cluster and a Kubernetes-shaped one.
SHAPES = ("demo", "demo_k8s")
PORT_STRIDE = 1000  # above the highest offset a component declares (200)
PLAN_FILE = "clusters.json"


class PlanError(ValueError):
    """A `--clusters`/`--scenario` combination that cannot run; the message says why."""


@dataclass(frozen=True)
class LocalCluster:
    name: str
    scenario: str  # the scenario's file
    settings: Settings

    def env(self, global_settings: Settings) -> dict[str, str]:
        """The environment that makes its supervisor this cluster's: its scenario and scheduler (as
        stack.start exports them from its settings) and the fleet's one Slack."""
        return {
            TWIN_SCENARIO_ENV: self.settings.twin_scenario,
            SCHEDULER_ENV: self.settings.scheduler,
            SLACK_STAND_IN_ENV: global_settings.url("slack_sink", "/services/local/webhook"),
        }


def describe_scenario(value: str) -> dict[str, str]:
    """A scenario's file, cluster name and scheduler, as the twin reads it (ValueError: a bad one)."""
    readers = registry.declared("SCENARIO_READERS")
    if not readers:
        raise PlanError("no component reads twin scenarios (is the twin's folder there?)")
    return readers[0](value)


def global_components() -> list[str]:
    """The components of the global layer, as their folders declare them (``GLOBAL_LAYER``)."""
    return list(dict.fromkeys(registry.declared("GLOBAL_LAYER")))


def plan(settings: Settings, count: int, scenarios: tuple[str, ...] = ()) -> list[LocalCluster]:
    """The clusters to run: one per scenario, or the first ``count`` shipped shapes."""
    if scenarios and count not in (len(scenarios), 1):
        raise PlanError(f"--clusters {count} with {len(scenarios)} --scenario: give one scenario per cluster")
    if not scenarios and not 2 <= count <= len(SHAPES):
        raise PlanError(
            f"--clusters {count}: the shipped shapes make {len(SHAPES)} clusters (a Slurm one and a "
            "Kubernetes one); for another number, give one --scenario per cluster"
        )
    clusters: list[LocalCluster] = []
    for index, value in enumerate(scenarios or SHAPES[:count], start=1):
        facts = describe_scenario(value)
        if any(c.name == facts["cluster"] for c in clusters):
            raise PlanError(
                f"two scenarios name the cluster {facts['cluster']!r}: each cluster needs its own"
            )
        clusters.append(
            LocalCluster(
                facts["cluster"],
                facts["path"],
                replace(
                    settings,
                    run_dir=settings.run_dir / "clusters" / facts["cluster"],
                    port_base=settings.port_base + PORT_STRIDE * index,
                    cluster=facts["cluster"],
                    twin_scenario=facts["path"],
                    scheduler=facts["scheduler"],
                ),
            )
        )
    return clusters


def plan_path(settings: Settings) -> Path:
    return settings.run_dir / PLAN_FILE


def write_plan(settings: Settings, clusters: list[LocalCluster]) -> None:
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    body = [
        {
            "name": c.name,
            "scenario": c.scenario,
            "scheduler": c.settings.scheduler,
            "run_dir": str(c.settings.run_dir),
            "port_base": c.settings.port_base,
        }
        for c in clusters
    ]
    plan_path(settings).write_text(json.dumps({"clusters": body}, indent=2) + "\n")


def read_plan(settings: Settings) -> list[LocalCluster]:
    """The clusters of the last `up --clusters` from this run folder ([] for a one-cluster stack)."""
    path = plan_path(settings)
    try:
        body = json.loads(path.read_text())
        return [
            LocalCluster(
                c["name"],
                c["scenario"],
                replace(
                    settings,
                    run_dir=Path(c["run_dir"]),
                    port_base=int(c["port_base"]),
                    cluster=c["name"],
                    twin_scenario=c["scenario"],
                    scheduler=c["scheduler"],
                ),
            )
            for c in body["clusters"]
        ]
    except FileNotFoundError:
        return []
    except (ValueError, KeyError, TypeError) as exc:
        raise PlanError(f"{path}: not a clusters plan ({exc}); remove it if no stack runs from here") from exc


def forget_plan(settings: Settings) -> None:
    plan_path(settings).unlink(missing_ok=True)
