"""``GET /v1/jobs/{job}/faults`` against a real Prometheus holding three hours of history, written with
``promtool tsdb create-blocks-from openmetrics`` (the series the anomaly service, the rules and the
fabric exporter would have left there) and loaded with FleetSight's own rule files (the runbooks and
summaries come from them):

- Slurm job 4711 on n0001-n0004, hit by two faults: an Xid on GPU 3 of n0002 (resolved two hours ago)
  and a flapping leaf port in front of n0004 (still firing; n0004 left the job 20 minutes ago);
- Kubernetes job ml/pretrain on n0005-n0006: a straggler, and an alert on the leaf port n0006 hangs
  off that names no host (mapped through the fabric's peers);
- job 4712 on n0007-n0008, untouched; n0009 (no job the anomaly service published) has an alert of its
  own;
- jobs the anomaly service never published, known only from the GPUs' job labels Prometheus recorded
  (``node_job:dcgm_gpus:group30s``): Slurm job 4713 on n0009 (dcgm-exporter's ``hpc_job``) and JobSet
  ml/finetune on n0010 (beside another JobSet of the namespace on n0011).
"""

from __future__ import annotations

import calendar
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from health_helpers import READ_TOKEN, REPO, fast_policy, start_health

from support import installed, prometheus_server, stopping, wait_until

STEP = 60
SPAN = 3 * 3600
READ = {"Authorization": f"Bearer {READ_TOKEN}"}
Series = tuple[str, dict[str, str], float, float, float]  # name, labels, from, to (s ago), value


def identity(job: str, node: str, scheduler: str, namespace: str = "", gone: float = 0) -> Series:
    labels = {"cluster": "test", "node": node, "hpc_job": job, "namespace": namespace, "scheduler": scheduler}
    return ("fleetsight_job_node_info", labels, SPAN, gone, 1)


def alert(name: str, frm: float, to: float, state: str = "firing", **labels: str) -> Series:
    return ("ALERTS", {"alertname": name, "alertstate": state, "cluster": "test", **labels}, frm, to, 1)


XID = {"node": "n0002", "gpu": "3", "xid": "48", "severity": "critical", "team": "sre"}
FLAP = {
    "side": "switch",
    "switch": "leaf-01",
    "switch_port": "7",
    "node": "n0004",
    "hca_port": "mlx5_2/1",
    "device": "mlx5_2",
    "port": "1",
    "hpc_job": "4711",
    "severity": "warning",
    "team": "sre",
}
LEAF_PORT = {"side": "switch", "switch": "leaf-02", "switch_port": "2", "severity": "critical", "team": "sre"}
HISTORY: list[Series] = [
    *(identity("4711", n, "slurm") for n in ("n0001", "n0002", "n0003")),
    identity("4711", "n0004", "slurm", gone=20 * 60),
    *(identity("ml/pretrain", n, "kubernetes", namespace="ml") for n in ("n0005", "n0006")),
    *(identity("4712", n, "slurm") for n in ("n0007", "n0008")),
    alert("GPUXidUncorrectable", 150 * 60, 120 * 60, **XID),
    (
        "ALERTS_FOR_STATE",
        {"alertname": "GPUXidUncorrectable", "cluster": "test", **XID},
        150 * 60,
        120 * 60,
        0,
    ),
    alert("InfiniBandLinkFlapping", 40 * 60, 0, **FLAP),
    alert(
        "GPUThermalThrottling", 60 * 60, 50 * 60, state="pending", node="n0001", gpu="0", severity="warning"
    ),
    alert("GPUXidUncorrectable", 90 * 60, 0, node="n0009", gpu="1", xid="48", severity="critical"),
    alert("InfiniBandPortDown", 70 * 60, 65 * 60, **LEAF_PORT),
    *(
        (
            "fleetsight_fabric_switch_port_peer_info",
            {"switch": s, "switch_port": p, "node": n, "hca_port": h},
            SPAN,
            0,
            1,
        )
        for s, p, n, h in (
            ("leaf-01", "7", "n0004", "mlx5_2/1"),
            ("leaf-02", "1", "n0005", "mlx5_1/1"),
            ("leaf-02", "2", "n0006", "mlx5_1/1"),
            ("leaf-02", "3", "n0007", "mlx5_1/1"),
        )
    ),
    *(
        (
            "node_job:dcgm_gpus:group30s",
            {"cluster": "test", "node": node, "modelName": "H100", **labels},
            SPAN,
            0,
            1,
        )
        for node, labels in (
            ("n0002", {"hpc_job": "4711"}),  # published too: the published identity wins
            ("n0009", {"hpc_job": "4713"}),
            ("n0010", {"namespace": "ml", "pod": "finetune-0", "jobset_sigs_k8s_io_jobset_name": "finetune"}),
            ("n0011", {"namespace": "ml", "pod": "eval-0", "jobset_sigs_k8s_io_jobset_name": "eval"}),
        )
    ),
    (
        "fleetsight_straggler",
        {"cluster": "test", "node": "n0006", "hpc_job": "ml/pretrain", "cause": "gray"},
        60 * 60,
        30 * 60,
        1,
    ),
]


def openmetrics(history: list[Series], now: int) -> str:
    """The history as one OpenMetrics document (a family's samples together, each series in time order)."""
    lines: list[str] = []
    for name in dict.fromkeys(s[0] for s in history):
        lines.append(f"# TYPE {name} gauge")
        for _, labels, frm, to, value in (s for s in history if s[0] == name):
            text = ",".join(f'{k}="{v}"' for k, v in labels.items())
            for at in range(now - int(frm), now - int(to) + 1, STEP):
                # ALERTS_FOR_STATE's value is the alert's activeAt: two minutes before it first fired
                sample = now - int(frm) - 120 if name == "ALERTS_FOR_STATE" else value
                lines.append(f"{name}{{{text}}} {sample} {at}")
    return "\n".join([*lines, "# EOF", ""])


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    folder = tmp_path_factory.mktemp("prometheus")
    now = int(time.time())
    (folder / "history.om").write_text(openmetrics(HISTORY, now))
    subprocess.run(
        [
            installed("promtool"),
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(folder / "history.om"),
            str(folder / "data"),
        ],
        check=True,
        capture_output=True,
    )
    rules = sorted(str(p) for p in (REPO / "rules").glob("*.yml"))
    config = {"global": {"evaluation_interval": "1h"}, "rule_files": rules}
    with prometheus_server(folder, config) as url:
        yield url, now


@pytest.fixture(scope="module")
def health(prometheus: tuple[str, int], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("health")
    process, url = start_health(
        folder,
        fast_policy(api={"open_reads": False}),
        ["--prometheus-url", prometheus[0]],
        tokens=f"{READ_TOKEN}=read",
    )
    with stopping(process):
        yield url


def faults(url: str, job: str, **params: str) -> httpx.Response:
    return httpx.get(f"{url}/v1/jobs/{job}/faults", params=params, headers=READ, timeout=20)


def by_name(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["alertname"]: f for f in body["faults"]}


def test_a_job_hit_by_two_faults_gets_both_with_evidence(health: str, prometheus: tuple[str, int]) -> None:
    response = faults(health, "4711")
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["job"], body["scheduler"], body["window"]) == ("4711", "slurm", "6h")
    assert [n["node"] for n in body["nodes"]] == [
        "n0001",
        "n0002",
        "n0003",
        "n0004",
    ]  # n0004 left, still listed
    assert body["count"] == 2 and body["active"] == 1
    xid, flap = body["faults"]  # oldest first
    assert xid["alertname"] == "GPUXidUncorrectable" and xid["nodes"] == ["n0002"] and xid["gpu"] == "3"
    assert xid["severity"] == "critical" and xid["active"] is False
    assert xid["runbook"] == "docs/runbooks/GPUXidUncorrectable.md"
    assert xid["evidence"]["labels"]["xid"] == "48" and xid["evidence"]["source"] == "prometheus ALERTS"
    now = prometheus[1]
    # first seen from ALERTS_FOR_STATE's activeAt (pending included), last seen when it resolved
    assert xid["first_seen"] == iso(now - 150 * 60 - 120)
    # Backfilled samples end with no staleness marker: Prometheus's 5-minute lookback extends them.
    assert 0 <= parse(xid["last_seen"]) - (now - 120 * 60) <= 5 * 60 + STEP
    assert flap["alertname"] == "InfiniBandLinkFlapping" and flap["nodes"] == ["n0004"]
    assert (flap["switch"], flap["switch_port"], flap["hca_port"]) == ("leaf-01", "7", "mlx5_2/1")
    assert flap["active"] is True and flap["evidence"]["labels"]["hpc_job"] == "4711"
    # the switch-side rule's summary (its static label side: switch picks it), labels filled in
    assert flap["summary"] == "InfiniBand port mlx5_2/1 on n0004 is flapping (leaf leaf-01 port 7)"
    assert flap["runbook"] == "docs/runbooks/InfiniBandLinkFlapping.md"


def test_the_health_services_own_view_of_the_nodes_comes_with_them(health: str) -> None:
    def flapping_reason() -> dict[str, Any] | None:
        nodes = {n["node"]: n for n in faults(health, "4711").json()["nodes"]}
        reasons = [r for r in nodes["n0004"]["reasons"] if r["signal"] == "InfiniBandLinkFlapping"]
        return nodes["n0004"] if reasons else None

    n0004 = wait_until(flapping_reason, timeout=30, what="n0004's flapping reason in the job's node list")
    assert n0004["state"] == "degraded"


def test_a_kubernetes_job_by_its_slash_id_encoded_or_not(health: str) -> None:
    def same_answer() -> httpx.Response | None:
        plain, encoded = faults(health, "ml/pretrain"), faults(health, "ml%2Fpretrain")
        assert plain.status_code == encoded.status_code == 200, plain.text
        # two reads a moment apart can straddle a query step (a still-firing alert's last_seen moves on):
        # read again until a pair agrees; a route that finds another job never does
        return plain if plain.json()["faults"] == encoded.json()["faults"] else None

    plain = wait_until(same_answer, timeout=30, what="the same faults for both spellings of the id")
    body = plain.json()
    assert (body["scheduler"], body["namespace"]) == ("kubernetes", "ml")
    found = by_name(body)
    assert set(found) == {"InfiniBandPortDown", "straggler"}
    port = found["InfiniBandPortDown"]
    assert port["nodes"] == ["n0006"] and port["evidence"]["nodes_from"] == "fabric peers"
    straggler = found["straggler"]
    assert straggler["nodes"] == ["n0006"] and straggler["evidence"]["labels"]["cause"] == "gray"
    assert straggler["runbook"] == "docs/runbooks/StragglerNode.md"


def test_a_job_with_no_fault_and_the_window(health: str) -> None:
    quiet = faults(health, "4712")
    assert quiet.status_code == 200 and quiet.json()["faults"] == [] and quiet.json()["count"] == 0
    # the Xid resolved two hours ago falls out of a one-hour window
    recent = faults(health, "4711", window="1h").json()
    assert [f["alertname"] for f in recent["faults"]] == ["InfiniBandLinkFlapping"]
    bad = faults(health, "4711", window="soon")
    assert bad.status_code == 422 and "window" in bad.json()["detail"]


def test_an_unknown_job_is_a_404_that_says_so_and_reads_need_the_token(health: str) -> None:
    response = faults(health, "9999")
    assert response.status_code == 404
    assert "unknown job '9999'" in response.json()["detail"]
    assert httpx.get(f"{health}/v1/jobs/4711/faults", timeout=10).status_code == 401


def test_prometheus_gone_is_a_502_that_names_it(tmp_path: Path) -> None:
    process, url = start_health(
        tmp_path, fast_policy(), ["--prometheus-url", "http://127.0.0.1:9"], tokens=f"{READ_TOKEN}=read"
    )
    with stopping(process):
        response = faults(url, "4711")
    assert response.status_code == 502 and "http://127.0.0.1:9" in response.json()["detail"]


def iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def parse(text: str) -> float:
    return calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ"))


def test_the_chatbot_answers_why_a_job_is_slow_from_its_faults(health: str) -> None:
    """The chatbot's job look-up against this real health service: the faults become evidence and
    the runbooks their alerts name are cited first."""
    from chatbot.answer import Answerer, ChatConfig
    from chatbot.live import LiveSources

    sources = LiveSources(health_url=health, health_token=READ_TOKEN, timeout_s=10)
    answerer = Answerer(ChatConfig(repo_root=REPO, live=sources))
    answer = answerer.answer("why is job 4711 slow?")
    faults = [e["summary"] for e in answer.evidence if e["subject"] == "job 4711"]
    # the job's answer names its cluster (its fleetsight_job_node_info's label), and the fact says it
    flapping = "job 4711 (cluster test): InfiniBand port mlx5_2/1 on n0004 is flapping (leaf leaf-01 port 7)"
    assert f"{flapping} (firing)" in faults
    assert any("n0002" in f and "resolved" in f for f in faults), faults
    named = {"docs/runbooks/InfiniBandLinkFlapping.md", "docs/runbooks/GPUXidUncorrectable.md"}
    assert named <= set(answer.cited_files[:3]), answer.cited_files
    kubernetes = answerer.answer("is job ml/pretrain slow?")
    assert "docs/runbooks/StragglerNode.md" in kubernetes.cited_files
    unknown = answerer.answer("why is job 9999 slow?")
    assert "health service: no job 9999 in its window" in unknown.notes


def test_every_read_answer_names_the_cluster(health: str) -> None:
    # a reader that merges several clusters' answers (or a person reading one) knows whose nodes these are;
    # start_health names the cluster "test"
    def nodes() -> dict[str, Any] | None:
        body = httpx.get(f"{health}/v1/nodes", headers=READ, timeout=20).json()
        return body if body["nodes"] else None

    listed = wait_until(nodes, timeout=30, what="the nodes the service found in Prometheus")
    node = listed["nodes"][0]["node"]
    answers = {
        path: httpx.get(f"{health}{path}", headers=READ, timeout=20).json()
        for path in ("/v1/status", f"/v1/nodes/{node}", "/v1/drain-list")
    }
    assert {path: body.get("cluster") for path, body in answers.items()} | {
        "/v1/nodes": listed["cluster"]
    } == {
        "/v1/status": "test",
        f"/v1/nodes/{node}": "test",
        "/v1/drain-list": "test",
        "/v1/nodes": "test",
    }


def test_a_job_the_anomaly_service_never_published_is_found_from_the_gpus_recorded_labels(
    health: str,
) -> None:
    """The anomaly service publishes a job's nodes only while it watches (it may start late, or be down):
    the GPUs' own job labels, recorded by Prometheus every 30 s, name the nodes it never saw."""
    slurm = faults(health, "4713")
    assert slurm.status_code == 200, slurm.text
    body = slurm.json()
    assert (body["scheduler"], [n["node"] for n in body["nodes"]]) == ("hpc_job-label", ["n0009"])
    assert [(f["alertname"], f["nodes"]) for f in body["faults"]] == [("GPUXidUncorrectable", ["n0009"])]
    kubernetes = faults(health, "ml/finetune")
    assert kubernetes.status_code == 200, kubernetes.text
    body = kubernetes.json()
    assert (body["scheduler"], body["namespace"], body["cluster"]) == ("kubernetes", "ml", "test")
    assert [n["node"] for n in body["nodes"]] == ["n0010"]  # n0011 runs the namespace's other JobSet
    assert faults(health, "ml/nothing").status_code == 404
