"""The project's shape held: no product module over shape.LINE_LIMIT lines (tests/ and bench/ aside), and
no import circle between its modules (every import counted, TYPE_CHECKING ones too). `python
tests/shape.py` prints the same figures."""

from __future__ import annotations

from pathlib import Path

import shape


def test_no_product_module_is_over_the_line_limit() -> None:
    long = shape.long_modules()
    assert not long, (
        f"modules over {shape.LINE_LIMIT} lines: {long}; split them along their seams (one reason to change "
        "per file)"
    )


def test_no_import_circles() -> None:
    assert shape.import_circles() == [], "import circles: break them with a shared module or a Protocol"


def test_the_checker_finds_a_circle_and_a_long_module(tmp_path: Path) -> None:
    """The measure itself can fail: a two-module circle through a relative import under TYPE_CHECKING,
    and a module one line over the limit."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n"
    )
    (package / "b.py").write_text("from pkg import a\n" + "x = 1\n" * shape.LINE_LIMIT)
    (package / "c.py").write_text("from pkg.a import thing\n")
    assert shape.import_circles(tmp_path) == [["pkg.a", "pkg.b"]]
    assert shape.long_modules(tmp_path) == {"pkg/b.py": shape.LINE_LIMIT + 1}
