"""Event-driven health (issue 37) against the refresh loop it replaces, at N nodes on this machine.

For each code path ("before": the health package of git HEAD, copied out with `git show` and run as it
was, polling every source every 5 s; "after": this tree, Alertmanager's webhook plus the reconcile
sweep) it starts a real Alertmanager (Debian's), a small Prometheus-API server that answers the
queries the service makes at N nodes (`up` for 3 exporters per node with `su`/`rack` labels, no
stragglers, no missing DCGM fields: the full per-node series are measured by bench/fleet_scale.py),
and `fleetsight health serve` with N nodes and the breaker opened wide (fractions 1.0), then prints:

- quiet CPU: the service process's CPU seconds per minute over a quiet window (no alert, no sweep in
  the window; the sweep's share is given apart, spread over its interval);
- burst: 150 node faults POSTed to Alertmanager at once (one critical alert per node, spread over
  units); per node, the time from the POST (Alertmanager then waits the route's group_wait, 1 s) to the
  node's appearance on `/v1/drain-list` (polled every 50 ms), P50/P99/max; and, "after", the service's
  own fleetsight_health_event_delay_seconds over the burst (webhook receipt to the decision published:
  the drain list the syncs read), as bucket bounds. (A second webhook receiver in this process, the
  "tap", checks that Alertmanager did notify every node; its arrival times are too skewed by this
  process's own load to time against);
- sweep CPU: "after": the process CPU of one reconcile sweep (fleetsight_health_reconcile_cpu_seconds);
  "before": the CPU of one refresh (which is a full sweep every 5 s).

    nice -n 10 .venv/bin/python bench/health_events.py [--nodes 1250,2500] [--quiet 60] [--only after]

CPU is the health process's own (/proc/PID/stat utime+stime); the bench's helpers run in this process.
On a loaded 2-core machine wall times (latencies) are inflated by the other users; CPU much less.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.server
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import httpx
import yaml

from health.component import serve_command

REPO = Path(__file__).resolve().parents[1]
BURST = 150
TOKEN = "bench-events-token"
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def poll(check: Callable[[], Any], timeout: float, what: str, every: float = 0.2) -> Any:
    """Poll with a deadline (never a bare sleep as synchronisation)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            result = check()
        except httpx.HTTPError:
            result = None
        if result:
            return result
        time.sleep(every)
    raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def node_names(count: int) -> list[str]:
    return [f"n{i:05d}" for i in range(1, count + 1)]


# ---------------------------------------------------------------------------------- in-process servers
class Handler(http.server.BaseHTTPRequestHandler):
    """Prometheus's /api/v1/query for the service's queries, and the notification tap (POST)."""

    up_body = b""
    nodes_body = b""
    jobs_body = json.dumps({"jobs": []}).encode()
    empty = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()
    notified: ClassVar[dict[str, float]] = {}

    def log_message(self, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        if self.path.startswith("/slurm/"):
            body = self.nodes_body if self.path.endswith("/nodes") else self.jobs_body
        else:
            body = self.up_body if "up%7Bnode" in self.path or "up{node" in self.path else self.empty
        self._answer(200, body)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        payload = json.loads(self.rfile.read(length) or b"{}")
        now = time.time()
        for alert in payload.get("alerts", []):
            node = alert.get("labels", {}).get("node")
            if node and alert.get("status") == "firing":
                Handler.notified.setdefault(node, now)
        self._answer(200, b"{}")

    def _answer(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def up_vector(nodes: list[str]) -> bytes:
    result = []
    for index, node in enumerate(nodes):
        labels = {"node": node, "su": f"su{index // 32:03d}", "rack": f"r{index // 8:04d}"}
        for job, port in (("dcgm", 9400), ("node", 9100), ("fleetsight-node", 9401)):
            metric = {"__name__": "up", "job": job, "instance": f"{node}:{port}", **labels}
            result.append({"metric": metric, "value": [time.time(), "1"]})
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def slurm_nodes(nodes: list[str]) -> bytes:
    """slurmrestd v0.0.40's /nodes: every node idle in partition gpu."""
    items = [{"name": n, "state": ["IDLE"], "reason": "", "partitions": ["gpu"]} for n in nodes]
    return json.dumps({"nodes": items}).encode()


class Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        return  # a client gone mid-answer (the service stopped): nothing to report


def serve_in_thread(port: int) -> http.server.ThreadingHTTPServer:
    server = Server(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# ---------------------------------------------------------------------------------- processes
def alertmanager(
    folder: Path, health_port: int | None, tap_port: int, token_file: Path
) -> tuple[subprocess.Popen[bytes], str]:
    shipped = yaml.safe_load((REPO / "alerting" / "alertmanager.yml").read_text())
    [health_route] = [r for r in shipped["route"]["routes"] if r.get("receiver") == "fleetsight-health"]
    timing = {k: health_route[k] for k in ("group_wait", "group_interval", "repeat_interval")}
    tap = {
        "name": "tap",
        "webhook_configs": [{"url": f"http://127.0.0.1:{tap_port}/tap", "send_resolved": True}],
    }
    # the tap: proof that Alertmanager notified every faulty node (not a clock)
    routes = [{"matchers": ['node=~".+"'], "receiver": "tap", "continue": True, **timing}]
    receivers = [{"name": "null"}, tap]
    if health_port is not None:  # "after": the shipped receiver, pointed here
        [receiver] = [r for r in shipped["receivers"] if r["name"] == "fleetsight-health"]
        receiver["webhook_configs"][0]["url"] = f"http://127.0.0.1:{health_port}/v1/events/alertmanager"
        receiver["webhook_configs"][0]["http_config"]["authorization"]["credentials_file"] = str(token_file)
        routes.append({**health_route, "matchers": ['node=~".+"']})
        receivers.append(receiver)
    config = {
        "route": {"receiver": "null", "group_by": ["alertname", "node"], "routes": routes},
        "receivers": receivers,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "am.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    command = [
        shutil.which("prometheus-alertmanager") or "prometheus-alertmanager",
        f"--config.file={folder / 'am.yml'}",
        f"--storage.path={folder / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=open(folder / "am.log", "wb"))  # noqa: SIM115
    url = f"http://127.0.0.1:{port}"
    poll(lambda: httpx.get(f"{url}/-/ready", timeout=1).status_code == 200, 30, "Alertmanager")
    return process, url


def old_package(folder: Path) -> Path:
    """git HEAD's health package, as it was before this change, in a folder of its own."""
    root = folder / "old"
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", "HEAD", "health/"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    (root / "health").mkdir(parents=True, exist_ok=True)
    for name in names:
        if name.endswith((".py", ".yml")):
            text = subprocess.run(
                ["git", "show", f"HEAD:{name}"], cwd=REPO, capture_output=True, check=True
            ).stdout
            (root / name).write_bytes(text)
    return root


def health(
    folder: Path, variant: str, nodes: list[str], am_url: str, prom_url: str, port: int, token_file: Path
) -> tuple[subprocess.Popen[bytes], str]:
    policy = yaml.safe_load((REPO / "health" / "policy.yml").read_text())
    policy["circuit_breaker"].update(max_cluster_fraction=1.0, max_unit_fraction=1.0)
    (folder / "policy.yml").write_text(yaml.safe_dump(policy))
    (folder / "nodes.txt").write_text("\n".join(nodes) + "\n")
    extra = ["--nodes-file", str(folder / "nodes.txt"), "--no-breaker-alert"]
    env = {**os.environ, "FLEETSIGHT_HEALTH_TOKENS": ""}
    if variant == "after":
        extra += ["--events-token-file", str(token_file)]
    else:  # HEAD's package first on the path; the core (fleetsight/) is this tree's
        env["PYTHONPATH"] = f"{old_package(folder)}:{REPO}"
    command = serve_command(
        f"127.0.0.1:{port}",
        folder / f"state-{variant}",
        policy=folder / "policy.yml",
        alertmanagers=[am_url],
        prometheus=prom_url,
        scheduler=f"{prom_url}/slurm/v0.0.40",
        extra=tuple(extra),
    )
    if variant == "before":  # run the old CLI module itself, so that the old package is imported
        command = [
            sys.executable,
            "-c",
            "import sys; from health.cli import cli; sys.argv[0] = 'health'; cli()",
            *command[command.index("serve") :],
        ]
    process = subprocess.Popen(
        command,
        cwd=folder,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(folder / f"health-{variant}.log", "wb"),  # noqa: SIM115 (the child owns it)
    )
    url = f"http://127.0.0.1:{port}"
    poll(lambda: httpx.get(f"{url}/-/ready", timeout=2).status_code == 200, 120, f"health ({variant})")
    poll(
        lambda: httpx.get(f"{url}/v1/status", timeout=5).json()["states"]["healthy"] >= len(nodes),
        120,
        "every node known",
    )
    return process, url


# ---------------------------------------------------------------------------------- measurements
def quiet_cpu(pid: int, seconds: float) -> float:
    start_cpu, start = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)  # the measurement window itself, not synchronisation
    return (cpu_seconds(pid) - start_cpu) / (time.monotonic() - start) * 60


def burst(am_url: str, health_url: str, nodes: list[str]) -> dict[str, list[float]]:
    faulty = nodes[:: max(1, len(nodes) // BURST)][:BURST]
    now = dt.datetime.now(dt.UTC)
    alerts = [
        {
            "labels": {
                "alertname": "GPUXidUncorrectable",
                "node": n,
                "severity": "critical",
                "cluster": "bench",
            },
            "annotations": {"summary": f"Xid on {n}"},
            "startsAt": now.isoformat(),
            "endsAt": (now + dt.timedelta(minutes=30)).isoformat(),
        }
        for n in faulty
    ]
    Handler.notified = {}
    posted = time.time()
    httpx.post(f"{am_url}/api/v2/alerts", json=alerts, timeout=10).raise_for_status()
    drained: dict[str, float] = {}
    deadline = time.monotonic() + 120
    while len(drained) < len(faulty) and time.monotonic() < deadline:
        body = httpx.get(f"{health_url}/v1/drain-list", timeout=10).json()
        seen = time.time()
        for item in body["nodes"]:
            drained.setdefault(item["node"], seen)
        time.sleep(0.05)  # the poll period of the observer
    poll(lambda: len(Handler.notified) >= len(faulty), 30, "every notification at the tap")
    missing = [n for n in faulty if n not in drained]
    if missing:
        print(f"  NOT drained within 120 s: {len(missing)} of {len(faulty)}")
    return {"from_post": [drained[n] - posted for n in faulty if n in drained]}


def delay_buckets(url: str) -> dict[float, float]:
    """fleetsight_health_event_delay_seconds's cumulative buckets (bound -> count); {} before the change."""
    buckets = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("fleetsight_health_event_delay_seconds_bucket{"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[float("inf") if bound == "+Inf" else float(bound)] = float(line.split()[-1])
    return buckets


def bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> str:
    """The bucket bound under which a share q of the events between two scrapes fell (an upper bound)."""
    counts = {bound: after[bound] - before.get(bound, 0.0) for bound in sorted(after)}
    total = counts[float("inf")]
    bound = next((b for b, c in counts.items() if total and c >= q * total), float("inf"))
    return f"<= {bound:g}"


def metric(url: str, name: str) -> float | None:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def percentiles(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"{statistics.median(ordered):.2f} / {p99:.2f} / {ordered[-1]:.2f}"


def run_point(variant: str, count: int, quiet_s: float, folder: Path) -> dict[str, Any]:
    nodes = node_names(count)
    Handler.up_body = up_vector(nodes)
    Handler.nodes_body = slurm_nodes(nodes)
    side_port = free_port()
    server = serve_in_thread(side_port)
    token_file = folder / "token"
    token_file.write_text(TOKEN)
    port = free_port()
    am, am_url = alertmanager(folder / "am", port if variant == "after" else None, side_port, token_file)
    process, url = health(folder, variant, nodes, am_url, f"http://127.0.0.1:{side_port}", port, token_file)
    try:
        quiet = quiet_cpu(process.pid, quiet_s)
        if variant == "after":
            sweep = metric(url, "fleetsight_health_reconcile_cpu_seconds") or 0.0
            interval = 300.0
        else:  # every refresh is a full sweep, every 5 s
            sweep, interval = quiet / 12, 5.0
        histogram = delay_buckets(url)
        times = burst(am_url, url, nodes)
        later = delay_buckets(url)
        delays = "- (no webhook)"
        if later:
            delays = f"{bucket_quantile(histogram, later, 0.5)} / {bucket_quantile(histogram, later, 0.99)}"
        return {
            "variant": variant,
            "nodes": count,
            "quiet": quiet,
            "sweep": sweep,
            "interval": interval,
            "delays": delays,
            **times,
        }
    finally:
        process.terminate()
        am.terminate()
        process.wait(timeout=30)
        am.wait(timeout=30)
        server.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1250", help="comma-separated fleet sizes")
    parser.add_argument("--quiet", type=float, default=60.0, help="seconds of the quiet window")
    parser.add_argument("--only", choices=("before", "after"), help="one code path only")
    args = parser.parse_args()
    rows = []
    for count in (int(n) for n in args.nodes.split(",")):
        for variant in [args.only] if args.only else ["before", "after"]:
            with tempfile.TemporaryDirectory(prefix=f"health-events-{variant}-") as scratch:
                row = run_point(variant, count, args.quiet, Path(scratch))
                rows.append(row)
                print(f"{variant} at {count} nodes: quiet {row['quiet']:.2f} CPU-s/min", flush=True)
    print()
    print(
        "| nodes | code | quiet CPU-s/min (no sweep) | sweep CPU-s (every) | quiet incl. sweep, cores "
        "| burst 150: POST -> drain-list P50/P99/max s | webhook receipt -> published, P50/P99 s |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        cores = r["quiet"] / 60 + (r["sweep"] / r["interval"] if r["variant"] == "after" else 0.0)
        print(
            f"| {r['nodes']:,} | {r['variant']} | {r['quiet']:.2f} "
            f"| {r['sweep']:.2f} ({r['interval']:.0f} s) "
            f"| {cores:.4f} | {percentiles(r['from_post'])} | {r['delays']} |"
        )


if __name__ == "__main__":
    main()
