"""The straggler cycle at 100,000 GPUs (issue 37): what one anomaly-service cycle costs through Thanos
Query over 2 Prometheus shards, reading the raw reductions (before) and the recorded window of
rules/anomaly.yml (after), at 1,250 / 6,250 / 12,500 nodes of 8 GPUs, and how long an injected
straggler takes to be flagged in each mode.

Per point: a load source (this file, `--serve`) publishes only the series the service reads, as
dcgm-exporter and the node agent name and label them: per GPU tensor activity, power, SM clock,
utilisation, clock-event reasons, PCIe downgrade and host-to-device bandwidth; per node 8 InfiniBand
ports' error, xmit-wait and received-bytes counters. Nodes are grouped 125 to a scrape target (a real
fleet has one target per exporter and node: the series and samples are the same, the scrape count is
not), every node in a job of 16 (`hpc_job`). Two Prometheus shards (half of the targets each, external labels
`shard` and `replica`), a Thanos sidecar each and Thanos Query over them, as docs/scaling.md deploys
them. Then:

  baseline   a window with no service and no anomaly rules: the shards' own cost (scraping);
  raw        a fresh AnomalyService (the service's code, in this process) reading Thanos Query with
             the raw queries, one cycle per --interval; a power-brake straggler (its power and clock
             drop, the brake bit set, its 15 job peers' activity falls to a third as they wait) is
             injected after --warm cycles, and the cycles run on until it is flagged;
  recorded   rules/anomaly.yml loaded into both shards (/-/reload), the same with the recorded window.

Per cycle: wall (the service's own cycle duration), service CPU (this process), and the stack's CPU
over the cycle's interval from /proc: Thanos Query, the sidecars, and the shards above their baseline
(so the recorded mode's rule evaluations count as query cost). Flag latency: from the injection to
the end of the cycle that flagged the straggler.

    nice -n 5 .venv/bin/python bench/anomaly_100k.py --nodes 1250,6250,12500
    nice -n 5 .venv/bin/python bench/anomaly_100k.py --nodes 1250 --scrape-interval 5  # production's
    nice -n 5 .venv/bin/python bench/anomaly_100k.py --nodes 12500 --modes recorded --engine thanos
    nice -n 5 .venv/bin/python bench/anomaly_100k.py --nodes 12500 --modes recorded --query-gogc 400

The dcgm job scrapes every 5 s in production; on a 2-core machine 12,500 nodes at 5 s (~220,000
samples/s) leave nothing for the rest, so the default here is 15 s: a 30 s window then holds 2 samples
per series instead of 6 (the series counts, the labels and the answers' sizes are production's).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from anomaly.queries import Queries  # noqa: E402
from anomaly.service import AnomalyService, ServiceConfig  # noqa: E402
from anomaly.source import PrometheusSource  # noqa: E402
from fleetsight.components import http_ok  # noqa: E402
from fleetsight.procs import free_loopback_port  # noqa: E402

THANOS = REPO / ".cache" / "bin" / "thanos"
RULES = REPO / "rules" / "anomaly.yml"
GPUS, PORTS, JOB_NODES, PER_TARGET = 8, 8, 16, 125
MODEL, DRIVER, CLUSTER = "NVIDIA H100 80GB HBM3", "550.127.05", "bench"
BRAKE, POWER_CAP = 0x80, 0x4
VARIANTS = 3  # pre-rendered pages per target; a scrape takes the next one (values move ~1 %)
TICK = b"@TICK@"  # counters: the scrape count, put into the page with one bytes.replace per scrape


# ---------------------------------------------------------------------------------- load source
def node_name(i: int) -> str:
    return f"n{i:05d}"


def job_of(i: int) -> str:
    return str(100000 + i // JOB_NODES)


def render(nodes: range, variant: int, straggler: int | None) -> bytes:
    """One target's page: the anomaly service's series for ``nodes``. The straggler (when it is among
    them) brakes; its job's other nodes wait (tensor activity and power fall to a third)."""
    rng = np.random.default_rng([nodes.start, variant])
    offsets = np.exp(np.random.default_rng(nodes.start).normal(0, 0.02, (len(nodes), GPUS)))
    tensor = 0.45 * offsets * (1 + rng.normal(0, 0.01, offsets.shape))
    clock = np.full(offsets.shape, 1980.0)
    events = np.full(offsets.shape, POWER_CAP)
    if straggler is not None:
        for row, i in enumerate(nodes):
            if i == straggler:
                clock[row], events[row] = 1005.0, BRAKE | POWER_CAP
            elif job_of(i) == job_of(straggler):
                tensor[row] /= 3
    power = 100 + 1100 * tensor
    power[[r for r, i in enumerate(nodes) if i == straggler]] = 260.0
    gpu_fields = {
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": tensor,
        "DCGM_FI_DEV_POWER_USAGE": power,
        "DCGM_FI_DEV_SM_CLOCK": clock,
        "DCGM_FI_DEV_GPU_UTIL": np.full(offsets.shape, 99.0),
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": events,
    }
    out: list[str] = []
    for name, values in gpu_fields.items():
        out.append(f"# TYPE {name} gauge")
        for row, i in enumerate(nodes):
            node = node_name(i)
            for g in range(GPUS):
                labels = (f'gpu="{g}",UUID="GPU-{i:05d}-{g}",pci_bus_id="00000000:{0x18 + g:02X}:00.0",'
                          f'device="nvidia{g}",modelName="{MODEL}",Hostname="{node}",'
                          f'DCGM_FI_DRIVER_VERSION="{DRIVER}",hpc_job="{job_of(i)}",node="{node}",'
                          f'cluster="{CLUSTER}"')  # fmt: skip
                out.append(f"{name}{{{labels}}} {values[row, g]:.6g}")
    out += pcie_lines(nodes) + infiniband_lines(nodes)
    return ("\n".join(out) + "\n").encode()


def pcie_lines(nodes: range) -> list[str]:
    out = ["# TYPE fleetsight_pcie_link_downgraded gauge"]
    for i in nodes:
        out += [f'fleetsight_pcie_link_downgraded{{node="{node_name(i)}",cluster="{CLUSTER}",gpu="{g}",'
                f'kind="gpu",pci_bdf="0000:{0x18 + g:02x}:00.0"}} 0' for g in range(GPUS)]  # fmt: skip
    out.append("# TYPE fleetsight_pcie_host_to_device_bandwidth_bytes_per_second gauge")
    for i in nodes:
        out += [f'fleetsight_pcie_host_to_device_bandwidth_bytes_per_second{{node="{node_name(i)}",'
                f'cluster="{CLUSTER}",gpu="{g}"}} 2.52e+10' for g in range(GPUS)]  # fmt: skip
    return out


def infiniband_lines(nodes: range) -> list[str]:
    """Counters: xmit_wait and the bytes received rise with every scrape (TICK), the error counters
    stay at 0."""
    out = []
    rising = {"xmit_wait": f"{TICK.decode()}000", "rcv_data_bytes": f"{TICK.decode()}000000"}
    for counter in ("symbol_error", "link_downed", "link_error_recovery", "xmit_wait", "rcv_data_bytes"):
        name = f"fleetsight_infiniband_port_{counter}_total"
        value = rising.get(counter, "0")
        out.append(f"# TYPE {name} counter")
        for i in nodes:
            out += [f'{name}{{node="{node_name(i)}",cluster="{CLUSTER}",device="mlx5_{p}",port="1"}} {value}'
                    for p in range(PORTS)]  # fmt: skip
    return out


class LoadSource:
    """Pre-rendered pages per target; ``/inject?node=N`` re-renders the straggler's job's targets."""

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes
        self.targets = [range(s, min(s + PER_TARGET, nodes)) for s in range(0, nodes, PER_TARGET)]
        self.pages = [self.variants(t, None) for t in self.targets]
        self.ticks = [0] * len(self.targets)

    @staticmethod
    def variants(nodes: range, straggler: int | None) -> list[bytes]:
        return [render(nodes, v, straggler) for v in range(VARIANTS)]

    def inject(self, straggler: int | None, job_of_node: int) -> None:
        """Set (or clear, with None) the straggler of the job of node ``job_of_node``."""
        job = job_of(job_of_node)
        for k, target in enumerate(self.targets):
            if any(job_of(i) == job for i in target):
                self.pages[k] = self.variants(target, straggler)

    def page(self, k: int) -> bytes:
        self.ticks[k] += 1
        body = self.pages[k][self.ticks[k] % VARIANTS]
        return body.replace(TICK, str(self.ticks[k]).encode())


def serve(nodes: int, port: int) -> None:
    source = LoadSource(nodes)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path, _, query = self.path.partition("?")
            if path == "/inject":
                args = dict(p.split("=") for p in query.split("&"))
                node = int(args["job_of"])
                source.inject(int(args["node"]) if args.get("node") else None, node)
                body = b"ok\n"
            elif path.startswith("/t/"):
                body = source.page(int(path[3:]))
            else:
                body = json.dumps({"targets": len(source.targets)}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print("ready", flush=True)
    server.serve_forever()


# ---------------------------------------------------------------------------------- the stack


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    """A process's peak resident memory so far (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def wait_for(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(1)


@dataclass
class Stack:
    work: Path
    nodes: int
    scrape_s: int
    engine: str = "prometheus"
    query_gogc: int = 100
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    prom_ports: list[int] = field(default_factory=list)

    def start(self, name: str, command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.work / f"{name}.log", "w")  # noqa: SIM115 (kept open with the process)
        self.procs[name] = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, **(env or {})}
        )
        return self.procs[name]

    def up(self) -> None:
        self.load_port = free_loopback_port()
        self.start(
            "load", [sys.executable, __file__, "--serve", str(self.nodes), "--port", str(self.load_port)]
        )
        wait_for(lambda: http_ok(f"http://127.0.0.1:{self.load_port}/"), 900, "the load source")
        targets = (self.nodes + PER_TARGET - 1) // PER_TARGET
        grpc = []
        for shard in range(2):
            port, side_grpc = free_loopback_port(), free_loopback_port()
            self.prom_ports.append(port)
            self.write_config(shard, [k for k in range(targets) if k % 2 == shard], rules=False)
            data = self.work / f"prom-{shard}"
            self.start(f"prometheus-{shard}", [
                "prometheus", f"--config.file={self.work / f'prometheus-{shard}.yml'}",
                f"--storage.tsdb.path={data}", f"--web.listen-address=127.0.0.1:{port}",
                "--web.enable-lifecycle", "--storage.tsdb.min-block-duration=2h",
                "--storage.tsdb.max-block-duration=2h"])  # fmt: skip
            wait_for(lambda p=port: http_ok(f"http://127.0.0.1:{p}/-/ready"), 120, "Prometheus")
            self.start(f"sidecar-{shard}", [
                str(THANOS), "sidecar", f"--tsdb.path={data}", f"--prometheus.url=http://127.0.0.1:{port}",
                f"--grpc-address=127.0.0.1:{side_grpc}",
                f"--http-address=127.0.0.1:{free_loopback_port()}"])  # fmt: skip
            grpc.append(side_grpc)
        self.query_port = free_loopback_port()
        self.start("query", [
            str(THANOS), "query", f"--http-address=127.0.0.1:{self.query_port}",
            f"--grpc-address=127.0.0.1:{free_loopback_port()}", "--query.replica-label=replica",
            f"--query.promql-engine={self.engine}",
            *(f"--endpoint=127.0.0.1:{p}" for p in grpc)],
            env={"GOGC": str(self.query_gogc)})  # fmt: skip
        self.targets = targets

    def write_config(self, shard: int, targets: list[int], rules: bool) -> None:
        static = [{"targets": [f"127.0.0.1:{self.load_port}"], "labels": {"__metrics_path__": f"/t/{k}"}}
                  for k in targets]  # fmt: skip
        config = {
            "global": {"scrape_interval": f"{self.scrape_s}s", "evaluation_interval": "15s",
                       "external_labels": {"shard": str(shard), "replica": "A"}},
            "rule_files": [str(RULES)] if rules else [],
            "scrape_configs": [{"job_name": "dcgm", "honor_labels": True,
                                "scrape_timeout": f"{self.scrape_s - 1}s", "static_configs": static}],
        }  # fmt: skip
        (self.work / f"prometheus-{shard}.yml").write_text(yaml.safe_dump(config))

    def load_rules(self) -> None:
        for shard in range(2):
            self.write_config(shard, [k for k in range(self.targets) if k % 2 == shard], rules=True)
            httpx.post(f"http://127.0.0.1:{self.prom_ports[shard]}/-/reload", timeout=60).raise_for_status()

    def count(self, expr: str) -> int:
        try:
            body = httpx.get(
                f"{self.url}/api/v1/query", params={"query": f"count({expr})"}, timeout=120
            ).json()
            result = body["data"]["result"]
            return int(float(result[0]["value"][1])) if result else 0
        except (httpx.HTTPError, KeyError, ValueError):
            return 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.query_port}"

    def inject(self, node: int | None, job_of_node: int) -> None:
        query = f"node={node if node is not None else ''}&job_of={job_of_node}"
        httpx.get(f"http://127.0.0.1:{self.load_port}/inject?{query}", timeout=300).raise_for_status()

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far: Query, the sidecars, the shards."""
        groups = {"query": ["query"], "sidecars": ["sidecar-0", "sidecar-1"],
                  "prometheus": ["prometheus-0", "prometheus-1"]}  # fmt: skip
        return {g: sum(cpu_seconds(self.procs[n].pid) for n in names) for g, names in groups.items()}

    def stop(self) -> None:
        for process in self.procs.values():
            process.terminate()
        for process in self.procs.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


# ---------------------------------------------------------------------------------- measurement
def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after}


def baseline(stack: Stack, seconds: float) -> dict[str, float]:
    """The stack's CPU per second with nobody querying it (the shards scrape, nothing else)."""
    before, started = stack.cpu(), time.monotonic()
    time.sleep(seconds)
    return {k: v / (time.monotonic() - started) for k, v in delta(stack.cpu(), before).items()}


class TimedSource(PrometheusSource):
    """The service's source, timing its own part of a cycle (queries and parsing) apart from the detector."""

    read_cpu_s = 0.0
    read_wall_s = 0.0

    def read(self, at: float | None = None) -> Any:
        cpu0, wall0 = time.process_time(), time.monotonic()
        try:
            return super().read(at)
        finally:
            self.read_cpu_s, self.read_wall_s = time.process_time() - cpu0, time.monotonic() - wall0


def rule_times(port: int) -> dict[str, float]:
    """The anomaly group's last evaluation on one shard: the group's seconds and each rule's."""
    groups = httpx.get(f"http://127.0.0.1:{port}/api/v1/rules", timeout=60).json()["data"]["groups"]
    group = next(g for g in groups if g["name"] == "fleetsight-anomaly-window")
    times = {r["name"]: round(r["evaluationTime"], 3) for r in group["rules"]}
    return {"group": round(group["evaluationTime"], 3), **times}


def run_mode(
    stack: Stack, mode: str, args: argparse.Namespace, idle: dict[str, float], job_node: int
) -> dict:
    """Cycles of a fresh service in one mode; a straggler injected after args.warm cycles."""
    source = TimedSource(stack.url, Queries(), timeout=600.0, mode=mode)
    service = AnomalyService(ServiceConfig(stack.url, interval_s=args.interval), source=source)
    straggler, injected, flagged, cycles = job_node + 2, None, None, []
    for n in range(args.warm + args.max_after):
        if n == args.warm:
            stack.inject(straggler, job_node)
            injected = time.time()
        started, cpu0, stack0 = time.monotonic(), time.process_time(), stack.cpu()
        service.cycle()
        cycle = {"wall_s": service.last_duration, "service_cpu_s": time.process_time() - cpu0,
                 "read_cpu_s": source.read_cpu_s, "read_wall_s": source.read_wall_s,
                 "nodes": service.last_counts[0], "errors": service.cycle_errors}  # fmt: skip
        if injected and flagged is None and any(s.node == node_name(straggler) for s in service.stragglers):
            flagged = time.time() - injected
        time.sleep(max(0.0, args.interval - (time.monotonic() - started)))
        elapsed = time.monotonic() - started
        used = delta(stack.cpu(), stack0)
        cycle.update({k: used[k] - idle[k] * elapsed for k in used})  # above the idle stack, per cycle
        cycles.append(cycle)
        print(f"  {mode} cycle {n}: " + ", ".join(f"{k} {v:.2f}" for k, v in cycle.items()), flush=True)
        if flagged is not None:
            break
    stack.inject(None, job_node)
    source.close()
    return summary(mode, cycles, flagged, source.mode_now)


def summary(mode: str, cycles: list[dict], flagged: float | None, mode_now: str | None) -> dict[str, Any]:
    ok = [c for c in cycles if c["nodes"]] or cycles
    med = {
        k: statistics.median(c[k] for c in ok)
        for k in ("wall_s", "service_cpu_s", "read_cpu_s", "read_wall_s", "query", "sidecars", "prometheus")
    }
    return {
        "mode": mode, "read_as": mode_now, "cycles": len(cycles), "nodes_read": ok[-1]["nodes"],
        "wall_s": med["wall_s"], "wall_max_s": max(c["wall_s"] for c in ok),
        "service_cpu_s": med["service_cpu_s"], "read_cpu_s": med["read_cpu_s"],
        "read_wall_s": med["read_wall_s"],
        "query_cpu_s": med["query"], "sidecar_cpu_s": med["sidecars"],
        "prometheus_cpu_s": med["prometheus"],
        "total_cpu_s": med["service_cpu_s"] + med["query"] + med["sidecars"] + med["prometheus"],
        "flag_latency_s": flagged, "errors": ok[-1]["errors"],
    }  # fmt: skip


def run_point(nodes: int, args: argparse.Namespace) -> list[dict]:
    work = Path(tempfile.mkdtemp(prefix=f"anomaly100k-{nodes}-"))
    stack = Stack(work, nodes, args.scrape_interval, args.engine, args.query_gogc)
    try:
        t0 = time.monotonic()
        stack.up()
        gpus = nodes * GPUS
        wait_for(lambda: stack.count("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE") == gpus, 600, "every GPU's series")
        print(f"{nodes} nodes: up in {time.monotonic() - t0:.0f} s", flush=True)
        time.sleep(2 * args.scrape_interval)  # the first windows fill
        idle = baseline(stack, args.baseline)
        print(f"  idle stack CPU per s: {idle}", flush=True)
        rows = [run_mode(stack, "raw", args, idle, job_node=3 * JOB_NODES)] if "raw" in args.modes else []
        stack.load_rules()
        wait_for(lambda: stack.count("gpu:dcgm_tensor_active:median30s") == gpus, 600, "the recorded window")
        with_rules = baseline(stack, args.baseline)  # the rules' evaluations, nobody reading them
        # Against the idle stack without the rules: the recorded mode's cost includes its evaluations.
        rows.append(run_mode(stack, "recorded", args, idle, job_node=5 * JOB_NODES))
        rows[-1]["rules_cpu_s"] = (with_rules["prometheus"] - idle["prometheus"]) * args.interval
        rows[-1]["rule_eval_s"] = [rule_times(port) for port in stack.prom_ports]
        print(f"  rule evaluation (s, per shard): {rows[-1]['rule_eval_s']}", flush=True)
        query_rss = peak_rss_mb(stack.procs["query"].pid)
        for row in rows:
            row.update(nodes=nodes, gpus=gpus, scrape_s=args.scrape_interval, engine=args.engine,
                       query_gogc=args.query_gogc, query_peak_rss_mb=query_rss)  # fmt: skip
        return rows
    finally:
        stack.stop()


def print_table(rows: list[dict]) -> None:
    """The target (issue 37) is the service + Thanos Query column; "all" adds the sidecars and shards."""
    print(
        "\n| nodes | GPUs | mode | cycle wall s (median / max) | read wall s | service CPU s (read) "
        "| Thanos Query CPU s (GOGC, peak RSS MiB) | service + Query CPU s | sidecars CPU s "
        "| shards CPU s (of it rules) | all CPU s | flag latency s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["nodes"], r["mode"] != "raw")):
        rules = f" ({r['rules_cpu_s']:.2f})" if "rules_cpu_s" in r else ""
        latency = f"{r['flag_latency_s']:.0f}" if r["flag_latency_s"] is not None else "not flagged"
        print(f"| {r['nodes']:,} | {r['gpus']:,} | {r['mode']} | {r['wall_s']:.2f} / {r['wall_max_s']:.2f} "
              f"| {r['read_wall_s']:.2f} | {r['service_cpu_s']:.2f} ({r['read_cpu_s']:.2f}) "
              f"| {r['query_cpu_s']:.2f} ({r['query_gogc']}, {r['query_peak_rss_mb']:.0f}) "
              f"| {r['service_cpu_s'] + r['query_cpu_s']:.2f} | {r['sidecar_cpu_s']:.2f} "
              f"| {r['prometheus_cpu_s']:.2f}{rules} | {r['total_cpu_s']:.2f} | {latency} |")  # fmt: skip


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="1250,6250,12500", help="points, comma-separated")
    parser.add_argument("--scrape-interval", type=int, default=15, help="the dcgm job's, seconds")
    parser.add_argument("--interval", type=float, default=30.0, help="the service's cycle, seconds")
    parser.add_argument("--warm", type=int, default=3, help="cycles before the straggler is injected")
    parser.add_argument("--max-after", type=int, default=5, help="cycles after it, at most")
    parser.add_argument("--baseline", type=float, default=45.0, help="idle window, seconds")
    parser.add_argument("--out", type=Path, default=Path("/tmp/anomaly_100k.json"))
    parser.add_argument("--modes", default="raw,recorded", help="raw,recorded or recorded alone")
    parser.add_argument(
        "--engine", default="prometheus", choices=("prometheus", "thanos"), help="Thanos Query's engine"
    )
    parser.add_argument(
        "--query-gogc", type=int, default=100,
        help="Thanos Query's GOGC (Go's default 100; docs/scaling.md recommends 400 at 100,000 GPUs)",
    )  # fmt: skip
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    # A SIGTERM unwinds like Ctrl-C, so that each point's finally stops its processes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.serve:
        serve(args.serve, args.port)
        return
    rows: list[dict] = []
    for nodes in (int(n) for n in args.nodes.split(",")):
        rows += run_point(nodes, args)
        args.out.write_text(json.dumps(rows, indent=1))
        print_table(rows)
    print(f"\nload average {os.getloadavg()[0]:.1f}; figures in {args.out}")


if __name__ == "__main__":
    main()
