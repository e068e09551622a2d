"""The architecture as a test: the core imports no component, a component imports only the core (it
reaches another component over HTTP, Prometheus or Kafka), and the evaluation layer above them is
imported by none of them. Static (the source's import statements), so a new reach fails here by name."""

from __future__ import annotations

import ast
from pathlib import Path

from fleetsight.registry import REPO_ROOT

CORE = "fleetsight"
EVALUATION = "evaluation"
# Folders that sit above everything and may import anything; nothing imports them.
ABOVE = (EVALUATION, "tests", "bench")


def project_folders(root: Path = REPO_ROOT) -> list[str]:
    return sorted(
        p.name
        for p in root.iterdir()
        if p.is_dir() and ((p / "__init__.py").exists() or (p / "component.py").exists())
    )


def imports_of(folder: Path, root: Path) -> dict[str, set[str]]:
    """Top-level module -> the files of ``folder`` that import it (absolute imports only)."""
    found: dict[str, set[str]] = {}
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(root)))
    return found


def forbidden_reaches(root: Path = REPO_ROOT) -> list[str]:
    """``file -> folder`` for each import that crosses the layers: a component importing another
    component or the evaluation layer, the core importing a component."""
    folders = project_folders(root)
    components = [f for f in folders if f not in (CORE, *ABOVE)]
    bad = []
    for folder in [CORE, *components]:
        for module, files in imports_of(root / folder, root).items():
            if module in (*components, *ABOVE) and module != folder:
                bad += [f"{file} -> {module}" for file in sorted(files)]
    return sorted(bad)


def test_components_import_only_the_core_and_nothing_imports_the_evaluation_layer() -> None:
    assert {"twin", "exporters", "health", EVALUATION} <= set(project_folders())
    assert forbidden_reaches() == []


def test_a_reach_across_the_layers_is_named(tmp_path: Path) -> None:
    """The check can fail: a component that loads another, or the evaluation layer, is named."""
    for folder, text in {
        "fleetsight": "",
        "twin": "",
        "exporters": "from twin import layout\n",
        "health": "import evaluation.health\n",
        "evaluation": "from exporters import node\n",
    }.items():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
        (tmp_path / folder / "x.py").write_text(text)
    assert forbidden_reaches(tmp_path) == ["exporters/x.py -> twin", "health/x.py -> evaluation"]


def test_the_evaluation_layer_is_not_shipped() -> None:
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    packages = pyproject.split("packages = [", 1)[1].split("]", 1)[0]
    assert f'"{EVALUATION}"' not in packages
