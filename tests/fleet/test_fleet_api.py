"""The global layer over two clusters' real health services (and, for job lookups, cluster a's real
Prometheus): a node and a job found without knowing their cluster, a name two clusters share found in
both, one cluster stopped (the others still answer, the missing one is named on every answer and in the
layer's own series, a lookup that may concern it is 503 and not 404), and its return. Reads only."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from fleetsight.settings import REPO_ROOT
from health.component import serve_command
from support import FLEETSIGHT, Process, installed, prometheus_server, quiet_ports, stopping, wait_until

A_TOKEN = "a-read-token-0123456789"
NODES = {"a": ["a-n001", "a-n002", "dgx-017"], "b": ["b-n001", "dgx-017"]}
JOB = "4711"


@dataclass
class Cluster:
    name: str
    folder: Path
    port: int
    env: dict[str, str]
    command: list[str]
    process: Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = Process(f"health-{self.name}", self.command, self.folder / "health.log", self.env)
        self.process.wait_ready(f"{self.url}/-/ready", timeout=60)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def job_history(folder: Path) -> Path:
    """Cluster a's Prometheus data: job 4711 ran on a-n001 over the last half hour (as the anomaly
    service publishes it), cut into a TSDB block with promtool."""
    folder.mkdir(parents=True)
    now = int(time.time())
    labels = f'cluster="a",node="a-n001",hpc_job="{JOB}",scheduler="slurm"'
    lines = ["# TYPE fleetsight_job_node_info gauge"]
    lines += [f"fleetsight_job_node_info{{{labels}}} 1 {at}" for at in range(now - 1800, now, 30)]
    (folder / "history.om").write_text("\n".join([*lines, "# EOF", ""]))
    command = [installed("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(folder / "history.om")]
    subprocess.run([*command, str(folder / "data")], check=True, capture_output=True)
    return folder


def health_cluster(root: Path, name: str, prometheus: str | None, token_reads: bool, port: int) -> Cluster:
    folder = root / name
    folder.mkdir()
    (folder / "nodes.txt").write_text("\n".join(NODES[name]) + "\n")
    policy = yaml.safe_load((REPO_ROOT / "health" / "policy.yml").read_text())
    policy["api"]["open_reads"] = not token_reads
    (folder / "policy.yml").write_text(yaml.safe_dump(policy))
    # the cluster's name from the environment, as the packages and the chart give it
    env = {**os.environ, "FLEETSIGHT_CLUSTER": name, "FLEETSIGHT_HEALTH_TOKENS": f"{A_TOKEN}=read"}
    command = serve_command(
        f"127.0.0.1:{port}", folder / "state", policy=folder / "policy.yml", prometheus=prometheus,
        extra=("--nodes-file", str(folder / "nodes.txt"), "--no-breaker-alert"),
    )  # fmt: skip
    cluster = Cluster(name, folder, port, env, command)
    cluster.start()
    return cluster


@dataclass
class Fleet:
    url: str
    clusters: dict[str, Cluster]

    def get(self, path: str, **params: Any) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", params=params, timeout=30)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("fleet")
    with prometheus_server(job_history(root / "prometheus-a"), {"global": {}}) as prometheus:
        a_port, b_port, port = quiet_ports(3)  # chosen at once: b restarts on its own port later
        a = health_cluster(root, "a", prometheus, token_reads=True, port=a_port)
        b = health_cluster(root, "b", None, token_reads=False, port=b_port)
        (root / "a.token").write_text(A_TOKEN + "\n")
        clusters = [
            {"name": "a", "health": a.url, "token_file": str(root / "a.token")},
            {"name": "b", "health": b.url},
        ]
        (root / "clusters.yml").write_text(yaml.safe_dump({"clusters": clusters}))
        command = [
            *FLEETSIGHT, "fleet", "serve", "--clusters-file", str(root / "clusters.yml"),
            "--listen", f"127.0.0.1:{port}", "--timeout", "3s", "--poll-interval", "1s",
        ]  # fmt: skip
        layer = Process("fleet", command, root / "fleet.log")
        try:
            with stopping(layer):
                layer.wait_ready(f"http://127.0.0.1:{port}/-/ready")
                yield Fleet(f"http://127.0.0.1:{port}", {"a": a, "b": b})
        finally:
            a.stop()
            b.stop()


def up_series(fleet: Fleet) -> dict[str, float]:
    text = fleet.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return {s.labels["cluster"]: s.value for s in families["fleetsight_fleet_cluster_up"].samples}


def test_every_cluster_answers_with_its_name_and_states(fleet: Fleet) -> None:
    body = fleet.get("/v1/clusters").json()
    assert body["missing"] == [] and body["count"] == 2
    by_name = {c["cluster"]: c for c in body["clusters"]}
    assert set(by_name) == {"a", "b"} and all(c["answers"] for c in by_name.values())
    assert sum(by_name["a"]["states"].values()) == 3 and sum(by_name["b"]["states"].values()) == 2
    nodes = fleet.get("/v1/nodes").json()
    assert sorted((n["cluster"], n["node"]) for n in nodes["nodes"]) == sorted(
        (cluster, node) for cluster, names in NODES.items() for node in names
    )
    assert wait_until(lambda: up_series(fleet) == {"a": 1.0, "b": 1.0} or None, timeout=30, what="both up")


def test_a_node_and_a_job_are_found_without_knowing_their_cluster(fleet: Fleet) -> None:
    found = fleet.get("/v1/nodes/b-n001").json()
    assert (found["count"], found["matches"][0]["cluster"], found["missing"]) == (1, "b", [])
    assert found["matches"][0]["node"] == "b-n001" and "state" in found["matches"][0]
    shared = fleet.get("/v1/nodes/dgx-017").json()  # two clusters may name a node alike: both answer
    assert sorted(m["cluster"] for m in shared["matches"]) == ["a", "b"]
    job = fleet.get(f"/v1/jobs/{JOB}/faults").json()  # only cluster a's Prometheus knows the job
    assert [(m["cluster"], m["job"]) for m in job["matches"]] == [("a", JOB)]
    assert [n["node"] for n in job["matches"][0]["nodes"]] == ["a-n001"]
    nowhere = fleet.get("/v1/nodes/z-n999")
    assert nowhere.status_code == 404 and "none of the clusters" in nowhere.json()["detail"]


def test_bad_input_is_the_callers_and_there_is_nothing_to_write(fleet: Fleet) -> None:
    window = fleet.get(f"/v1/jobs/{JOB}/faults", window="forever")
    assert window.status_code == 422 and "window" in window.json()["detail"]
    drain = httpx.post(f"{fleet.url}/v1/nodes/a-n001/drain", json={"reason": "x"}, timeout=10)
    assert drain.status_code in (404, 405)  # drains stay with each cluster's own health service


def test_a_stopped_cluster_is_named_missing_and_the_other_still_answers(fleet: Fleet) -> None:
    b = fleet.clusters["b"]
    b.stop()
    try:
        clusters = fleet.get("/v1/clusters").json()
        assert [m["cluster"] for m in clusters["missing"]] == ["b"]
        assert {c["cluster"]: c["answers"] for c in clusters["clusters"]} == {"a": True, "b": False}
        nodes = fleet.get("/v1/nodes").json()
        assert {n["cluster"] for n in nodes["nodes"]} == {"a"} and nodes["missing"][0]["cluster"] == "b"
        in_a = fleet.get("/v1/nodes/a-n001").json()
        assert in_a["matches"][0]["cluster"] == "a" and [m["cluster"] for m in in_a["missing"]] == ["b"]
        maybe_in_b = fleet.get("/v1/nodes/b-n001")  # it may be in the cluster that did not answer
        assert maybe_in_b.status_code == 503, maybe_in_b.text
        assert "b" in maybe_in_b.json()["detail"] and maybe_in_b.json()["missing"][0]["cluster"] == "b"
        assert wait_until(lambda: up_series(fleet).get("b") == 0.0 or None, timeout=30, what="b down")
        assert up_series(fleet)["a"] == 1.0
    finally:
        b.start()  # its state folder kept: the same cluster back
    back = wait_until(lambda: fleet.get("/v1/nodes/b-n001").json().get("matches"), timeout=30, what="b back")
    assert back[0]["cluster"] == "b"
    assert wait_until(lambda: up_series(fleet).get("b") == 1.0 or None, timeout=30, what="b up again")


def test_a_service_that_refuses_or_answers_as_another_cluster_is_not_trusted(
    tmp_path: Path, fleet: Fleet
) -> None:
    # "c" points at cluster b's service: its answers would be filed under the wrong name; "a" without its
    # token is refused: an absence it reports means nothing. Both are missing, each with the reason.
    clusters = [
        {"name": "c", "health": fleet.clusters["b"].url},
        {"name": "a", "health": fleet.clusters["a"].url},
    ]
    (tmp_path / "clusters.yml").write_text(yaml.safe_dump({"clusters": clusters}))
    result = subprocess.run(
        [*FLEETSIGHT, "fleet", "check", "--clusters-file", str(tmp_path / "clusters.yml")],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=60,
    )  # fmt: skip
    lines = dict(line.split(None, 1) for line in result.stdout.splitlines())
    assert result.returncode == 1, result.stdout + result.stderr
    assert "answers as cluster 'b'" in lines["c"] and "missing: this needs a bearer token" in lines["a"], (
        lines
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("clusters: []\n", "non-empty list"),
        ("clusters: [{name: 'a b', health: 'http://x:1'}]\n", "clusters[0].name"),
        ("clusters: [{name: a, health: 'x:1'}]\n", "clusters[0].health"),
        (
            "clusters: [{name: a, health: 'http://x:1'}, {name: a, health: 'http://y:1'}]\n",
            "a more than once",
        ),
        ("clusters: [{name: a, health: 'http://x:1', token_file: /nonexistent}]\n", "clusters[0].token_file"),
        ("clusters: [{name: a, health: 'http://x:1', helth: 1}]\n", "unknown keys helth"),
    ],
    ids=["empty", "name", "health-url", "twice", "token-file", "typo"],
)
def test_a_bad_clusters_file_is_a_clear_error(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "clusters.yml").write_text(content)
    result = subprocess.run(
        [*FLEETSIGHT, "fleet", "serve", "--clusters-file", str(tmp_path / "clusters.yml")],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, (
        result.stderr
    )


def test_the_chatbot_pointed_at_the_layer_names_each_nodes_cluster(fleet: Fleet) -> None:
    # the chatbot's live context reads the layer as it reads one health service (FLEETSIGHT_HEALTH_URL):
    # a node two clusters share is reported once per cluster, each named; a job from the cluster that ran it
    from chatbot.live import LiveSources, gather

    context = gather("is dgx-017 ok? job 4711 seems slow", LiveSources(health_url=fleet.url, timeout_s=10))
    summaries = [e.summary for e in context.evidence]
    assert sum("dgx-017 (cluster a) is" in s for s in summaries) == 1, summaries
    assert sum("dgx-017 (cluster b) is" in s for s in summaries) == 1, summaries
    assert any(s.startswith("job 4711 (cluster a): ") for s in summaries), summaries
    assert not context.notes, context.notes
