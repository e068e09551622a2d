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

`--scenario am-restart` ("after" only): Alertmanager SIGKILLed mid-burst and restarted. The bench plays
Prometheus's side of alerting (AlertSender: an alert is sent when it starts firing and re-sent every
--resend s, checked every --eval s; a send to a dead Alertmanager is dropped; ALERTS answers what fires),
and the service sweeps every --reconcile s (20 s here, 5 min shipped). 150 faults in three phases of 50:
POSTed and notified (the service drains them), POSTed and Alertmanager SIGKILLed at once, inside the
route's 1 s group_wait (those notifications are never sent), then, once it is ready again on the same port
and the same --storage.path, the last 50 POSTed. The service's /metrics (event lag, repairs, webhook
alerts received) and drain list are sampled every second until all 150 are on the drain list; printed: the
time series (rows where nothing changed left out), how each phase reached the drain list (by the sweep
when the service's repairs{kind="added"} rose in the second the node appeared, else by webhook; the tap's
own arrival times lag by seconds under load), time to all drained, and nodes drained twice.
The --storage.path is kept, as a real deployment's volume is, but it holds nothing of this run: alerts
live only in memory, and the notification log and silences are snapshotted there every
--data.maintenance-interval (15m) and at a clean shutdown, never at a SIGKILL.

    nice -n 10 .venv/bin/python bench/health_events.py --scenario am-restart --nodes 1250

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

from fleetsight.procs import free_loopback_port
from health.component import serve_command

REPO = Path(__file__).resolve().parents[1]
BURST = 150
TOKEN = "bench-events-token"
TICK = os.sysconf("SC_CLK_TCK")


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
    alerts_body = empty  # ALERTS{alertstate="firing"}: what AlertSender has firing (am-restart)
    notified: ClassVar[dict[str, float]] = {}
    tapped: ClassVar[list[tuple[float, str]]] = []  # every firing notification at the tap: (time, node)
    sweeps: ClassVar[list[float]] = []  # when the service read `up` (the start of each reconcile sweep)

    def log_message(self, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        if self.path.startswith("/slurm/"):
            body = self.nodes_body if self.path.endswith("/nodes") else self.jobs_body
        elif "up%7Bnode" in self.path or "up{node" in self.path:
            Handler.sweeps.append(time.time())
            body = self.up_body
        else:
            body = self.alerts_body if "ALERTS" in self.path else self.empty
        self._answer(200, body)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        payload = json.loads(self.rfile.read(length) or b"{}")
        now = time.time()
        for alert in payload.get("alerts", []):
            node = alert.get("labels", {}).get("node")
            if node and alert.get("status") == "firing":
                Handler.notified.setdefault(node, now)
                Handler.tapped.append((now, node))
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
    folder: Path, health_port: int | None, tap_port: int, token_file: Path, port: int | None = None
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
    port = port or free_loopback_port()
    return start_alertmanager(folder, port), f"http://127.0.0.1:{port}"


def start_alertmanager(folder: Path, port: int) -> subprocess.Popen[bytes]:
    """Alertmanager on the configuration alertmanager() wrote, at ``port`` (again after a kill: the same
    port, configuration and --storage.path)."""
    command = [
        shutil.which("prometheus-alertmanager") or "prometheus-alertmanager",
        f"--config.file={folder / 'am.yml'}",
        f"--storage.path={folder / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=open(folder / "am.log", "ab"))  # noqa: SIM115
    url = f"http://127.0.0.1:{port}"
    poll(lambda: httpx.get(f"{url}/-/ready", timeout=1).status_code == 200, 30, "Alertmanager")
    return process


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
    folder: Path,
    variant: str,
    nodes: list[str],
    am_url: str,
    prom_url: str,
    port: int,
    token_file: Path,
    reconcile: str | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    policy = yaml.safe_load((REPO / "health" / "policy.yml").read_text())
    policy["circuit_breaker"].update(max_cluster_fraction=1.0, max_unit_fraction=1.0)
    if reconcile:  # the sweep's interval (refresh.reconcile), shortened for am-restart
        policy["refresh"]["reconcile"] = reconcile
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
    side_port = free_loopback_port()
    server = serve_in_thread(side_port)
    token_file = folder / "token"
    token_file.write_text(TOKEN)
    port = free_loopback_port()
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


# ---------------------------------------------------------------------------------- am-restart
PHASES = (50, 50, 50)  # before the kill (notified), POSTed just before the kill (lost), after the restart


def fault_labels(node: str) -> dict[str, str]:
    return {"alertname": "GPUXidUncorrectable", "node": node, "severity": "critical", "cluster": "bench"}


def alerts_vector(nodes: list[str]) -> bytes:
    """Prometheus's answer to ALERTS{alertstate="firing"} for these faults."""
    result = [
        {
            "metric": {"__name__": "ALERTS", "alertstate": "firing", **fault_labels(n)},
            "value": [time.time(), "1"],
        }
        for n in nodes
    ]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


class AlertSender:
    """Prometheus's side of alerting, as its rule manager and notifier do it: an alert that starts firing
    is sent at once; at every evaluation (``eval_s``) each firing alert last sent ``resend_s`` ago or more
    is sent again (--rules.alert.resend-delay, 1m by default) with endsAt = now + 4 x max(eval, resend);
    a send that fails (Alertmanager down) is dropped, not retried: the next re-send brings it back.
    ALERTS in the Prometheus-API stand-in answers what fires."""

    def __init__(self, am_url: str, eval_s: float, resend_s: float) -> None:
        self.am_url, self.eval_s, self.resend_s = am_url, eval_s, resend_s
        self.active_at: dict[str, str] = {}  # node -> startsAt (the alert's activeAt)
        self.last_sent: dict[str, float] = {}
        self.log: list[tuple[float, str]] = []  # (time, what) for the table's notes
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._evaluate, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def fire(self, nodes: list[str]) -> bool:
        with self.lock:
            now = dt.datetime.now(dt.UTC).isoformat()
            self.active_at.update({n: now for n in nodes})
            Handler.alerts_body = alerts_vector(list(self.active_at))
        return self._send(nodes, "POST")

    def _send(self, nodes: list[str], what: str) -> bool:
        now = time.time()
        ends = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=4 * max(self.eval_s, self.resend_s))
        alerts = [
            {
                "labels": fault_labels(n),
                "annotations": {"summary": f"Xid on {n}"},
                "startsAt": self.active_at[n],
                "endsAt": ends.isoformat(),
            }
            for n in nodes
        ]
        with self.lock:
            self.last_sent.update({n: now for n in nodes})
        try:
            httpx.post(f"{self.am_url}/api/v2/alerts", json=alerts, timeout=10).raise_for_status()
            sent = True
        except httpx.HTTPError:
            sent = False
        self.log.append((now, f"{what} {len(nodes)}{'' if sent else ' (refused: dropped)'}"))
        return sent

    def _evaluate(self) -> None:
        while not self.stop.wait(self.eval_s):
            now = time.time()
            with self.lock:
                due = sorted(n for n, sent in self.last_sent.items() if sent + self.resend_s <= now)
            if due:
                self._send(due, "Prometheus re-sends")


def sample(url: str, faulty: set[str]) -> dict[str, Any]:
    """The service's /metrics (lag, repairs, webhook alerts received) and drain list, once."""
    values = {"lag": 0.0, "added": 0.0, "removed": 0.0, "received": 0.0}
    names = {
        "fleetsight_health_event_lag_seconds ": "lag",
        'fleetsight_health_reconcile_repairs_total{kind="added"} ': "added",
        'fleetsight_health_reconcile_repairs_total{kind="removed"} ': "removed",
        'fleetsight_health_events_total{source="alertmanager"} ': "received",
    }
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        for prefix, key in names.items():
            if line.startswith(prefix):
                values[key] = float(line.split()[-1])
    listed = [item["node"] for item in httpx.get(f"{url}/v1/drain-list", timeout=10).json()["nodes"]]
    return {**values, "drained": set(listed) & faulty, "listed": len(listed), "unique": len(set(listed))}


class Sampler:
    """sample() every second in a thread, from t0 on, until stopped."""

    def __init__(self, url: str, faulty: set[str]) -> None:
        self.url, self.faulty = url, faulty
        self.rows: list[tuple[float, dict[str, Any]]] = []
        self.first_drained: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self.stop.is_set():
            self.take()
            next_at += 1.0
            self.stop.wait(max(0.0, next_at - time.monotonic()))

    def take(self) -> None:
        try:
            row = sample(self.url, self.faulty)
        except httpx.HTTPError:
            return
        now = time.time()
        for node in row["drained"]:
            self.first_drained.setdefault(node, now)
        self.rows.append((now, row))


def compact(nodes: list[str]) -> str:
    return ", ".join(nodes) if len(nodes) <= 8 else f"{', '.join(nodes[:6])}, ... ({len(nodes)})"


def am_restart(count: int, folder: Path, reconcile: float, resend: float, evaluation: float) -> None:
    """Alertmanager SIGKILLed mid-burst and restarted (its --storage.path kept): what the event-lag gauge
    and the repairs counter show, and how each of the 150 nodes reached the drain list."""
    nodes = node_names(count)
    faulty = nodes[:: max(1, len(nodes) // BURST)][:BURST]
    phases = [faulty[: PHASES[0]], faulty[PHASES[0] : PHASES[0] + PHASES[1]], faulty[PHASES[0] + PHASES[1] :]]
    Handler.up_body, Handler.nodes_body = up_vector(nodes), slurm_nodes(nodes)
    Handler.alerts_body, Handler.tapped, Handler.sweeps = alerts_vector([]), [], []
    side_port = free_loopback_port()
    server = serve_in_thread(side_port)
    token_file = folder / "token"
    token_file.write_text(TOKEN)
    port, am_port = free_loopback_port(), free_loopback_port()
    am, am_url = alertmanager(folder / "am", port, side_port, token_file, port=am_port)
    process, url = health(
        folder, "after", nodes, am_url, f"http://127.0.0.1:{side_port}", port, token_file, f"{reconcile:g}s"
    )
    sender = AlertSender(am_url, evaluation, resend)
    sampler = Sampler(url, set(faulty))
    notes: list[tuple[float, str]] = []
    try:
        sender.start()
        t0 = time.time()
        sampler.thread.start()
        sender.fire(phases[0])
        poll(lambda: set(phases[0]) <= {n for _, n in Handler.tapped}, 30, "phase 1 notified", every=0.05)
        poll(lambda: set(phases[0]) <= sampler.first_drained.keys(), 30, "phase 1 drained", every=0.05)
        sender.fire(phases[1])
        am.kill()  # SIGKILL, within group_wait of phase 2's POST: its notifications are never sent
        killed = time.time()
        am.wait(timeout=30)
        notes.append(
            (killed, f"SIGKILL Alertmanager ({(killed - sender.log[-1][0]) * 1000:.0f} ms after POST)")
        )
        am = start_alertmanager(folder / "am", am_port)
        notes.append((time.time(), f"Alertmanager ready again ({time.time() - killed:.1f} s after the kill)"))
        sender.fire(phases[2])
        deadline = time.monotonic() + resend + 2 * evaluation + 2 * reconcile + 60
        while len(sampler.first_drained) < len(faulty) and time.monotonic() < deadline:
            time.sleep(0.2)  # the sampler's own thread does the measuring
        sampler.stop.set()
        sampler.thread.join(timeout=30)
        done = max(sampler.first_drained.values(), default=t0)
        events = httpx.get(f"{url}/v1/events", params={"limit": 10000}, timeout=10).json()["events"]
    finally:
        sender.stop.set()
        sampler.stop.set()
        process.terminate()
        am.terminate()
        process.wait(timeout=30)
        am.wait(timeout=30)
        server.shutdown()
    report(t0, done, phases, sampler, sender, notes, events)
    print(
        f"\n(at {count:,} nodes: reconcile every {reconcile:g} s, Prometheus's evaluation {evaluation:g} s "
        f"and re-send {resend:g} s, Alertmanager group_wait 1s as shipped; --storage.path kept across the "
        "restart)"
    )


def report(
    t0: float,
    done: float,
    phases: list[list[str]],
    sampler: Sampler,
    sender: AlertSender,
    notes: list[tuple[float, str]],
    events: list[dict[str, Any]],
) -> None:
    notes = sorted(notes + sender.log + [(t, "sweep") for t in Handler.sweeps if t >= t0])
    print(
        "| t s | lag s | repairs total (added / removed) | drained of 150 | webhook alerts received "
        "| what happened |"
    )
    print("|---|---|---|---|---|---|")
    previous: tuple[Any, ...] | None = None
    last = t0
    for index, (when, row) in enumerate(sampler.rows):
        said = [what for t, what in notes if last < t <= when or (index == 0 and t <= when)]
        last = when
        values = (row["lag"], row["added"], row["removed"], len(row["drained"]), row["received"])
        if values == previous and not said and index != len(sampler.rows) - 1:
            continue  # unchanged and nothing happened: left out
        previous = values
        repairs = row["added"] + row["removed"]
        print(
            f"| {when - t0:.0f} | {row['lag']:.2f} "
            f"| {repairs:.0f} ({row['added']:.0f} / {row['removed']:.0f}) "
            f"| {len(row['drained'])} | {row['received']:.0f} | {'; '.join(said)} |"
        )
    tap: dict[str, list[float]] = {}
    for when, node in Handler.tapped:
        tap.setdefault(node, []).append(when)
    print()
    labels = (
        "POSTed first, notified, then forgotten by the kill",
        "POSTed just before the kill",
        "POSTed after the restart",
    )
    added_with = sweep_added(sampler)
    for label, group in zip(labels, phases, strict=True):
        drained = [n for n in group if n in sampler.first_drained]
        sweep = [n for n in drained if added_with.get(n)]
        webhook = [n for n in drained if n not in sweep]
        missing = [n for n in group if n not in sampler.first_drained]
        times = sorted(sampler.first_drained[n] - t0 for n in drained)
        span = f", on the drain list at {times[0]:.0f}-{times[-1]:.0f} s" if times else ""
        print(
            f"{label} ({group[0]}..{group[-1]}): {len(webhook)} by webhook, {len(sweep)} by the sweep{span}"
        )
        if sweep:
            print(f"  by the sweep: {compact(sweep)}")
        if missing:
            print(f"  NOT drained: {compact(missing)}")
    # notified before Prometheus re-sent anything (the tap's own times lag by seconds under load)
    resent = min((t for t, what in sender.log if what.startswith("Prometheus")), default=float("inf"))
    lost = [n for n in phases[1] if min(tap.get(n, [float("inf")])) > resent]
    print(
        f"notifications lost to the kill (phase 2 nodes not notified at the tap before a re-send): "
        f"{len(lost)} of {len(phases[1])}"
    )
    drains: dict[str, int] = {}
    for event in events:
        if event["to"] in ("draining", "drained", "repair") and event["from"] not in (
            "draining",
            "drained",
            "repair",
        ):
            drains[event["node"]] = drains.get(event["node"], 0) + 1
    final = sampler.rows[-1][1]
    print(
        f"time to all drained: {done - t0:.1f} s from the first POST "
        f"({len(sampler.first_drained)} of {sum(map(len, phases))}); "
        f"repairs: {final['added']:.0f} added, {final['removed']:.0f} removed; "
        f"max lag seen: {max(r['lag'] for _, r in sampler.rows):.2f} s; "
        f"nodes drained more than once: {sum(1 for c in drains.values() if c > 1)}; "
        f"left the drain list once on it: {left_list(sampler)}"
    )


def sweep_added(sampler: Sampler) -> dict[str, float]:
    """Per node, how many signals the service's sweep added (its repairs counter, kind="added") between
    the sample before the node first appeared on the drain list and that sample: the sweep can have put
    it there only when that is non-zero (events by webhook are never counted as repairs)."""
    added_with: dict[str, float] = {}
    before = 0.0  # the first sweep, at the start, counts nothing
    for when, row in sampler.rows:
        for node, first in sampler.first_drained.items():
            if first == when:
                added_with[node] = row["added"] - before
        before = row["added"]
    return added_with


def left_list(sampler: Sampler) -> int:
    """Nodes that were on the drain list at one sample and missing at a later one."""
    seen: set[str] = set()
    left: set[str] = set()
    for _, row in sampler.rows:
        left |= seen - row["drained"]
        seen |= row["drained"]
    return len(left)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1250", help="comma-separated fleet sizes")
    parser.add_argument("--quiet", type=float, default=60.0, help="seconds of the quiet window")
    parser.add_argument("--only", choices=("before", "after"), help="one code path only")
    parser.add_argument(
        "--scenario",
        choices=("burst", "am-restart"),
        default="burst",
        help="burst: quiet CPU and the 150-node burst, before/after; am-restart: Alertmanager killed "
        "mid-burst",
    )
    parser.add_argument("--reconcile", type=float, default=20.0, help="am-restart: sweep interval, s")
    parser.add_argument("--resend", type=float, default=60.0, help="am-restart: Prometheus's resend delay, s")
    parser.add_argument(
        "--eval", type=float, default=15.0, help="am-restart: Prometheus's evaluation interval, s"
    )
    args = parser.parse_args()
    if args.scenario == "am-restart":
        for count in (int(n) for n in args.nodes.split(",")):
            with tempfile.TemporaryDirectory(prefix="health-events-am-restart-") as scratch:
                am_restart(count, Path(scratch), args.reconcile, args.resend, args.eval)
        return
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
