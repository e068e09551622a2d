"""The backfill runs only the exporters asked for (evaluation/backfill.py CaptureOptions.collectors), and
a family the rules read that none of them wrote is an error, never a quietly empty history."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from evaluation.backfill import CaptureOptions, backfill_blocks
from twin.history import BackfillError
from twin.scenario import from_dict

SCENARIO = {
    "seed": 11,
    "duration": "10m",
    "tick": "30s",
    "cluster": {"name": "t", "nodes": 2},
    "jobs": [{"id": "5101", "nodes": "n0001-n0002", "profile": "llm-8b"}],
    "faults": [],
}
IB_SYMBOLS = "fleetsight_infiniband_port_symbol_error_total"
PCIE_WIDTH = "fleetsight_pcie_link_width"
END = dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC)


def backfilled_names(tmp_path: Path, capture: CaptureOptions) -> dict[str, set[str]]:
    """Sample name -> the scrape jobs that wrote it, from the OpenMetrics the blocks were cut from."""
    blocks = tmp_path / "blocks"
    backfill_blocks(
        from_dict(SCENARIO), blocks, end=END, keep_openmetrics=True, truth=tmp_path / "truth.jsonl",
        capture=capture,
    )  # fmt: skip
    names: dict[str, set[str]] = {}
    for stream in tmp_path.glob("blocks-chunk-*.om"):
        for line in stream.read_text().splitlines():
            if line.startswith("#") or "{" not in line:
                continue
            name, labels = line.split("{", 1)
            job = labels.split('job="', 1)[1].split('"', 1)[0] if 'job="' in labels else ""
            names.setdefault(name, set()).add(job)
    return names


def test_only_the_collectors_asked_for_run(tmp_path: Path) -> None:
    capture = CaptureOptions(agent_step=60.0, families=frozenset({IB_SYMBOLS}), collectors=("infiniband",))
    names = backfilled_names(tmp_path, capture)
    assert names[IB_SYMBOLS] == {"fleetsight-node"}
    # The node agents' `up`, not the fabric exporter's nor the Lustre servers' agents': they did not run.
    assert names["up"] >= {"fleetsight-node"}
    assert not names["up"] & {"fleetsight-fabric", "fleetsight-lustre-server"}


def test_a_family_that_no_collector_run_writes_is_an_error(tmp_path: Path) -> None:
    everything = CaptureOptions(agent_step=60.0, families=frozenset({IB_SYMBOLS, PCIE_WIDTH}))
    assert PCIE_WIDTH in backfilled_names(tmp_path / "all", everything)  # the PCIe collector writes it
    narrow = CaptureOptions(
        agent_step=60.0, families=frozenset({IB_SYMBOLS, PCIE_WIDTH}), collectors=("infiniband",)
    )
    with pytest.raises(BackfillError, match=f"wrote no {PCIE_WIDTH}: run the collector"):
        backfilled_names(tmp_path / "narrow", narrow)
