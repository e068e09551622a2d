"""bench/benign_days.py, the drawn days of benign training (issue 42's false flags per 1,000 node-hours
over days nobody tuned against): each day is a valid twin scenario with every training kind at least
twice and no fault, drawn from its seed alone, and the shipped days are what the script writes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fleetsight.settings import REPO_ROOT
from twin.fault_kinds import TRAINING_KINDS
from twin.scenario import load

SCRIPT = REPO_ROOT / "bench" / "benign_days.py"
SHIPPED = REPO_ROOT / "evaluation" / "scenarios" / "anomaly"


def draw(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
        check=False,
    )


def test_each_drawn_day_holds_every_training_kind_twice_and_no_fault(tmp_path: Path) -> None:
    result = draw(tmp_path, "--first-seed", "5100", "--count", "3")
    assert result.returncode == 0, result.stderr
    paths = [Path(line) for line in result.stdout.split()]
    assert [p.name for p in paths] == ["benign_day_5100.yaml", "benign_day_5101.yaml", "benign_day_5102.yaml"]
    for path in paths:
        scenario = load(path)  # the twin's own validation
        kinds = [fault.kind for fault in scenario.faults]
        assert all(kinds.count(kind) >= 2 for kind in TRAINING_KINDS), (path.name, kinds)
        assert all(fault.benign for fault in scenario.faults), path.name
        assert scenario.duration == 24 * 3600 and scenario.cluster.nodes == 32
        assert any(job.profile == "moe-8x22b" for job in scenario.jobs), path.name
        assert scenario.realism.benign_per_node_hour > 0, "the drawn benign kinds are on too"


def test_a_day_is_drawn_from_its_seed_alone_and_the_shipped_days_are_the_scripts(tmp_path: Path) -> None:
    shipped = sorted(SHIPPED.glob("benign_day_*.yaml"))
    assert shipped, "no drawn benign day is shipped"
    seeds = sorted(int(p.stem.rsplit("_", 1)[1]) for p in shipped)
    result = draw(tmp_path, "--first-seed", str(seeds[0]), "--count", str(seeds[-1] - seeds[0] + 1))
    assert result.returncode == 0, result.stderr
    for path in shipped:
        assert (tmp_path / path.name).read_text() == path.read_text(), path.name


def test_a_bad_count_is_a_clear_error(tmp_path: Path) -> None:
    result = draw(tmp_path, "--first-seed", "1", "--count", "0")
    assert result.returncode == 2 and "--count must be at least 1" in result.stderr
    assert list(tmp_path.iterdir()) == []
