"""A production install: `pip install fleetsight` without extras gives unambiguous import names, and the
node agent runs from it without the twin and without numpy."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetsight.settings import REPO_ROOT


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "uv", "build", "--wheel", "--out-dir", str(out), str(REPO_ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return next(out.glob("fleetsight-*.whl"))


@pytest.fixture(scope="module")
def production_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    venv = tmp_path_factory.mktemp("venv") / "prod"
    subprocess.run([sys.executable, "-m", "uv", "venv", "--python", sys.executable, str(venv)],
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "uv", "pip", "install", "--python", str(venv / "bin" / "python"), str(wheel)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    yield venv


def test_the_wheel_has_no_bare_generic_top_level_names(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        top = {
            name.split("/")[0] for name in archive.namelist() if not name.split("/")[0].endswith(".dist-info")
        }
    assert top and all(name == "fleetsight" or name.startswith("fleetsight_") for name in top), top


def test_a_production_install_has_no_numpy_and_runs_the_agent_without_the_twin(
    production_venv: Path, tmp_path: Path
) -> None:
    python = production_venv / "bin" / "python"
    numpy = subprocess.run([str(python), "-c", "import numpy"], capture_output=True, timeout=60)
    assert numpy.returncode != 0, "numpy is installed without any extra"

    help_text = subprocess.run([str(production_venv / "bin" / "fleetsight"), "--help"],
                               capture_output=True, text=True, timeout=60)  # fmt: skip
    assert help_text.returncode == 0, help_text.stderr
    assert "exporter" in help_text.stdout

    # -X importtime lists every module the process imported, on stderr.
    agent = subprocess.run(
        [str(python), "-X", "importtime", "-m", "fleetsight.cli",
         "exporter", "node", "--once", "--node", "n0001", "--sysfs-root", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd="/",
    )  # fmt: skip
    assert agent.returncode == 0, agent.stderr[-3000:]
    assert "fleetsight_collector_success" in agent.stdout
    imported = {
        line.split("|")[-1].strip().split(".")[0] for line in agent.stderr.splitlines() if "|" in line
    }
    assert "numpy" not in imported and "fleetsight_twin" not in imported and "twin" not in imported


def test_a_command_whose_extra_is_missing_names_the_extra(production_venv: Path, tmp_path: Path) -> None:
    """Without extras, the twin's and the anomaly service's commands say what to install, without a
    traceback."""
    fleetsight = str(production_venv / "bin" / "fleetsight")
    twin_run = ["twin", "run", "--scenario", "case_05", "--out", str(tmp_path / "twin"), "--duration", "1m"]
    cases = [(twin_run, "twin"), (["anomaly", "evaluate", "--scenario", "case_01"], "anomaly")]
    for args, extra in cases:
        result = subprocess.run([fleetsight, *args], capture_output=True, text=True, timeout=120, cwd="/")
        assert result.returncode == 1, (args, result.stdout, result.stderr[-2000:])
        assert f"pip install 'fleetsight[{extra}]'" in result.stderr, (args, result.stderr[-2000:])
        assert "Traceback" not in result.stderr, (args, result.stderr[-2000:])
