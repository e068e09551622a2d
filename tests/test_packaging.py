"""A production install: `pip install fleetsight` without extras gives unambiguous import names, and the
node agent runs from it without the twin and without numpy; each folder's imports are declared in
pyproject.toml (the core dependencies or the folder's extra), and nothing declared goes unimported."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    # bcrypt is for basic auth only: an agent without a web config runs on a host that lacks it
    assert "bcrypt" not in imported


def test_a_command_whose_extra_is_missing_names_the_extra(production_venv: Path, tmp_path: Path) -> None:
    """Without extras, the twin's and the anomaly service's commands say what to install, without a
    traceback."""
    fleetsight = str(production_venv / "bin" / "fleetsight")
    twin_run = ["twin", "run", "--scenario", "case_05", "--out", str(tmp_path / "twin"), "--duration", "1m"]
    replay = ["anomaly", "replay", "--prometheus-url", "http://127.0.0.1:9", "--since", "1h"]
    cases = [(twin_run, "twin"), (replay, "anomaly")]
    for args, extra in cases:
        result = subprocess.run([fleetsight, *args], capture_output=True, text=True, timeout=120, cwd="/")
        assert result.returncode == 1, (args, result.stdout, result.stderr[-2000:])
        assert f"pip install 'fleetsight[{extra}]'" in result.stderr, (args, result.stderr[-2000:])
        assert "Traceback" not in result.stderr, (args, result.stderr[-2000:])


# -- Declared dependencies: what each shipped folder imports, against pyproject.toml -------------------

# The extra a folder's imports beyond the core dependencies belong to: the extra named like the folder,
# or the one named here (the node agent's NVML is optional even within exporters/).
EXTRA_OF_FOLDER = {"exporters": "gpu", "pipelines": "logs"}


def normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(requirements: list[str]) -> set[str]:
    return {normalised(re.match(r"[A-Za-z0-9._-]+", r)[0]) for r in requirements}  # type: ignore[index]


def third_party_imports(folder: Path) -> dict[str, set[str]]:
    """Top-level module -> files of the folder importing it, leaving out the standard library, the
    project's own folders and relative imports."""
    own = {p.name for p in REPO_ROOT.iterdir() if p.is_dir()} | {"fleetsight"}
    found: dict[str, set[str]] = {}
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for top in {name.split(".")[0] for name in names}:
                if top not in sys.stdlib_module_names and top not in own and top != "__future__":
                    found.setdefault(top, set()).add(str(path.relative_to(REPO_ROOT)))
    return found


def check_imports(project: dict[str, Any]) -> tuple[list[str], dict[str, set[str]]]:
    """Imports of each shipped folder that neither the core nor the folder's extra declares, and the
    distributions imported by the folders of each extra ("" for the core-only folders)."""
    core = requirement_names(project["project"]["dependencies"])
    extras = {
        name: requirement_names(reqs) for name, reqs in project["project"]["optional-dependencies"].items()
    }
    distributions = {
        m: {normalised(d) for d in ds} for m, ds in importlib.metadata.packages_distributions().items()
    }
    problems: list[str] = []
    imported: dict[str, set[str]] = {name: set() for name in ["", *extras]}
    for folder_name in project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]:
        extra = EXTRA_OF_FOLDER.get(folder_name, folder_name if folder_name in extras else "")
        for module, files in sorted(third_party_imports(REPO_ROOT / folder_name).items()):
            provided = distributions.get(module, set())
            imported[extra] |= provided
            if not provided & (core | extras.get(extra, set())):
                where = f"extra {extra!r}" if extra else "the core dependencies (the folder has no extra)"
                problems.append(
                    f"{min(files)} imports {module} ({', '.join(provided) or '?'}): not in {where}"
                )
    return problems, imported


def test_each_folder_imports_only_what_its_extra_declares_and_each_extra_is_imported() -> None:
    """Every third-party module a shipped folder imports comes from a core dependency or the folder's
    extra; every core dependency and every extra's dependency is imported by a folder that may use it.
    (The development environment installs all extras, so every imported module resolves here.)"""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    problems, imported = check_imports(project)
    unused_core = requirement_names(project["project"]["dependencies"]) - set().union(*imported.values())
    problems += [f"core dependency {name} is imported by no folder" for name in sorted(unused_core)]
    for extra, reqs in project["project"]["optional-dependencies"].items():
        problems += [
            f"extra {extra!r} declares {name}, imported by none of its folders"
            for name in sorted(requirement_names(reqs) - imported[extra])
        ]
    assert not problems, "\n".join(problems)
