"""Two health replicas, one writer (issue 37): the takeover trace on a real API server.

Starts a real Kubernetes control plane (tests/deploy/kube.py: etcd, kube-apiserver, controllers, kwok),
a real Alertmanager, NODES Node objects, and two `fleetsight health serve --leader-election-*`
replicas (A, B) on one Lease. A node fails (a critical alert in Alertmanager); the leader drains it and
one round of `fleetsight health kubernetes-sync` against each replica applies it (the follower's round
writes nothing); another node's reason is cleared and held. Then, twice:

1. crash: SIGKILL of the leader (the Lease is not handed over: the follower waits for it to run out);
2. clean stop: SIGTERM of the new leader after the killed one came back as follower (the Lease is
   emptied on the way out: the follower takes it at its next look).

For each it prints the time from the signal to the Lease's new holder, to the survivor answering as
leader, and to its first sweep; then what each replica did (its log's election, takeover and state
change lines), the state-change events of the drained node on the survivor (one drain, not two), the
kubernetes-sync actions after the takeover (none for the drained node), and whether the held reason
is still held.

    nice -n 10 .venv/bin/python bench/health_takeover.py [--nodes 16]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
for folder in ("tests", "tests/deploy", "tests/health"):
    sys.path.insert(0, str(REPO / folder))

from health_helpers import fast_policy, node_state, post_alert, start_health  # noqa: E402
from kube import Cluster  # noqa: E402

from support import Process, alertmanager_server, wait_until  # noqa: E402

NAMESPACE = "fleetsight"
LEASE = "fleetsight-health"
TOKEN = "bench-takeover-token"
EVENTS = ("event=leader_", "event=takeover", "event=state_change", "event=reconcile_repaired")


def holder(cluster: Cluster) -> str:
    path = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE}"
    response = cluster.api("GET", path)
    return (response.json()["spec"].get("holderIdentity") or "") if response.status_code == 200 else ""


def status(url: str) -> dict[str, Any]:
    try:
        return httpx.get(f"{url}/v1/status", timeout=2).json().get("leader") or {}
    except httpx.HTTPError:
        return {}


class Pair:
    """The two replicas, their folders and URLs."""

    def __init__(self, folder: Path, cluster: Cluster, alertmanager: str) -> None:
        self.folder, self.cluster = folder, cluster
        (folder / "token").write_text(TOKEN)
        self.policy = fast_policy(kubernetes={"cordon": True, "taint": True})
        self.policy["hysteresis"]["clean_for"] = "10m"
        self.args = [
            "--alertmanager-url", alertmanager, "--kubernetes-nodes", "--no-breaker-alert",
            "--events-token-file", str(folder / "token"),
            "--leader-election-namespace", NAMESPACE, "--leader-election-name", LEASE,
        ]  # fmt: skip
        self.processes: dict[str, Process] = {}
        self.urls: dict[str, str] = {}
        self.lives: list[tuple[str, Process]] = []  # every start, for the trace

    def start(self, name: str) -> None:
        env = {"KUBECONFIG": str(self.cluster.admin_kubeconfig), "POD_NAME": name}
        port = int(self.urls[name].rsplit(":", 1)[1]) if name in self.urls else None
        # a restart is a fresh pod, with a folder and a log of its own
        life = f"{name}-{sum(seen.startswith(name) for seen, _ in self.lives) + 1}"
        process, url = start_health(self.folder / life, self.policy, self.args, env=env, port=port)
        self.processes[name], self.urls[name] = process, url
        self.lives.append((life, process))

    def sync(self, name: str) -> dict[str, list[str]]:
        command = [
            sys.executable, "-m", "fleetsight.cli", "health", "kubernetes-sync", "--url", self.urls[name],
            "--policy", str(self.folder / "health-a-1" / "policy.yml"),
            "--kubeconfig", str(self.cluster.admin_kubeconfig), "--json",
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=60, check=True)
        return {c["node"]: c["actions"] for c in json.loads(result.stdout)["changes"]}

    def stop(self) -> None:
        for process in self.processes.values():
            process.stop()


def takeover(pair: Pair, leader: str, follower: str, how: signal.Signals) -> dict[str, float]:
    """Signal the leader; poll (every 50 ms) until the follower holds the Lease, answers as leader and
    has swept once. Seconds from the signal to each."""
    times: dict[str, float] = {}
    started = time.monotonic()
    os.kill(pair.processes[leader].popen.pid, how)
    url = pair.urls[follower]

    def done() -> bool:
        now = time.monotonic() - started
        if "lease" not in times and holder(pair.cluster) == follower:
            times["lease"] = now
        state = status(url)
        if "leader" not in times and state.get("role") == "leader":
            times["leader"] = now
        if "swept" not in times and state.get("sweeps", 0) >= 1:
            times["swept"] = now
        return len(times) == 3

    wait_until(done, timeout=30, interval=0.05, what=f"{follower} taking over")
    pair.processes[leader].popen.wait(timeout=15)
    return times


def drains(url: str, node: str) -> list[str]:
    events = httpx.get(f"{url}/v1/events", params={"node": node}, timeout=5).json()["events"]
    return [f"#{e['id']} {e['from']}->{e['to']}" for e in events]


def trace(pair: Pair) -> None:
    for life, process in pair.lives:
        print(f"\n{life}:")
        for line in process.log.read_text().splitlines():
            if any(marker in line for marker in EVENTS):
                print(f"  {line[:160]}")


def run(nodes: int) -> None:
    names = [f"t{i:03d}" for i in range(1, nodes + 1)]
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fleetsight-takeover-")))
        cluster = Cluster(folder / "kube")
        (folder / "kube").mkdir()
        stack.callback(cluster.stop)
        cluster.start()
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        cluster.create("/api/v1/namespaces", namespace)
        for name in names:
            cluster.add_node(name, {"su": "unit-t"})
        (folder / "am").mkdir()
        alertmanager = stack.enter_context(alertmanager_server(folder / "am"))
        pair = Pair(folder, cluster, alertmanager)
        stack.callback(pair.stop)
        pair.start("health-a")
        wait_until(lambda: holder(cluster) == "health-a", timeout=20, what="health-a leading")
        pair.start("health-b")
        failed, held = names[1], names[2]
        post_alert(alertmanager, "GPUXidUncorrectable", failed, gpu="1", xid="79")
        post_alert(alertmanager, "GPUThermalThrottling", held, gpu="4")
        wait_until(lambda: node_state(pair.urls["health-a"], failed)["state"] == "draining", timeout=20)
        wait_until(lambda: node_state(pair.urls["health-a"], held)["state"] == "degraded", timeout=20)
        post_alert(alertmanager, "GPUThermalThrottling", held, ends_in=0, gpu="4")
        wait_until(lambda: node_state(pair.urls["health-a"], held)["reasons"][0].get("last_seen"), timeout=20)
        wait_until(lambda: status(pair.urls["health-b"]).get("role") == "follower", timeout=10)
        print(f"before: kubernetes-sync via health-a (leader): {pair.sync('health-a').get(failed)}")
        print(f"before: kubernetes-sync via health-b (follower): {pair.sync('health-b') or 'nothing'}")
        wait_until(lambda: node_state(pair.urls["health-b"], failed)["state"] == "draining", timeout=10)
        rows = [("SIGKILL health-a", takeover(pair, "health-a", "health-b", signal.SIGKILL))]
        after_kill = pair.sync("health-b")
        pair.start("health-a")  # back, as the follower: it copies from health-b
        rows.append(("SIGTERM health-b", takeover(pair, "health-b", "health-a", signal.SIGTERM)))
        after_term = pair.sync("health-a")
        survivor = pair.urls["health-a"]
        print(f"\n{'signal':<18} {'Lease taken':>12} {'answers as leader':>18} {'first sweep':>12}")
        for label, times in rows:
            print(f"{label:<18} {times['lease']:>11.1f}s {times['leader']:>17.1f}s {times['swept']:>11.1f}s")
        state = node_state(survivor, failed)["state"]
        print(f"\n{failed} on the survivor: {state}; its state changes: {drains(survivor, failed)}")
        print(f"kubernetes-sync after the crash takeover, {failed}: {after_kill.get(failed, 'nothing')}")
        print(f"kubernetes-sync after the clean takeover, {failed}: {after_term.get(failed, 'nothing')}")
        reason = node_state(survivor, held)["reasons"]
        kept = "kept" if reason and reason[0].get("last_seen") else "LOST"
        print(f"{held}: held reason {kept}: {reason[0]['signal'] if reason else None}")
        trace(pair)


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--nodes", type=int, default=16)
    run(parser.parse_args().nodes)


if __name__ == "__main__":
    main()
