"""Every panel of every generated dashboard sits inside Grafana's 24-column grid and no two panels
overlap: the builder (dashboards/build.py) places panels left to right from their widths, so a wide
panel after a half-full line lands past the right edge (the researcher dashboard's faults table did).
No Grafana needed: the layout is in the JSON the catalogue builds."""

from __future__ import annotations

from itertools import combinations

import pytest

from dashboards import build, catalog
from dashboards.model import Dashboard, Panel, Row, q

GRID_COLUMNS = 24


def boxes(spec: Dashboard) -> list[tuple[str, dict[str, int]]]:
    """(title, gridPos) of each panel of the built dashboard, its rows included."""
    return [(panel.get("title", "?"), panel["gridPos"]) for panel in build.build(spec)["panels"]]


def outside_grid(spec: Dashboard) -> list[str]:
    return [
        f"{title}: {pos}"
        for title, pos in boxes(spec)
        if not (pos["x"] >= 0 and pos["w"] > 0 and pos["h"] > 0 and pos["x"] + pos["w"] <= GRID_COLUMNS)
    ]


def overlap(a: dict[str, int], b: dict[str, int]) -> bool:
    return (
        a["x"] < b["x"] + b["w"]
        and b["x"] < a["x"] + a["w"]
        and a["y"] < b["y"] + b["h"]
        and b["y"] < a["y"] + a["h"]
    )


def overlapping(spec: Dashboard) -> list[str]:
    return [f"{a} / {b}" for (a, pa), (b, pb) in combinations(boxes(spec), 2) if overlap(pa, pb)]


@pytest.mark.parametrize("spec", catalog.DASHBOARDS, ids=lambda spec: spec.uid)
def test_every_panel_fits_the_24_column_grid(spec: Dashboard) -> None:
    assert outside_grid(spec) == [], f"{spec.uid}: panels outside the {GRID_COLUMNS}-column grid"


@pytest.mark.parametrize("spec", catalog.DASHBOARDS, ids=lambda spec: spec.uid)
def test_no_two_panels_overlap(spec: Dashboard) -> None:
    assert overlapping(spec) == [], f"{spec.uid}: overlapping panels"


def test_a_wide_panel_after_a_half_line_is_caught() -> None:
    """The grid check can fail: the layout the researcher dashboard had (a half-width panel, then a
    full-width one) puts the wide panel at x=12, past the right edge."""
    up = (q("up"),)
    spec = Dashboard(
        uid="grid-check",
        title="grid check",
        persona="test",
        question="Does the grid check see an overflow?",
        rows=(Row("r", (Panel("half", "stat", up), Panel("wide", "table", up, width=24))),),
    )
    assert [line.split(":")[0] for line in outside_grid(spec)] == ["wide"]


def test_overlap_is_any_shared_cell_and_touching_edges_are_not() -> None:
    box = {"x": 0, "y": 0, "w": 12, "h": 8}
    assert overlap(box, {"x": 11, "y": 7, "w": 12, "h": 8})
    assert not overlap(box, {"x": 12, "y": 0, "w": 12, "h": 8})  # side by side
    assert not overlap(box, {"x": 0, "y": 8, "w": 24, "h": 1})  # the next row header below
