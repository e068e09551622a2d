"""The metrics side of the global view: which clusters a global Thanos Query can read right now.

Thanos Query's ``GET /api/v1/stores`` lists every store it has reached (sidecars, store gateways, rulers)
with its external label sets and ``lastError``; a store that stops answering stays listed, with its
labels and the error. So each cluster's stores are found by their ``cluster`` label, and a cluster whose
every store fails is missing from the global metrics (Thanos's own answers then carry partial-response
warnings naming the store's address, not the cluster: this names the cluster). An endpoint that never
answered has no labels: it is counted, unnamed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class ClusterStores:
    stores: int = 0
    answering: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def missing(self) -> bool:
        return self.answering == 0

    def as_json(self) -> dict[str, Any]:
        return {"stores": self.stores, "answering": self.answering, "errors": self.errors[:3]}


@dataclass
class StoreView:
    clusters: dict[str, ClusterStores]
    unlabelled: int = 0  # stores without a cluster label (a never-reached endpoint, a store of no cluster)
    error: str = ""  # Thanos Query itself did not answer


def store_view(body: Any) -> StoreView:
    """Thanos Query's /api/v1/stores answer, per cluster (its ``cluster`` external label)."""
    view = StoreView({})
    groups = body.get("data") if isinstance(body, dict) else None
    for stores in (groups or {}).values():
        for store in stores or []:
            names = {
                labels.get("cluster") for labels in store.get("labelSets") or [] if labels.get("cluster")
            }
            if not names:
                view.unlabelled += 1
            for name in names:
                entry = view.clusters.setdefault(name, ClusterStores())
                entry.stores += 1
                if store.get("lastError"):
                    entry.errors.append(f"{store.get('name', '?')}: {store['lastError']}")
                else:
                    entry.answering += 1
    return view


async def read_stores(client: httpx.AsyncClient, thanos_url: str) -> StoreView:
    try:
        response = await client.get(f"{thanos_url.rstrip('/')}/api/v1/stores")
        response.raise_for_status()
        return store_view(response.json())
    except (httpx.HTTPError, ValueError) as exc:
        return StoreView({}, error=f"Thanos Query at {thanos_url}: {type(exc).__name__}: {exc}")
