"""`python -m evaluation.precursors`: scenarios in parallel through the real rules and Prometheus, the
node-days with the warning armed, and the bound the count puts on the false-warning rate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from evaluation.precursors import main, rate_bound

TINY = """name: {name}
description: two healthy nodes for 36 hours
seed: {seed}
start: 2027-02-01T00:00:00Z
duration: 36h
tick: 300s
cluster: {{name: {name}, nodes: 2}}
jobs:
  - {{id: "9901", name: llm-8b, nodes: 2, profile: llm-8b, checkpoint_interval: 2h}}
faults: []
"""


def test_the_bound_is_the_poisson_one() -> None:
    assert rate_bound(0, 3000.0) == pytest.approx(1000 * 2.9957 / 3000, rel=1e-3)  # the rule of three
    assert rate_bound(1, 1000.0) == pytest.approx(4.744, rel=1e-3)
    assert rate_bound(0, 0.0) is None


def test_two_scenarios_at_once_report_each_and_the_whole(tmp_path: Path) -> None:
    files = []
    for name, seed in (("tiny-a", 71), ("tiny-b", 72)):
        path = tmp_path / f"{name}.yaml"
        path.write_text(TINY.format(name=name, seed=seed))
        files += ["--scenario", str(path)]
    result = CliRunner().invoke(main, [*files, "--agent-step", "1h", "--processes", "2"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [r["scenario"] for r in report] == ["tiny-a", "tiny-b"]
    # 36 h of 2 nodes, armed after 29 h: 2 x 7 / 24 node-days each.
    assert [r["armed_node_days"] for r in report] == [0.6, 0.6]
    assert [r["node_days"] for r in report] == [3.0, 3.0]
    false = sum(r["false_warnings"] for r in report)
    assert f"all: {false} false warnings in 1.2 node-days with the warning armed" in result.stderr
