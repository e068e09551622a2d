"""fleetsight/search_pages.py's own rules, on pages as a search answers them (the whole read through a
real OpenSearch is tests/anomaly/test_sdc_log_store.py's last test)."""

from __future__ import annotations

import pytest

from fleetsight.search_pages import PagingError, complete_groups


def hit(name: str, *sort: object) -> dict:
    return {"_id": name, "sort": list(sort)}


def test_a_page_gives_up_the_group_it_ends_inside() -> None:
    page = [hit("a", 1, "n1"), hit("b", 2, "n1"), hit("c", 2, "n1")]
    assert [h["_id"] for h in complete_groups(page)] == ["a"]


def test_a_page_whose_last_hit_is_alone_gives_up_that_hit_only() -> None:
    page = [hit("a", 1, "n1"), hit("b", 1, "n1"), hit("c", 2, "n1")]
    assert [h["_id"] for h in complete_groups(page)] == ["a", "b"]


def test_a_page_of_one_group_or_without_sort_values_is_a_clear_error() -> None:
    with pytest.raises(PagingError, match="more than a page \\(2\\)"):
        complete_groups([hit("a", 1, "n1"), hit("b", 1, "n1")])
    with pytest.raises(PagingError, match="without sort values"):
        complete_groups([{"_id": "a"}, {"_id": "b"}])
