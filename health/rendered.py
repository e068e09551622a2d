"""The health service's read answers, serialised once per refresh (:class:`Rendered`): a request copies
bytes, it does not walk the fleet, so a burst of prolog checks costs the service no decision time.

A module of its own: the worker that publishes a batch and the routes that answer from it both hold a
``Rendered``, and how the answers are cached (per node, per state filter) changes apart from either.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


class Rendered:
    """The read answers, serialised once per refresh: a request copies bytes, it does not walk the fleet."""

    def __init__(
        self,
        snapshot: dict[str, Any],
        drain_list: list[dict[str, Any]],
        previous: Rendered | None = None,
        changed: Iterable[str] | None = None,
        cluster: str = "",
    ) -> None:
        """With ``previous`` and ``changed``: only the changed nodes are serialised again (an event batch
        costs its own nodes, not the fleet). ``cluster``: the name every answer carries (a reader that
        merges several clusters' answers, or a person reading one, knows whose nodes these are)."""
        self.updated, self.cluster = snapshot["updated"], cluster
        nodes = snapshot["nodes"]
        incremental = previous is not None and changed is not None and len(previous.node_json) == len(nodes)
        names = list(changed or ()) if incremental else list(nodes)
        self.node_json = dict(previous.node_json) if incremental and previous else {}
        self.items = dict(previous.items) if incremental and previous else {}
        self.fitness = dict(previous.fitness) if incremental and previous else {}
        for n in names:
            item = nodes[n]
            self.node_json[n] = json.dumps({"cluster": cluster, **item}).encode()
            self.items[n] = {k: v for k, v in item.items() if k != "history"}
            self.fitness[n] = (
                item["fit"],
                item["state"],
                dedupe(r["summary"] or r["signal"] for r in item["reasons"]),
            )
        self.drain_json = json.dumps(
            {
                "cluster": cluster,
                "count": len(drain_list),
                "nodes": drain_list,
                "breaker": snapshot.get("breaker"),
            }
        ).encode()
        self.lists: dict[tuple[str, ...], bytes] = {}

    def node_list(self, states: list[str]) -> bytes:
        key = tuple(sorted(set(states)))
        cached = self.lists.get(key)
        if cached is None:
            items = [self.items[n] for n in sorted(self.items) if not key or self.items[n]["state"] in key]
            answer = {"cluster": self.cluster, "updated": self.updated, "count": len(items), "nodes": items}
            cached = json.dumps(answer).encode()
            self.lists[key] = cached
        return cached


def dedupe(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))
