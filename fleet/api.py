"""The global read API: every cluster's health service behind one address (docs/fleet.md).

- ``GET /v1/clusters``: each cluster, whether it answers, how long it took, its node states, and (with a
  global Thanos Query) whether its metrics stores answer;
- ``GET /v1/nodes`` (``?state=``): every cluster's nodes, each item with its ``cluster``;
- ``GET /v1/nodes/{node}``: a node found without knowing its cluster (``matches``: one per cluster
  that has a node of that name);
- ``GET /v1/jobs/{job}/faults`` (``?window=``): a job's faults, from whichever cluster ran it;
- with ``--thanos-url``, ``/api/v1/...``: Prometheus's API of the global Thanos Query, every answer
  warning of each cluster it lacks (fleet/promql.py).

Every answer lists under ``missing`` the clusters that did not answer (with the reason), and a lookup that
found nothing while a cluster was missing is 503, not 404: the node may be in the missing cluster. There
are no write routes: drains and resumes stay with each cluster's own health service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any
from urllib.parse import quote

import httpx
from fastapi import Depends, FastAPI, HTTPException, Query, Response
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from fleetsight import auth

from .clusters import FanOut, Reply
from .promql import add_query_routes
from .stores import ClusterStores, StoreView, read_stores

log = logging.getLogger("fleet")

STATUS_PATH = "/v1/status"
QUERY_TIMEOUT_S = 120.0  # a range query over many clusters; Grafana's own default is 30 s


class Watch:
    """What the layer knows of each cluster from its last reply: the series Prometheus scrapes (a
    cluster that stops answering alerts once, from here), refreshed by every request and by a poll."""

    def __init__(self, fanout: FanOut, thanos_url: str | None = None) -> None:
        self.fanout, self.thanos_url = fanout, thanos_url
        self.thanos = httpx.AsyncClient(timeout=fanout.timeout_s) if thanos_url else None
        # Queries passed through to the global Query (fleet/promql.py) may take longer than a status.
        self.queries = httpx.AsyncClient(timeout=QUERY_TIMEOUT_S) if thanos_url else None
        self.registry = CollectorRegistry()

        def per_cluster(name: str, meaning: str) -> Gauge:
            return Gauge(name, meaning, ["cluster"], registry=self.registry)

        self.up = per_cluster(
            "fleetsight_fleet_cluster_up",
            "1 when the cluster's health service gave a usable answer to the last request, else 0",
        )
        self.seconds = per_cluster(
            "fleetsight_fleet_cluster_answer_seconds",
            "How long the cluster's health service took to answer the last request (or to fail)",
        )
        self.answered = per_cluster(
            "fleetsight_fleet_cluster_last_answer_timestamp_seconds",
            "When the cluster's health service last gave a usable answer",
        )
        self.metrics_up = per_cluster(
            "fleetsight_fleet_cluster_metrics_up",
            "1 when the global Thanos Query reads at least one of the cluster's stores, else 0",
        )
        for cluster in fanout.clusters:
            self.up.labels(cluster.name).set(0)

    async def stores(self) -> StoreView | None:
        """The global Thanos Query's stores per cluster (None without one); the series follow."""
        if self.thanos is None or self.thanos_url is None:
            return None
        view = await read_stores(self.thanos, self.thanos_url)
        if not view.error:
            for cluster in self.fanout.clusters:
                found = view.clusters.get(cluster.name)
                self.metrics_up.labels(cluster.name).set(0 if found is None or found.missing else 1)
        return view

    def note(self, replies: list[Reply]) -> None:
        for reply in replies:
            self.up.labels(reply.cluster).set(0 if reply.missing else 1)
            self.seconds.labels(reply.cluster).set(round(reply.seconds, 4))
            if not reply.missing:
                self.answered.labels(reply.cluster).set_to_current_time()

    async def ask(self, path: str, params: dict[str, Any] | None = None) -> list[Reply]:
        replies = await self.fanout.get(path, params)
        self.note(replies)
        return replies

    async def poll(self, interval_s: float) -> None:
        """Ask every cluster's status every ``interval_s``, so that the series stay true without traffic."""
        while True:
            try:
                for reply in await self.ask(STATUS_PATH):
                    if reply.missing:
                        log.warning(
                            "event=cluster_missing cluster=%s error=%s", reply.cluster, reply.why_missing()
                        )
                view = await self.stores()
                if view is not None and view.error:
                    log.warning("event=thanos_unreadable error=%s", view.error)
            except Exception:  # one bad round must not end the poll: said, and the next round retries
                log.exception("event=poll_failed")
            await asyncio.sleep(interval_s)


def create_app(
    fanout: FanOut, guard: auth.TokenGuard, poll_interval_s: float = 15.0, thanos_url: str | None = None
) -> FastAPI:
    """``thanos_url``: the global Thanos Query over every cluster's stores (each store's ``cluster``
    external label names its cluster), or None."""
    watch = Watch(fanout, thanos_url)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        poller = asyncio.create_task(watch.poll(poll_interval_s))
        try:
            yield
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
            await fanout.close()
            for client in (watch.thanos, watch.queries):
                if client is not None:
                    await client.aclose()

    app = FastAPI(
        title="FleetSight global layer",
        summary="One read API over every cluster's health service; says which clusters did not answer.",
        lifespan=lifespan,
    )
    reader = Depends(guard.require(auth.READ))
    add_own_routes(app, watch, reader)
    add_cluster_routes(app, watch, reader)
    if watch.queries is not None and watch.thanos_url is not None:
        names = [c.name for c in fanout.clusters]
        add_query_routes(app, reader, watch.queries, watch.thanos_url, names, watch.stores)
    return app


def add_own_routes(app: FastAPI, watch: Watch, reader: Any) -> None:
    @app.get("/", include_in_schema=False)
    async def root() -> dict[str, Any]:
        names = [c.name for c in watch.fanout.clusters]
        return {"service": "fleetsight-fleet", "docs": "/docs", "api": "/v1/clusters", "clusters": names}

    @app.get("/-/ready", include_in_schema=False)
    async def ready() -> dict[str, bool]:
        return {"ready": True}  # ready to answer: a missing cluster is part of the answer, not unreadiness

    @app.get("/metrics", include_in_schema=False, dependencies=[reader])
    async def metrics() -> Response:
        return Response(
            generate_latest(watch.registry), media_type="text/plain; version=0.0.4; charset=utf-8"
        )


def add_cluster_routes(app: FastAPI, watch: Watch, reader: Any) -> None:
    @app.get(
        "/v1/clusters",
        summary="Every cluster: whether it answers, in how long, its node states",
        dependencies=[reader],
    )
    async def clusters() -> dict[str, Any]:
        replies, view = await asyncio.gather(watch.ask(STATUS_PATH), watch.stores())
        urls = {c.name: c.health for c in watch.fanout.clusters}
        items = [cluster_item(reply, urls[reply.cluster]) for reply in replies]
        answer: dict[str, Any] = {"count": len(items), "clusters": items, "missing": gaps(replies)}
        if view is not None:
            add_metrics(answer, view)
        return answer

    @app.get(
        "/v1/nodes",
        summary="Every cluster's nodes, each with its cluster (filter with ?state=)",
        dependencies=[reader],
    )
    async def nodes(state: Annotated[list[str] | None, Query()] = None) -> Any:
        replies = await watch.ask("/v1/nodes", {"state": state} if state else None)
        bad = [r for r in replies if not r.missing and r.status != 200]
        if bad:  # a state the clusters do not know: the caller's mistake, said as the cluster said it
            raise HTTPException(bad[0].status or 422, bad[0].error)
        merged = [
            {"cluster": r.cluster, **item}
            for r in replies
            if not r.missing
            for item in r.body.get("nodes", [])
        ]
        return {"count": len(merged), "nodes": merged, "missing": gaps(replies)}

    @app.get("/v1/nodes/{node}", summary="One node, found in whichever cluster has it", dependencies=[reader])
    async def node(node: str) -> Any:
        replies = await watch.ask(f"/v1/nodes/{quote(node, safe='')}")
        return lookup(replies, f"node {node!r}", "node", node)

    @app.get(
        "/v1/jobs/{job:path}/faults",
        summary="A job's faults, from whichever cluster ran it (?window=)",
        dependencies=[reader],
    )
    async def job_faults(job: str, window: str | None = None) -> Any:
        replies = await watch.ask(
            f"/v1/jobs/{quote(job, safe='/')}/faults", {"window": window} if window else None
        )
        refused = [r for r in replies if r.status == 422]
        if refused:  # a bad window or job id is the caller's: every cluster would say the same
            raise HTTPException(422, refused[0].error)
        return lookup(replies, f"job {job!r}", "job", job)


def lookup(replies: list[Reply], what: str, key: str, value: str) -> Any:
    """A lookup's global answer: every cluster's match; 404 when no cluster has it and all answered, 503
    when none has it but some did not answer (it may be there)."""
    matches = [{**r.body, "cluster": r.cluster} for r in replies if not r.missing and r.status == 200]
    missing = gaps(replies)
    if matches:
        return {key: value, "count": len(matches), "matches": matches, "missing": missing}
    answered = [r.cluster for r in replies if not r.missing]
    if missing:
        lost = ", ".join(f"{g['cluster']} ({g['error']})" for g in missing)
        detail = f"{what} is in none of {', '.join(answered) or 'no cluster'}; not asked of: {lost}"
        return JSONResponse({"detail": detail, "missing": missing}, status_code=503)
    raise HTTPException(404, f"{what} is in none of the clusters ({', '.join(answered)})")


def add_metrics(answer: dict[str, Any], view: StoreView) -> None:
    """Each cluster's stores as the global Thanos Query sees them, and the clusters it cannot read."""
    if view.error:
        answer["metrics_missing"] = [
            {"cluster": i["cluster"], "error": view.error} for i in answer["clusters"]
        ]
        return
    answer["metrics_missing"] = []
    for item in answer["clusters"]:
        stores = view.clusters.get(item["cluster"])
        item["metrics"] = (stores or ClusterStores()).as_json()
        if stores is None or stores.missing:
            error = stores.why_missing() if stores else "no store with this cluster label"
            answer["metrics_missing"].append({"cluster": item["cluster"], "error": error})
    answer["metrics_unlabelled_stores"] = view.unlabelled


def cluster_item(reply: Reply, url: str) -> dict[str, Any]:
    item: dict[str, Any] = {"cluster": reply.cluster, "url": url, "answers": not reply.missing}
    item["answer_seconds"] = round(reply.seconds, 3)
    if reply.missing:
        return {**item, "error": reply.why_missing()}
    body = reply.body if isinstance(reply.body, dict) else {}
    return {**item, **{k: body.get(k) for k in ("updated", "states", "role", "breaker")}}


def gaps(replies: list[Reply]) -> list[dict[str, str]]:
    return [reply.gap() for reply in replies if reply.missing]
