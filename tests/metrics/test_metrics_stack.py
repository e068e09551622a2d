"""The local stack in production's shape, on one shared stack (conftest.py): end-to-end alert delivery
from twin faults to the Slack stand-in, and what the HA pairs and Thanos promise when one of them stops.

The twin's faults (alert_faults.yaml) begin at fixed offsets from the twin's start; every test waits for
its own fault with a deadline, so each measures the same thing whatever ran before it. Outages are
short: a process is stopped in place (SIGSTOP) for as long as the test needs it down, or killed and
restarted by the supervisor. Alertmanager A is stopped by the fixture, before the first fault begins;
its test checks what arrived meanwhile and then brings it back. Each test prints its counts (pytest -s
shows them).
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from pathlib import Path

import httpx
import pytest
from metrics_helpers import (
    STACK_CLUSTER,
    MetricsStack,
    SlackMessage,
    about,
    api,
    component_pid,
    drop_blocks,
    fault,
    freeze,
    kill_for_restart,
    per_channel,
    raw_samples,
    slack_messages,
    spacing,
    thaw,
)

from support import wait_until

pytestmark = pytest.mark.stack

ONSET_TO_SLACK_LIMIT_S = 120  # the promise: a fault reaches Slack within 2 minutes of onset
DCGM_INTERVAL_S = 5.0  # metrics/prometheus.yml: the dcgm job's scrape_interval
PROMETHEUS_OUTAGE_S = 30.0
QUIET_AFTER_S = 20.0  # how long a test keeps watching for a duplicate after the last expected message


def messages_of(stack: MetricsStack) -> list[SlackMessage]:
    return slack_messages(stack.slack_record)


def first_messages(stack: MetricsStack, alertname: str, node: str, status: str, deadline_s: float):
    """Wait until some channel has the message; then give the other routes and the second Alertmanager
    a moment to post theirs (or their duplicates)."""
    found = wait_until(
        lambda: about(messages_of(stack), alertname, node, status),
        timeout=deadline_s,
        interval=0.5,
        what=f"a {status} {alertname} message about {node} in the Slack stand-in",
    )
    time.sleep(QUIET_AFTER_S)  # not synchronisation: the observation window for duplicates
    return found[0], about(messages_of(stack), alertname, node, status)


def assert_once_per_channel(messages: list[SlackMessage], what: str) -> dict[str, int]:
    counts = per_channel(messages)
    print(f"{what}: messages per channel {counts}")
    assert counts, f"no {what} message"
    assert all(count == 1 for count in counts.values()), f"{what}: duplicates per channel {counts}"
    return counts


def alertmanager_has_alert(url: str, alertname: str, node: str) -> bool:
    try:
        alerts = httpx.get(f"{url}/api/v2/alerts", timeout=5).json()
    except (httpx.HTTPError, json.JSONDecodeError):
        return False
    return any(a["labels"].get("alertname") == alertname and a["labels"].get("node") == node for a in alerts)


def test_every_series_and_alert_in_the_global_view_names_the_one_cluster(metrics_stack: MetricsStack) -> None:
    # FLEETSIGHT_CLUSTER reaches the twin's targets (the dcgm and node agent series carry it as a label),
    # Prometheus's external label (every other series, as Thanos shows it, and every alert): one name
    query = metrics_stack.url("thanos_query")

    def clusters(expression: str) -> set[str] | None:
        """The cluster names the expression's answer holds, once it holds any (Thanos Query finds its
        stores a moment after the stack is up; the twin's faults fire their alerts within minutes)."""
        result = api(query, "/api/v1/query", query=expression)["result"]
        return {item["metric"].get("cluster", "(none)") for item in result} or None

    every_series = 'count by (cluster) ({__name__=~".+"})'
    assert wait_until(lambda: clusters(every_series), timeout=120, what="series in the global view") == {
        STACK_CLUSTER
    }
    alerts = "count by (cluster, alertname) (ALERTS)"
    assert wait_until(lambda: clusters(alerts), timeout=240, what="an alert in the global view") == {
        STACK_CLUSTER
    }


# -------------------------------------------------------------------------- (b) Prometheus replica
def test_thanos_query_has_no_gap_and_no_duplicate_over_a_replica_outage(metrics_stack: MetricsStack) -> None:
    stack = metrics_stack
    query = stack.url("thanos_query")
    selector = 'DCGM_FI_DEV_POWER_USAGE{node="n0004",gpu="0"}'
    pid = component_pid(stack.run_dir, "prometheus-b")

    def scrapes_steadily(replica: str) -> bool:
        """A replica's own last 30 s hold at least four samples and no step under half an interval. A
        Prometheus that has just started (or reloaded its targets) may scrape twice within a second;
        the deduplicated view passes such a pair through from the replica it follows, which is the
        replica's doing, not the outage's, so the window opens only once both scrape in rhythm."""
        now = time.time()
        series = raw_samples(stack.url(replica), selector, now - 30, now)
        times = [float(t) for t, _ in series[0]["values"]] if series else []
        return len(times) >= 4 and spacing(times, DCGM_INTERVAL_S)[1] == 0

    for replica in ("prometheus", "prometheus_b"):
        wait_until(
            functools.partial(scrapes_steadily, replica), timeout=120, what=f"{replica} to scrape in rhythm"
        )
    start = time.time()

    def samples_so_far() -> int:
        series = raw_samples(query, selector, start, time.time(), dedup="true")
        return len(series[0]["values"]) if series else 0

    wait_until(lambda: samples_so_far() >= 4, timeout=60, what="a few samples before the outage")
    freeze(pid)
    stopped_at = time.time()
    try:
        time.sleep(PROMETHEUS_OUTAGE_S)  # the outage itself, not synchronisation
    finally:
        thaw(pid)
    resumed_at = time.time()
    end = resumed_at + 20
    replica_b = stack.url("prometheus_b")
    wait_until(
        lambda: raw_samples(replica_b, selector, resumed_at, time.time()),
        timeout=60,
        what="replica B to scrape again",
    )
    wait_until(lambda: time.time() > end + DCGM_INTERVAL_S, timeout=60, what="the window to end")

    (deduplicated,) = raw_samples(query, selector, start, end, dedup="true")
    timestamps = [float(t) for t, _ in deduplicated["values"]]
    gaps, duplicates, longest = spacing(timestamps, DCGM_INTERVAL_S)
    expected = (end - timestamps[0]) / DCGM_INTERVAL_S
    per_replica = {s["metric"]["replica"]: s for s in raw_samples(query, selector, start, end, dedup="false")}
    b_times = [float(t) for t, _ in per_replica["B"]["values"]]
    _, b_duplicates, b_longest = spacing(b_times, DCGM_INTERVAL_S)
    a_times = [float(t) for t, _ in per_replica["A"]["values"]]
    _, a_duplicates, a_longest = spacing(a_times, DCGM_INTERVAL_S)
    print(
        f"replica B stopped {resumed_at - stopped_at:.0f}s: Thanos query {len(timestamps)} samples "
        f"(~{expected:.0f} expected), {gaps} gaps, {duplicates} duplicates, longest step {longest:.1f}s; "
        f"replica A alone: {len(a_times)} samples, {a_duplicates} duplicates, longest step {a_longest:.1f}s; "
        f"replica B alone: {len(b_times)} samples, {b_duplicates} duplicates, longest step {b_longest:.1f}s"
    )
    assert sorted(per_replica) == ["A", "B"], per_replica.keys()
    assert b_longest >= PROMETHEUS_OUTAGE_S - DCGM_INTERVAL_S, (
        "replica B shows no outage: test proves nothing"
    )
    assert "replica" not in deduplicated["metric"]
    assert gaps == 0 and duplicates == 0
    assert longest < PROMETHEUS_OUTAGE_S - DCGM_INTERVAL_S, "a hole as long as the outage"
    assert len(timestamps) >= 0.8 * expected


# ----------------------------------------------------------------------------------- (d) Alertmanager
def test_with_one_alertmanager_stopped_an_alert_still_arrives_once(metrics_stack: MetricsStack) -> None:
    stack = metrics_stack
    psu = fault(stack.twin_out, "psu_failure", "n0003")
    pid = stack.frozen_alertmanager_pid  # stopped by the fixture, before the fault
    assert stack.alertmanager_stopped_at < psu.onset_unix, "Alertmanager A stopped after the fault began"

    first, firing = first_messages(stack, "PSUFailed", "n0003", "firing", psu.onset_unix + 180 - time.time())
    delay = first.received_at - psu.onset_unix
    print(f"Alertmanager A stopped: PSUFailed n0003 onset-to-Slack {delay:.1f}s")
    assert_once_per_channel(firing, "PSUFailed n0003 firing, Alertmanager A stopped")
    assert delay < ONSET_TO_SLACK_LIMIT_S

    # A comes back (killed while stopped, restarted by the supervisor): it rejoins the cluster, learns
    # from B's notification log that the message went out, and stays quiet when the alert reaches it.
    new_pid = kill_for_restart(stack.run_dir, "alertmanager", pid)
    url = stack.url("alertmanager")
    wait_until(
        lambda: alertmanager_has_alert(url, "PSUFailed", "n0003"),
        timeout=90,
        what="the restarted Alertmanager A to receive the active alert from Prometheus",
    )
    time.sleep(QUIET_AFTER_S)  # the window in which A would post a duplicate
    after = about(messages_of(stack), "PSUFailed", "n0003", "firing")
    print(f"after Alertmanager A's restart (pid {pid} -> {new_pid}): {len(after)} firing message(s)")
    assert per_channel(after) == per_channel(firing)


# ------------------------------------------------------------------------------ (c) sidecar restart
def data_digests(block: Path) -> dict[str, str]:
    """The block's data files (chunks and index) by digest: meta.json gains the sidecar's labels on
    upload, and tombstones are never uploaded (Thanos applies deletions at compaction instead)."""
    files = [block / "index", *sorted((block / "chunks").iterdir())]
    return {str(path.relative_to(block)): hashlib.sha256(path.read_bytes()).hexdigest() for path in files}


def test_a_restarted_sidecar_uploads_the_blocks_it_missed(metrics_stack: MetricsStack) -> None:
    stack = metrics_stack
    tsdb = stack.run_dir / "data" / "prometheus"
    bucket = stack.run_dir / "data" / "thanos-bucket"
    prometheus = stack.url("prometheus")
    sidecar = component_pid(stack.run_dir, "thanos-sidecar")
    freeze(sidecar)
    # While the sidecar is stopped, replica A gets four hours of history (backfilled blocks, loaded at
    # its restart rather than at its next once-a-minute block reload, to keep the test short).
    blocks = drop_blocks(stack.history, tsdb)
    kill_for_restart(stack.run_dir, "prometheus", component_pid(stack.run_dir, "prometheus"))

    def blocks_loaded() -> bool:
        data = httpx.get(f"{prometheus}/api/v1/query", params={"query": "prometheus_tsdb_blocks_loaded"})
        result = data.json()["data"]["result"]
        return bool(result) and float(result[0]["value"][1]) >= len(blocks)

    wait_until(blocks_loaded, timeout=60, interval=1, what="replica A to load the backfilled blocks")
    missed = [ulid for ulid in blocks if not (bucket / ulid / "meta.json").exists()]
    assert missed == blocks, "the stopped sidecar uploaded blocks: the test proves nothing"

    kill_for_restart(stack.run_dir, "thanos-sidecar", sidecar)
    wait_until(
        lambda: all((bucket / ulid / "meta.json").exists() for ulid in blocks),
        timeout=120,
        what="the restarted sidecar to upload every missed block",
    )
    lost_samples = 0
    for ulid in blocks:
        local = json.loads((tsdb / ulid / "meta.json").read_text())
        uploaded = json.loads((bucket / ulid / "meta.json").read_text())
        assert uploaded["stats"] == local["stats"], ulid
        assert uploaded["thanos"]["labels"].get("replica") == "A", uploaded["thanos"]
        assert data_digests(bucket / ulid) == data_digests(tsdb / ulid), f"{ulid}: files differ"
        lost_samples += local["stats"]["numSamples"] - uploaded["stats"]["numSamples"]
    samples = sum(json.loads((bucket / u / "meta.json").read_text())["stats"]["numSamples"] for u in blocks)
    shipped = json.loads((tsdb / "thanos.shipper.json").read_text())["uploaded"]
    print(
        f"sidecar restart: {len(blocks)} missed blocks, {len(set(blocks) & set(shipped))} uploaded, "
        f"{samples} samples in the bucket, {lost_samples} lost"
    )
    assert set(blocks) <= set(shipped)
    assert lost_samples == 0


# --------------------------------------------------------------------- (a) end to end, pair up
def test_psu_failure_reaches_slack_once_then_resolves(metrics_stack: MetricsStack) -> None:
    stack = metrics_stack
    psu = fault(stack.twin_out, "psu_failure", "n0001")
    deadline = psu.onset_unix + 180 - time.time()
    first, firing = first_messages(stack, "PSUFailed", "n0001", "firing", deadline)
    delay = first.received_at - psu.onset_unix
    print(f"PSUFailed n0001: onset-to-Slack {delay:.1f}s")
    channels = assert_once_per_channel(firing, "PSUFailed n0001 firing")
    assert all("docs/runbooks/PSUFailed.md" in m.text for m in firing)
    assert all(f"cluster: `{STACK_CLUSTER}`" in m.text for m in firing)  # the stack's one name
    assert delay < ONSET_TO_SLACK_LIMIT_S

    cleared = wait_until(
        lambda: about(messages_of(stack), "PSUFailed", "n0001", "resolved"),
        timeout=psu.end_unix + 240 - time.time(),
        interval=0.5,
        what="the resolved PSUFailed message",
    )
    time.sleep(QUIET_AFTER_S)
    resolved = about(messages_of(stack), "PSUFailed", "n0001", "resolved")
    print(f"PSUFailed n0001: fault end to resolved message {cleared[0].received_at - psu.end_unix:.1f}s")
    assert assert_once_per_channel(resolved, "PSUFailed n0001 resolved") == channels


def test_xid79_reaches_slack_once(metrics_stack: MetricsStack) -> None:
    """Its resolved message comes only ten minutes after the last Xid 79 (GPUFellOffBus counts new
    Xids over 10 m, by design: the GPU is gone until the node is power-cycled); bench/alert_delay.py
    --resolved-timeout 900 measures it."""
    stack = metrics_stack
    xid = fault(stack.twin_out, "xid", "n0002")
    deadline = xid.onset_unix + 180 - time.time()
    first, firing = first_messages(stack, "GPUFellOffBus", "n0002", "firing", deadline)
    delay = first.received_at - xid.onset_unix
    print(f"GPUFellOffBus n0002: onset-to-Slack {delay:.1f}s")
    assert_once_per_channel(firing, "GPUFellOffBus n0002 firing")
    assert all("docs/runbooks/GPUFellOffBus.md" in m.text for m in firing)
    assert delay < ONSET_TO_SLACK_LIMIT_S


def test_up_listed_every_component_with_its_url(metrics_stack: MetricsStack) -> None:
    out = metrics_stack.up_output
    for port_name in (
        "prometheus",
        "prometheus_b",
        "alertmanager",
        "alertmanager_b",
        "thanos_query",
        "thanos_sidecar_http",
        "thanos_sidecar_b_http",
        "thanos_store_http",
        "node_exporter",
    ):
        assert metrics_stack.url(port_name) in out, f"{port_name} URL missing from `fleetsight up`:\n{out}"
    assert "…" not in out
