"""The project's shape, measured: modules over the line limit and import circles between its modules.

Run ``python tests/shape.py`` for the report (``--json`` for the figures alone); tests/test_shape.py holds
the project to it. Every import counts, including those under ``TYPE_CHECKING`` and inside functions: a
circle a reader must hold in their head is a circle whether or not Python meets it at start-up.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINE_LIMIT = 500
# folders that are not the product: the tests and the benchmarks (their own rules), tools and caches
NOT_PRODUCT = {"tests", "bench", ".venv", ".cache", "node_modules", ".git", "scripts", "secrets", "build"}


def product_files(root: Path = REPO) -> Iterator[Path]:
    """Every product .py file, walking past the folders that are not the product (pruned, not filtered:
    .venv and .cache hold many thousands of files)."""
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if d not in NOT_PRODUCT and not d.startswith("."))
        for name in sorted(files):
            if name.endswith(".py"):
                yield Path(folder) / name


def module_name(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def long_modules(root: Path = REPO, limit: int = LINE_LIMIT) -> dict[str, int]:
    """Product modules over the limit, with their line counts, longest first."""
    counts = {str(p.relative_to(root)): len(p.read_text().splitlines()) for p in product_files(root)}
    return dict(sorted(((f, n) for f, n in counts.items() if n > limit), key=lambda item: -item[1]))


def imported_modules(path: Path, name: str, known: set[str]) -> set[str]:
    """The project modules that this file imports (resolved: `from .x import y` is package.x, or
    package.x.y when y is itself a module)."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(resolve(alias.name, known) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".") if package else []
                anchor = anchor[: len(anchor) - (node.level - 1)] if node.level > 1 else anchor
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                candidate = f"{base}.{alias.name}" if base else alias.name
                found.add(candidate if candidate in known else resolve(base, known))
    found.discard(name)
    return {m for m in found if m in known}


def resolve(dotted: str, known: set[str]) -> str:
    """The longest known module that `dotted` names or lies in."""
    parts = dotted.split(".")
    while parts and ".".join(parts) not in known:
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path = REPO) -> dict[str, set[str]]:
    files = {module_name(p, root): p for p in product_files(root)}
    known = set(files)
    return {name: imported_modules(path, name, known) for name, path in files.items()}


def import_circles(root: Path = REPO) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted; a package importing its
    own submodules and being imported by them counts too."""
    graph = import_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(circles)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--limit", type=int, default=LINE_LIMIT, help="line limit (default %(default)s)")
    args = parser.parse_args()
    long = long_modules(limit=args.limit)
    circles = import_circles()
    if args.json:
        print(json.dumps({"long_modules": long, "import_circles": circles}, indent=2))
        return 0
    print(f"modules over {args.limit} lines (outside tests/ and bench/): {len(long)}")
    for file, lines in long.items():
        print(f"  {lines:5d}  {file}")
    print(f"import circles: {len(circles)}")
    for circle in circles:
        print("  " + " <-> ".join(circle))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
