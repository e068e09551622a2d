"""The metrics side of the global view on real servers: two clusters' Prometheus (each with its
`cluster` external label) and Thanos sidecars under one global Thanos Query, and the layer reading it.
One cluster stopped: the global query still answers for the other (warning of the store it could not
reach), the layer names the missing cluster, and the other's data has no gap; the cluster back, both
answer again."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from support import (
    FLEETSIGHT,
    Process,
    prometheus_with_sidecar,
    quiet_ports,
    stopping,
    thanos_binary,
    wait_until,
)

SCRAPE_S = 2


@dataclass
class ClusterMetrics:
    """One cluster's Prometheus and sidecar, stoppable and restartable on the same ports and data."""

    name: str
    folder: Path
    prometheus_port: int
    grpc_port: int
    http_port: int
    processes: list[Process]

    def start(self) -> None:
        labels = {"cluster": self.name, "replica": "A"}
        itself = {
            "job_name": "prometheus",
            "static_configs": [{"targets": [f"127.0.0.1:{self.prometheus_port}"]}],
        }
        config = {
            "global": {"scrape_interval": f"{SCRAPE_S}s", "external_labels": labels},
            "scrape_configs": [itself],
        }
        (self.folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        prometheus, sidecar = prometheus_with_sidecar(
            self.name, self.folder, self.prometheus_port, self.grpc_port, self.http_port
        )
        self.processes = [prometheus]
        self.processes.append(sidecar)

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()


@dataclass
class Global:
    query: str
    layer: str
    clusters: dict[str, ClusterMetrics]

    def ask(self, expression: str, **params: Any) -> dict[str, Any]:
        return httpx.get(
            f"{self.query}/api/v1/query", params={"query": expression, **params}, timeout=30
        ).json()

    def ask_layer(self, expression: str) -> dict[str, Any]:
        """A PromQL query through the layer's /api/v1/query, as Grafana posts it (a form)."""
        return httpx.post(f"{self.layer}/api/v1/query", data={"query": expression}, timeout=30).json()

    def clusters_view(self) -> dict[str, Any]:
        return httpx.get(f"{self.layer}/v1/clusters", timeout=30).json()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Global]:
    root = tmp_path_factory.mktemp("fleet-thanos")
    ports = iter(quiet_ports(12))  # every server's port chosen at once: none can take another's
    clusters = {}
    for name in ("a", "b"):
        (root / name).mkdir()
        clusters[name] = ClusterMetrics(name, root / name, next(ports), next(ports), next(ports), [])
        clusters[name].start()
    query_port = next(ports)
    query = Process(
        "thanos-query",
        [
            thanos_binary(), "query", f"--http-address=127.0.0.1:{query_port}",
            f"--grpc-address=127.0.0.1:{next(ports)}",
            "--query.replica-label=replica", "--query.partial-response",
            *(f"--endpoint=127.0.0.1:{c.grpc_port}" for c in clusters.values()),
        ],
        root / "query.log",
    )  # fmt: skip
    # the clusters' health services are not part of this test: their ports are closed
    entries = [{"name": name, "health": f"http://127.0.0.1:{next(ports)}"} for name in clusters]
    (root / "clusters.yml").write_text(yaml.safe_dump({"clusters": entries}))
    layer_port = next(ports)
    layer = Process(
        "fleet",
        [
            *FLEETSIGHT, "fleet", "serve", "--clusters-file", str(root / "clusters.yml"),
            "--listen", f"127.0.0.1:{layer_port}", "--timeout", "2s", "--poll-interval", "1s",
            "--thanos-url", f"http://127.0.0.1:{query_port}",
        ],
        root / "fleet.log",
    )  # fmt: skip
    try:
        with stopping(query), stopping(layer):
            query.wait_ready(f"http://127.0.0.1:{query_port}/-/ready")
            layer.wait_ready(f"http://127.0.0.1:{layer_port}/-/ready")
            yield Global(f"http://127.0.0.1:{query_port}", f"http://127.0.0.1:{layer_port}", clusters)
    finally:
        for cluster in clusters.values():
            cluster.stop()


def clusters_in(answer: dict[str, Any]) -> set[str]:
    return {item["metric"].get("cluster", "(none)") for item in answer["data"]["result"]}


def metrics_up(world: Global) -> dict[str, float]:
    text = httpx.get(f"{world.layer}/metrics", timeout=10).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return {s.labels["cluster"]: s.value for s in families["fleetsight_fleet_cluster_metrics_up"].samples}


def read_by_layer(world: Global, missing: list[str]) -> dict[str, Any] | None:
    """The layer's /v1/clusters once exactly ``missing`` are the clusters whose metrics it cannot read."""
    view = world.clusters_view()
    return view if [m["cluster"] for m in view["metrics_missing"]] == missing else None


def test_one_cluster_down_the_global_view_answers_for_the_other_and_names_it(world: Global) -> None:
    both = wait_until(
        lambda: clusters_in(world.ask("count by (cluster) (up)")) == {"a", "b"} or None,
        timeout=60,
        what="both clusters' series through the global Thanos Query",
    )
    assert both
    view = wait_until(lambda: read_by_layer(world, missing=[]), timeout=60, what="both clusters read")
    assert {i["cluster"]: i["metrics"]["answering"] for i in view["clusters"]} == {"a": 1, "b": 1}
    through = world.ask_layer("count by (cluster) (up)")
    assert clusters_in(through) == {"a", "b"} and not through.get("warnings"), through
    b = world.clusters["b"]
    outage_began = time.time()
    b.stop()
    try:
        view = wait_until(lambda: read_by_layer(world, missing=["b"]), timeout=60, what="b's store failing")
        assert [m["cluster"] for m in view["metrics_missing"]] == ["b"], view
        assert f"127.0.0.1:{b.grpc_port}" in view["metrics_missing"][0]["error"]
        assert wait_until(lambda: metrics_up(world) == {"a": 1.0, "b": 0.0} or None, timeout=30, what="b 0")
        partial = world.ask("count by (cluster) (up)", partial_response="true")
        assert partial["status"] == "success" and clusters_in(partial) == {"a"}, partial
        print("Thanos Query's warnings with b down:", partial.get("warnings"))
        # The same query through the layer: the same answer, and a warning naming b (Grafana shows it).
        through = world.ask_layer("count by (cluster) (up)")
        assert through["status"] == "success" and clusters_in(through) == {"a"}, through
        assert [w for w in through["warnings"] if "cluster b is missing" in w], through
        assert not [w for w in through["warnings"] if "cluster a" in w], through
        time.sleep(3 * SCRAPE_S)  # not synchronisation: the span the outage must cover in a's data
    finally:
        b.start()
    outage_ended = time.time()
    wait_until(
        lambda: clusters_in(world.ask("count by (cluster) (up)")) == {"a", "b"} or None,
        timeout=90,
        what="cluster b back in the global view",
    )
    assert wait_until(lambda: metrics_up(world) == {"a": 1.0, "b": 1.0} or None, timeout=60, what="b back")
    # cluster a's data has no gap over b's outage: a sample every scrape interval, as before
    window = round(time.time() - outage_began + 5)
    samples = world.ask(f'up{{cluster="a"}}[{window}s]', time=f"{outage_ended:.3f}")["data"]["result"]
    stamps = sorted(float(t) for t, _ in samples[0]["values"])
    gaps = [later - earlier for earlier, later in itertools.pairwise(stamps)]
    assert stamps[0] <= outage_began and max(gaps) < 3 * SCRAPE_S, gaps


def test_the_layer_passes_on_prometheus_api_answers_and_errors_as_the_query_gives_them(world: Global) -> None:
    labels = httpx.get(f"{world.layer}/api/v1/label/cluster/values", timeout=30).json()
    assert labels["status"] == "success" and {"a", "b"} <= set(labels["data"]), labels
    bad = httpx.get(f"{world.layer}/api/v1/query", params={"query": "sum(("}, timeout=30)
    direct = httpx.get(f"{world.query}/api/v1/query", params={"query": "sum(("}, timeout=30)
    assert bad.status_code == direct.status_code == 400
    assert bad.json()["errorType"] == direct.json()["errorType"] == "bad_data"
    # reads only: Thanos Query's admin routes are not reachable through the layer
    assert httpx.post(f"{world.layer}/api/v1/admin/tsdb/delete_series", timeout=30).status_code == 404
