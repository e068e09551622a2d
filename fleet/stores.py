"""The metrics side of the global view: which clusters a global Thanos Query can read right now.

Thanos Query's ``GET /api/v1/stores`` lists every store it has reached (sidecars, store gateways, rulers)
with its external label sets and ``lastError``; a store that stops answering stays listed, with its
labels and the error. So each cluster's stores are found by their ``cluster`` label, and a cluster whose
every *live* store fails (sidecars, rulers, receivers: the recent data) is missing from the global
metrics, even while its store gateway still serves its uploaded blocks (which end two hours back or
more). Thanos's own answers do not say so (docs/fleet.md); this names the cluster. An endpoint that
never answered has no labels: it is counted, unnamed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

# Store types (the keys of /api/v1/stores) that hold only a bucket's blocks, not the recent data.
HISTORY_TYPES = frozenset({"store"})


@dataclass
class ClusterStores:
    stores: int = 0
    answering: int = 0
    live_answering: int = 0  # answering stores with the recent data (not a store gateway)
    errors: list[str] = field(default_factory=list)

    @property
    def missing(self) -> bool:
        return self.live_answering == 0

    def why_missing(self) -> str:
        if self.errors:
            return "; ".join(self.errors[:2])
        return "only its store gateway answers (blocks two hours old and more): no store with its recent data"

    def as_json(self) -> dict[str, Any]:
        return {
            "stores": self.stores,
            "answering": self.answering,
            "live_answering": self.live_answering,
            "errors": self.errors[:3],
        }


@dataclass
class StoreView:
    clusters: dict[str, ClusterStores]
    unlabelled: int = 0  # stores without a cluster label (a never-reached endpoint, a store of no cluster)
    error: str = ""  # Thanos Query itself did not answer


def store_view(body: Any) -> StoreView:
    """Thanos Query's /api/v1/stores answer, per cluster (its ``cluster`` external label)."""
    view = StoreView({})
    groups = body.get("data") if isinstance(body, dict) else None
    for kind, stores in (groups or {}).items():
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
                    entry.live_answering += kind not in HISTORY_TYPES
    return view


async def read_stores(client: httpx.AsyncClient, thanos_url: str) -> StoreView:
    try:
        response = await client.get(f"{thanos_url.rstrip('/')}/api/v1/stores")
        response.raise_for_status()
        return store_view(response.json())
    except (httpx.HTTPError, ValueError) as exc:
        return StoreView({}, error=f"Thanos Query at {thanos_url}: {type(exc).__name__}: {exc}")
