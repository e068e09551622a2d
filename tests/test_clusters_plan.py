"""`fleetsight up --clusters N` / `--scenario`: what it plans, and the mistakes it refuses before anything
starts (the two-cluster stack itself: tests/fleet/test_fleet_local.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetsight import clusters
from fleetsight.settings import Settings

TESTS = Path(__file__).resolve().parent
EAST, WEST = str(TESTS / "fleet" / "east.yaml"), str(TESTS / "fleet" / "west.yaml")


def test_two_clusters_are_the_shipped_slurm_and_kubernetes_shapes(tmp_path: Path) -> None:
    settings = Settings(run_dir=tmp_path, port_base=30000)
    planned = clusters.plan(settings, 2)
    assert [(c.name, c.settings.scheduler) for c in planned] == [
        ("demo", "slurm"),
        ("demo-k8s", "kubernetes"),
    ]
    assert [c.settings.port_base for c in planned] == [31000, 32000]
    assert [c.settings.run_dir for c in planned] == [
        tmp_path / "clusters" / "demo",
        tmp_path / "clusters" / "demo-k8s",
    ]
    env = planned[1].env(settings)
    assert env["FLEETSIGHT_SCHEDULER"] == "kubernetes"
    assert env["FLEETSIGHT_SLACK_STAND_IN_URL"] == settings.url("slack_sink", "/services/local/webhook")
    clusters.write_plan(settings, planned)
    assert clusters.read_plan(settings) == planned


def test_scenarios_name_their_clusters(tmp_path: Path) -> None:
    planned = clusters.plan(Settings(run_dir=tmp_path), 1, (EAST, WEST))
    assert [(c.name, c.settings.cluster, c.settings.scheduler) for c in planned] == [
        ("east", "east", "slurm"),
        ("west", "west", "kubernetes"),
    ]


@pytest.mark.parametrize(
    ("count", "scenarios", "says"),
    [
        (3, (), "the shipped shapes make 2 clusters"),
        (3, (EAST, WEST), "give one scenario per cluster"),
        (1, (EAST, EAST), "two scenarios name the cluster 'east'"),
        (1, (EAST, "no-such-scenario"), "no-such-scenario"),
    ],
)
def test_a_plan_that_cannot_run_is_refused_with_the_reason(
    tmp_path: Path, count: int, scenarios: tuple[str, ...], says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        clusters.plan(Settings(run_dir=tmp_path), count, scenarios)


def test_a_damaged_plan_file_is_named(tmp_path: Path) -> None:
    settings = Settings(run_dir=tmp_path)
    clusters.plan_path(settings).write_text("{not json")
    with pytest.raises(clusters.PlanError, match=r"clusters\.json: not a clusters plan"):
        clusters.read_plan(settings)
