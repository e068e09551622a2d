"""Reading every hit of a sorted Elasticsearch/OpenSearch search, page by page with ``search_after``,
when the sort is not unique.

``search_after`` resumes strictly after the sort values it is given. Log documents often share all of
them (the ranks of one host log a step in the same millisecond; a line indexed twice has the same file
and offset), so resuming from a page that ends inside such a group skips the group's other members.
Each full page here gives up its trailing group, and the next page starts after the document before
it: the group is read whole there. No point in time or ``_id`` sort is needed (Elasticsearch 8 refuses
to sort on ``_id``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

Hit = dict[str, Any]


class PagingError(RuntimeError):
    """A page that cannot be paged past: it has no sort values, or one group fills it."""


def sorted_pages(
    search: Callable[[dict[str, Any]], list[Hit]], body: dict[str, Any], page: int
) -> Iterator[list[Hit]]:
    """The hits of ``body`` (which holds the query and its ``sort``), in sort order, a page at a time.

    ``search`` runs one request body and returns its hits. A page that is entirely one group of equal
    sort values raises :class:`PagingError`: make the page larger or the sort finer."""
    after: list[Any] | None = None
    while True:
        request = {**body, "size": page}
        if after is not None:
            request["search_after"] = after
        hits = search(request)
        if len(hits) < page:
            yield hits
            return
        whole = complete_groups(hits)
        yield whole
        after = whole[-1]["sort"]


def complete_groups(hits: list[Hit]) -> list[Hit]:
    """A full page less the hits at its end that share the last one's sort values."""
    last = hits[-1].get("sort")
    if last is None:
        raise PagingError("the search answered a page without sort values: cannot page on")
    tied = 0
    while tied < len(hits) and hits[-1 - tied].get("sort") == last:
        tied += 1
    if tied == len(hits):
        raise PagingError(
            f"more than a page ({len(hits)}) of hits share the sort values {last}: cannot page past them"
        )
    return hits[:-tied]
