"""The precursor kinds (twin/precursor_faults.py), simulated in process: an NVLink's and an HBM stack's
error counters climb over the fault, faster and faster, and the part fails at the fault's end (Xid 74;
DBE, Xid 48 and 63, a row remap pending), not before; dcgm-exporter's page publishes the counts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from twin import dcgm
from twin.fault_kinds import ALL_KINDS, FAULT_KINDS, PRECURSOR_KINDS
from twin.scenario import ScenarioError, load
from twin.sim import Simulation

SCENARIO = Path(__file__).resolve().parent / "scenarios" / "precursors.yaml"
NVLINK = (0, 3)  # n0001 GPU 3: nvlink_degrading from 1 h for 24 h
HBM = (1, 5)  # n0002 GPU 5: hbm_degrading from 2 h for 24 h, 2,000 correctable errors


@pytest.fixture(scope="module")
def run() -> tuple[Simulation, dict[str, np.ndarray]]:
    """The whole scenario, every counter of the two GPUs recorded each tick."""
    scenario = load(SCENARIO)
    sim = Simulation(scenario, scenario.start)
    names = ("nvlink_recovery", "nvlink_replay", "nvlink_crc_flit", "ecc_sbe", "remap_correctable", "ecc_dbe")
    series: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(int(scenario.duration / scenario.tick)):
        sim.advance()
        for name in names:
            where = HBM if name in ("ecc_sbe", "remap_correctable", "ecc_dbe") else NVLINK
            series[name].append(float(getattr(sim, name)[where]))
    return sim, {name: np.array(values) for name, values in series.items()}


def per_hour(counter: np.ndarray, tick_s: float = 60.0) -> np.ndarray:
    step = int(3600 / tick_s)
    return np.diff(counter[::step])


def test_nvlink_counters_climb_and_accelerate(run: tuple[Simulation, dict[str, np.ndarray]]) -> None:
    _, series = run
    hourly = per_hour(series["nvlink_replay"])  # hour h counts the errors of hour h..h+1
    assert hourly[1:7].sum() * 10 < hourly[19:25].sum(), "the last 6 hours count far more than the first"
    assert series["nvlink_recovery"][-1] > 50, "hundreds of recoveries at magnitude 300 (Poisson noise aside)"
    ratio = series["nvlink_replay"][-1] / series["nvlink_recovery"][-1]
    assert 10 < ratio < 40, "replays follow flit CRC errors, ~20 per recovery"
    assert series["nvlink_crc_flit"][-1] > series["nvlink_recovery"][-1]


def test_hbm_correctable_errors_and_remaps_climb(run: tuple[Simulation, dict[str, np.ndarray]]) -> None:
    _, series = run
    hourly = per_hour(series["ecc_sbe"])
    assert hourly[2:8].sum() * 10 < hourly[20:26].sum()
    assert 1500 < series["ecc_sbe"][-1] < 2500, "the magnitude is the total over the fault"
    assert series["remap_correctable"][-1] >= 20, "about one remap per 50 correctable errors"


def test_each_part_fails_at_the_faults_end_not_before(run: tuple[Simulation, dict[str, np.ndarray]]) -> None:
    sim, series = run
    xids = [(line.t, line.node, line.text) for line in sim.kernel_lines if "NVRM: Xid" in line.text]
    nvlink_end, hbm_end = 25 * 3600.0, 26 * 3600.0
    assert [(t, n) for t, n, text in xids if ": 74," in text] == [(nvlink_end, NVLINK[0])]
    assert {t for t, n, text in xids if n == HBM[0]} == {hbm_end}
    assert [text.split(": ")[2].split(",")[0] for _, n, text in xids if n == HBM[0]] == ["48", "63"]
    dbe_before = series["ecc_dbe"][: int(hbm_end / 60) - 1]
    assert not dbe_before.any() and series["ecc_dbe"][-1] == 1
    assert sim.remap_pending[HBM] == 1 and sim.remap_uncorrectable[HBM] == 1
    truth = {line["id"]: line for line in sim.truth_lines}
    assert truth["f1"]["jobs"] == ["3001"] and truth["f2"]["jobs"] == ["3001"]


def test_dcgm_exporter_publishes_the_nvlink_counters(run: tuple[Simulation, dict[str, np.ndarray]]) -> None:
    sim, series = run
    page = dcgm.metrics(sim, NVLINK[0])
    line = next(
        row
        for row in page.splitlines()
        if row.startswith("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL{") and 'gpu="3"' in row
    )
    assert line.endswith(f" {int(series['nvlink_recovery'][-1])}")
    assert "# TYPE DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL counter" in page


def test_background_nvlink_errors_are_rare_and_uneven() -> None:
    """Realism on, no fault: most healthy GPUs count no NVLink error in a day, a few count some."""
    scenario = replace(load(SCENARIO), faults=(), duration=86400.0, tick=600.0)
    scenario = replace(scenario, realism=replace(scenario.realism, background_errors=True))
    sim = Simulation(scenario, scenario.start)
    for _ in range(int(scenario.duration / scenario.tick)):
        sim.advance()
    flits = sim.nvlink_crc_flit
    assert (flits == 0).mean() > 0.5 and flits.max() > 0
    assert sim.nvlink_recovery.sum() <= flits.sum()


def test_a_magnitude_outside_physics_is_refused(tmp_path: Path) -> None:
    text = SCENARIO.read_text().replace("magnitude: 2000", "magnitude: 5")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ScenarioError, match=r"faults\[1\]\.magnitude"):
        load(bad)


def test_the_kinds_are_catalogued_but_never_drawn() -> None:
    """Seeded scenarios draw from FAULT_KINDS: a precursor kind there would change every one of them."""
    assert set(PRECURSOR_KINDS) <= set(ALL_KINDS) and not set(PRECURSOR_KINDS) & set(FAULT_KINDS)
