"""Fleet-scale benchmark: what one Prometheus replica (and Thanos Query over it) costs per node and
per series, measured for N = 128, 256, 512, 1,024, 2,048 nodes, and one replica vs two shards.

For each N, the load source (metrics/scale/loadgen.py) serves N nodes on N loopback addresses from a
capture of the twin's exporters (dcgm-exporter 8 GPUs, node agent, fabric share, node_exporter), and a
Prometheus built from metrics/prometheus.yml's jobs (their intervals and relabelling) scrapes them
through file_sd and evaluates rules/*.yml, beside a Thanos sidecar and Thanos Query. After the targets
are up and a warm-up, one window is measured:

  active series            prometheus_tsdb_head_series
  samples/s                rate of prometheus_tsdb_head_samples_appended_total
  RSS, CPU                 /proc of the Prometheus process (CPU share = core-seconds per second)
  WAL bytes/h              growth of the wal folder over the window, per hour
  block bytes/h            a TSDB snapshot of the head (what the 2-hour block will hold), per hour
  rule groups              sum and max of prometheus_rule_group_last_duration_seconds
  query p50/p99            Thanos Query, the fleet-health dashboard's and the executive report's
                           heaviest queries, QUERY_REPEATS times each
  anomaly / health cycle   the anomaly service (`fleetsight anomaly serve`, production's 30 s cycle
                           and 30 s window) and the health service (`fleetsight health serve`, the
                           policy's 5 s refresh, reading up, fleetsight_straggler and ALERTS), each
                           pointed at Thanos Query as production runs them; per cycle: CPU seconds
                           (/proc of the service), wall seconds (the service's own last-cycle
                           duration after every cycle), and the seconds Thanos Query spent answering
                           it (its http_request_duration_seconds; each service gets its own Query
                           process over the same stores so that the timings say whose they are).
                           Prometheus scrapes both (jobs anomaly, fleetsight-health), so the health
                           service reads the anomaly service's stragglers as it does in production.

then least squares per column against series and nodes (slope per 1,000), printed, with a plot in
docs/images/fleet_scale.png and the figures in docs/images/fleet_scale.json.

One replica vs 2 shards (--shards-at N): the same N on one Prometheus with every rule, then on two
shards built by metrics/sharding/generate.py (hashmod on `node`, the shard-local rules on each shard)
with Thanos Ruler evaluating the fleet-wide rules (metrics/sharding/placement.yml) through Thanos
Query, as docs/scaling.md deploys it; the ruler's RSS, CPU and rule timings are printed with the shards.

Where the curve stops, and why, is printed as one line starting STOPPED:
  before a point   MEMORY: the bench's processes' peak RSS predicted for it (least squares of the
                   peaks measured so far, this run's and --earlier's) x 1.25 for the head's growth,
                   + --memory-reserve, is more than MemAvailable;
  after a point    a scrape slower than its job's interval, a rule group slower than its interval
                   (a shard's or the ruler's), a consumer cycle slower than its interval, a dashboard
                   query timing out (printed as LIMIT lines; with --keep-going the next points still
                   run, so that the curve's figures go on past the first overrun).
Knobs that cut the bench's own overhead without making Prometheus do less than in production:
--no-consumers, --no-snapshot, --prometheus-flag (e.g. --storage.tsdb.head-chunks-write-queue-size=N),
--gomemlimit (Go's soft limit, as a site sets it on a Prometheus host: more GC work near the limit,
the same samples and rules).

Usage: .venv/bin/python bench/fleet_scale.py [--nodes 128,256,512,1024,2048] [--window 60]
       [--warmup 20] [--shards-at 512] [--capture DIR] [--earlier ROWS.jsonl] [--memory-reserve 1.5]
Example (the big points, on a quiet machine): nice -n 10 .venv/bin/python bench/fleet_scale.py
       --nodes 128,256,512,1024,2048 --window 60 --warmup 20 --shards-at 1024 --keep-going
The machine is shared: the load average is printed with every point.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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

from dashboards import common_queries  # noqa: E402
from evaluation.scale_capture import capture  # noqa: E402
from fleetsight.procs import free_loopback_port as free_port  # noqa: E402
from metrics.scale.capture import Capture  # noqa: E402
from metrics.scale.loadgen import load_source_job  # noqa: E402
from metrics.sharding.generate import PRODUCTION_CONFIG, shard_config, split_rules  # noqa: E402

THANOS = REPO / ".cache" / "bin" / "thanos"
JOBS = ("dcgm", "fleetsight-node", "fleetsight-fabric", "node")
SERIES_PER_NODE = 1925  # measured at 128-512 nodes (exporters + up/scrape metadata + rule outputs)
# The memory check before a point: the bench's processes' peak RSS (Prometheus, sidecars, Thanos, the
# load source, the consumers), predicted from the points measured so far (least squares on nodes), x
# MEMORY_GROWTH for the head's growth past the window, + --memory-reserve for the rest of the machine.
# Before any point, the priors: Prometheus 9.13 GiB of RSS per 1,000 nodes (fitted at 128-512 in the
# first run) + ~10 %; the rest (sidecar, 3 Thanos Query, the consumers, the load source) 0.64 GiB at
# 128 nodes, most of it fixed.
PROMETHEUS_PER_NODE = 10.0 * 2**30 / 1000
REST_BASE = 0.5 * 2**30
REST_PER_NODE = 1.0 * 2**30 / 1000
MEMORY_GROWTH = 1.25
PROMETHEUS_SHARE = 0.66  # Prometheus's part of the bench's peak RSS (1.24 of 1.88 GiB at 128 nodes)
# A GOMEMLIMIT is soft: at 128 nodes with 600 MiB, Prometheus held 0.644 GiB (1.07x), at twice the CPU.
GOMEMLIMIT_OVERSHOOT = 1.15
CONSUMER_JOBS = ("anomaly", "fleetsight-health")
ANOMALY_INTERVAL_S = 30  # production's default cycle (fleetsight anomaly serve --interval)
QUERY_REPEATS = 5
QUERY_TIMEOUT_S = 60.0
RANGE = "5m"  # the KPI queries' $__range: the window this bench has history for
DASHBOARD_QUERIES = {
    "fleet-health: exporters up": "sum by (job) (up)",
    "fleet-health: firing alerts": 'count by (severity) (ALERTS{alertstate="firing"})',
    "fleet-health: power brake GPUs": f"count by (node) ({common_queries.POWER_BRAKE})",
    "fleet-health: IB symbol errors": "sum by (node, device, port) "
    "(rate(fleetsight_infiniband_port_symbol_error_total[1m])) > 0",
    "fleet-health: H2D bandwidth 12h": "avg by (node, gpu) "
    "(avg_over_time(fleetsight_pcie_host_to_device_bandwidth_bytes_per_second[12h]))",
    "kpi: GPU utilization": f"avg(avg_over_time(DCGM_FI_DEV_GPU_UTIL[{RANGE}])) / 100",
    "kpi: effective training time": "avg(avg_over_time("
    f'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{hpc_job!=""}}[{RANGE}])) '
    f'/ avg(max_over_time(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{hpc_job!=""}}[{RANGE}]))',
    "kpi: energy": f"sum(avg_over_time(DCGM_FI_DEV_POWER_USAGE[{RANGE}]))",
}


@dataclass
class Options:
    """What every point runs with (the command line's knobs)."""

    consumers: bool = True
    snapshot: bool = True  # the block-cost snapshot: the bench's own work, it costs Prometheus memory
    prometheus_flags: list[str] = field(default_factory=list)
    gomemlimit: str = ""  # Go's soft memory limit for Prometheus (GOMEMLIMIT), e.g. "14GiB"

    def prometheus_env(self) -> dict[str, str]:
        return {"GOMEMLIMIT": self.gomemlimit} if self.gomemlimit else {}


# ------------------------------------------------------------------------------------ processes
def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int, field_name: str = "VmRSS") -> int:
    """Resident memory of a process (VmRSS), or its peak so far (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field_name}:"):
            return int(line.split()[1]) * 1024
    return 0


def scrape_text(url: str) -> str:
    try:
        return httpx.get(url, timeout=10).text
    except httpx.HTTPError:
        return ""


def sample_sum(text: str, name: str, **labels: str) -> float:
    """Sum of one metric's samples in an exposition whose labels include ``labels``."""
    marks = [f'{k}="{v}"' for k, v in labels.items()]
    total_value = 0.0
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if (head == name or head.startswith(name + "{")) and all(m in head for m in marks):
            total_value += float(value)
    return total_value


def sample_values(text: str, name: str) -> list[float]:
    return [
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    ]


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def load_average() -> float:
    return os.getloadavg()[0]


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


class Stack:
    """Load source, K Prometheus replicas (one per shard), their sidecars, Thanos Query, Thanos Ruler
    (K > 1: the fleet-wide rules), and the anomaly and health services with a Thanos Query each."""

    def __init__(self, work: Path, capture_dir: Path, nodes: int, shards: int, options: Options) -> None:
        self.work, self.nodes, self.shards, self.options = work, nodes, shards, options
        consumers = options.consumers
        self.procs: list[subprocess.Popen] = []
        self.prom_ports: list[int] = []
        self.data: list[Path] = []
        self.sd = work / "sd"
        production = yaml.safe_load(PRODUCTION_CONFIG.read_text())
        self.eval_interval = production["global"].get("evaluation_interval", "1m")
        self.rule_files = [str(REPO / "rules" / "*.yml")]
        if shards > 1:  # shard-local rules on the shards, the fleet-wide ones on Thanos Ruler
            local, fleet = split_rules()
            for folder, files in (("rules-shard", local), ("rules-fleet", fleet)):
                (work / folder).mkdir()
                for name, content in files.items():
                    (work / folder / name).write_text(yaml.safe_dump(content, sort_keys=False))
            self.rule_files = [str(work / "rules-shard" / "*.yml")]
        self.consumer_ports = {name: free_port() for name in CONSUMER_JOBS} if consumers else {}
        self.sd.mkdir()
        for name, port in self.consumer_ports.items():
            (self.sd / f"{name}.json").write_text(json.dumps([{"targets": [f"127.0.0.1:{port}"]}]))
        port = free_port()
        self.loadgen = self.start(
            [sys.executable, "-m", "metrics.scale.loadgen", "--capture", str(capture_dir),
             "--nodes", str(nodes), "--port", str(port), "--file-sd", str(self.sd)], "loadgen")  # fmt: skip
        self.wait(lambda: (self.sd / "node.json").exists(), 120, "the load source")
        grpc = []
        for index in range(shards):
            prom, side_http, side_grpc = free_port(), free_port(), free_port()
            data = work / f"prom-{index}"
            config = work / f"prometheus-{index}.yml"
            config.write_text(yaml.safe_dump(self.config(index, prom)))
            self.start(
                ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}",
                 f"--web.listen-address=127.0.0.1:{prom}", "--storage.tsdb.min-block-duration=2h",
                 "--storage.tsdb.max-block-duration=2h", "--web.enable-admin-api",
                 *options.prometheus_flags],
                f"prometheus-{index}", options.prometheus_env())  # fmt: skip
            self.wait(lambda p=prom: self.ok(f"http://127.0.0.1:{p}/-/ready"), 120, "Prometheus")
            self.start([str(THANOS), "sidecar", f"--tsdb.path={data}", f"--prometheus.url=http://127.0.0.1:{prom}",
                        f"--grpc-address=127.0.0.1:{side_grpc}", f"--http-address=127.0.0.1:{side_http}"],
                       f"sidecar-{index}")  # fmt: skip
            self.prom_ports.append(prom)
            self.data.append(data)
            grpc.append(side_grpc)
        self.ruler_grpc = free_port() if shards > 1 else 0
        self.query_port = free_port()
        replicas = ["--query.replica-label=replica", "--query.replica-label=rule_replica"]
        endpoints = [*grpc, *([self.ruler_grpc] if self.ruler_grpc else [])]
        self.query = self.start(
            [str(THANOS), "query", f"--http-address=127.0.0.1:{self.query_port}",
             f"--grpc-address=127.0.0.1:{free_port()}", *replicas,
             *(f"--endpoint=127.0.0.1:{p}" for p in endpoints)], "query")  # fmt: skip
        self.ruler: subprocess.Popen | None = None
        if shards > 1:  # the fleet-wide rules (metrics/sharding/placement.yml) on Thanos Ruler
            self.ruler_port = free_port()
            self.ruler = self.start(
                [str(THANOS), "rule", f"--data-dir={work / 'ruler'}",
                 f"--query=http://127.0.0.1:{self.query_port}",
                 f"--rule-file={work / 'rules-fleet' / '*.yml'}", f"--eval-interval={self.eval_interval}",
                 '--label=rule_replica="A"', f"--grpc-address=127.0.0.1:{self.ruler_grpc}",
                 f"--http-address=127.0.0.1:{self.ruler_port}"], "ruler")  # fmt: skip
        # The consumers, as production runs them: each reads through Thanos Query. Each has its own
        # Thanos Query process over the same stores, so that Query's request timings tell whose
        # queries they were (one Query in production: the same requests, the same stores).
        self.consumers: dict[str, subprocess.Popen] = {}
        self.fronts: dict[str, int] = {}
        if consumers:
            for name in CONSUMER_JOBS:
                self.fronts[name] = free_port()
                self.start(
                    [str(THANOS), "query", f"--http-address=127.0.0.1:{self.fronts[name]}",
                     f"--grpc-address=127.0.0.1:{free_port()}", *replicas,
                     *(f"--endpoint=127.0.0.1:{p}" for p in endpoints)], f"query-{name}")  # fmt: skip
            fleetsight = str(Path(sys.executable).with_name("fleetsight"))
            self.consumers["anomaly"] = self.start(
                [fleetsight, "anomaly", "serve", f"--prometheus-url=http://127.0.0.1:{self.fronts['anomaly']}",
                 f"--interval={ANOMALY_INTERVAL_S}", f"--listen=127.0.0.1:{self.consumer_ports['anomaly']}"],
                "anomaly")  # fmt: skip
            self.consumers["fleetsight-health"] = self.start(
                [fleetsight, "health", "serve",
                 f"--prometheus-url=http://127.0.0.1:{self.fronts['fleetsight-health']}",
                 f"--anomaly-url=http://127.0.0.1:{self.consumer_ports['anomaly']}",
                 f"--listen=127.0.0.1:{self.consumer_ports['fleetsight-health']}",
                 f"--state-dir={work / 'health'}", "--cluster=fleet-scale", "--no-breaker-alert"],
                "health")  # fmt: skip

    def config(self, index: int, own_port: int) -> dict[str, Any]:
        production = yaml.safe_load(PRODUCTION_CONFIG.read_text())
        production["global"]["external_labels"].update(cluster="fleet-scale", replica="A")
        config = shard_config(production, self.shards, index, self.rule_files)
        config.pop("alerting", None)  # no Alertmanager in the bench: alerts are evaluated, not sent
        jobs = []
        for job in config["scrape_configs"]:
            if job["job_name"] == "prometheus":
                job["static_configs"] = [{"targets": [f"127.0.0.1:{own_port}"]}]  # itself: its own metrics
                jobs.append(job)
                continue
            if job["job_name"] not in (*JOBS, *self.consumer_ports):
                continue
            jobs.append(load_source_job(job, self.sd))
        config["scrape_configs"] = jobs
        return config

    def start(self, command: list[str], name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.work / f"{name}.log", "w")  # noqa: SIM115 (closed with the process)
        environment = {**os.environ, **(env or {})}
        process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=environment)
        self.procs.append(process)
        return process

    @staticmethod
    def ok(url: str) -> bool:
        try:
            return httpx.get(url, timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    @staticmethod
    def wait(check, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(1)

    def prometheus_pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.args[0] == "prometheus"]

    def query_prom(self, index: int, expr: str) -> float:
        result = httpx.get(
            f"http://127.0.0.1:{self.prom_ports[index]}/api/v1/query", params={"query": expr}, timeout=60
        )
        data = result.json()["data"]["result"]
        return float(data[0]["value"][1]) if data else float("nan")

    def stop(self) -> None:
        for process in self.procs:
            process.terminate()
        for process in self.procs:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


# ---------------------------------------------------------------------------------- measurement
def measure(stack: Stack, window: float, warmup: float) -> dict[str, Any]:
    targets = stack.nodes * len(JOBS)
    up = f'count(up{{job=~"{"|".join(JOBS)}"}} == 1)'
    stack.wait(lambda: sum(stack.query_prom(i, up) or 0 for i in range(stack.shards)) >= targets,
               300, f"{targets} targets up")  # fmt: skip
    time.sleep(warmup)
    pids = stack.prometheus_pids()
    cpu0 = [cpu_seconds(p) for p in pids]
    lg0, q0 = cpu_seconds(stack.loadgen.pid), cpu_seconds(stack.query.pid)
    ruler0 = cpu_seconds(stack.ruler.pid) if stack.ruler else 0.0
    watch = ConsumerWatch(stack)
    wal0 = [du(d / "wal") for d in stack.data]
    t0 = time.monotonic()
    while time.monotonic() - t0 < window:
        time.sleep(1)
        watch.poll()
    elapsed = time.monotonic() - t0
    consumers = watch.result()
    cpu = [(cpu_seconds(p) - c) / elapsed for p, c in zip(pids, cpu0, strict=True)]
    wal = [(du(d / "wal") - w) * 3600 / elapsed for d, w in zip(stack.data, wal0, strict=True)]
    win = f"{int(max(window, 60))}s"  # the self-scrape is every 15 s: rate needs a few samples
    per_shard = [
        {
            "series": stack.query_prom(i, "prometheus_tsdb_head_series"),
            "samples_per_s": stack.query_prom(i, f"rate(prometheus_tsdb_head_samples_appended_total[{win}])"),
            "rss": rss_bytes(pids[i]),
            "cpu": cpu[i],
            "wal_per_h": wal[i],
            "rules_sum_s": stack.query_prom(i, "sum(prometheus_rule_group_last_duration_seconds)"),
            "rules_max_s": stack.query_prom(i, "max(prometheus_rule_group_last_duration_seconds)"),
            "rules_over_interval": stack.query_prom(
                i, "max(prometheus_rule_group_last_duration_seconds / prometheus_rule_group_interval_seconds)"
            ),
            "scrape_max_s": stack.query_prom(i, "max(scrape_duration_seconds)"),
            "scrape_over_interval": scrape_over_interval(stack, i),
        }
        for i in range(stack.shards)
    ]
    ruler = ruler_figures(stack, ruler0, elapsed)
    for i, shard in enumerate(per_shard):
        if stack.options.snapshot:
            shard.update(block_cost(stack, i, shard["samples_per_s"]))
        else:
            shard.update(bytes_per_sample=float("nan"), index_bytes=float("nan"), block_per_h=float("nan"))
        shard["peak_rss"] = rss_bytes(pids[i], "VmHWM")  # after the snapshot, which costs memory too
    latencies = query_latencies(stack.query_port)
    return {
        "nodes": stack.nodes,
        "shards": stack.shards,
        "per_shard": per_shard,
        "ruler": ruler,
        "consumers": consumers,
        "loadgen_cpu": (cpu_seconds(stack.loadgen.pid) - lg0) / elapsed,
        "query_cpu": (cpu_seconds(stack.query.pid) - q0) / elapsed,
        "bench_peak_rss": sum(rss_bytes(p.pid, "VmHWM") for p in stack.procs if p.poll() is None),
        "queries": latencies,
        "load_average": load_average(),
    }


def scrape_over_interval(stack: Stack, index: int) -> float:
    """The slowest scrape of each job over that job's scrape interval (above 1: scrapes fall behind)."""
    config = yaml.safe_load((stack.work / f"prometheus-{index}.yml").read_text())
    default = config["global"].get("scrape_interval", "1m")
    intervals = {j["job_name"]: seconds(j.get("scrape_interval", default)) for j in config["scrape_configs"]}
    url = f"http://127.0.0.1:{stack.prom_ports[index]}/api/v1/query"
    answer = httpx.get(url, params={"query": "max by (job) (scrape_duration_seconds)"}, timeout=60).json()
    ratios = [
        float(r["value"][1]) / intervals[r["metric"]["job"]]
        for r in answer["data"]["result"]
        if r["metric"].get("job") in intervals
    ]
    return max(ratios, default=float("nan"))


def seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for unit in sorted(units, key=len, reverse=True):
        if duration.endswith(unit):
            return float(duration[: -len(unit)]) * units[unit]
    raise ValueError(f"not a duration: {duration}")


def ruler_figures(stack: Stack, cpu0: float, elapsed: float) -> dict[str, float] | None:
    """Thanos Ruler's cost and its rule groups' evaluation times (its own /metrics)."""
    if stack.ruler is None:
        return None
    text = scrape_text(f"http://127.0.0.1:{stack.ruler_port}/metrics")
    durations = sample_values(text, "prometheus_rule_group_last_duration_seconds")
    intervals = sample_values(text, "prometheus_rule_group_interval_seconds")
    ratios = [d / i for d, i in zip(durations, intervals, strict=False) if i]
    return {
        "rss": rss_bytes(stack.ruler.pid),
        "cpu": (cpu_seconds(stack.ruler.pid) - cpu0) / elapsed,
        "rules_sum_s": sum(durations),
        "rules_max_s": max(durations, default=0.0),
        "rules_over_interval": max(ratios, default=0.0),
        "groups": len(durations),
    }


class ConsumerWatch:
    """Per cycle of the anomaly and health services, over the window: CPU seconds (/proc of the
    service), wall seconds (the service's own last-cycle duration, read after every cycle) and the
    seconds its Thanos Query spent answering it (Query's http_request_duration_seconds)."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.last: dict[str, dict[str, float]] = {}
        self.start = {name: self.state(name) for name in stack.consumers}
        self.last = dict(self.start)
        self.walls: dict[str, list[float]] = {name: [] for name in stack.consumers}

    def state(self, name: str) -> dict[str, float]:
        port = self.stack.consumer_ports[name]
        metrics = scrape_text(f"http://127.0.0.1:{port}/metrics")
        front = scrape_text(f"http://127.0.0.1:{self.stack.fronts[name]}/metrics")
        if name == "anomaly":
            cycles = sample_sum(metrics, "fleetsight_anomaly_cycles_total")
            wall = sample_sum(metrics, "fleetsight_anomaly_cycle_duration_seconds")
            errors = sample_sum(metrics, "fleetsight_anomaly_cycle_errors_total")
        else:
            try:
                cycles = float(
                    httpx.get(f"http://127.0.0.1:{port}/v1/status", timeout=10).json()["refreshes"]
                )
            except (httpx.HTTPError, ValueError, KeyError):
                cycles = self.last.get(name, {}).get("cycles", 0.0)  # counted at the next poll
            wall = sample_sum(metrics, "fleetsight_health_refresh_duration_seconds")
            errors = 0.0
        return {
            "cycles": cycles,
            "wall": wall,
            "errors": errors,
            "cpu": cpu_seconds(self.stack.consumers[name].pid),
            "query_s": sample_sum(front, "http_request_duration_seconds_sum", handler="query"),
            "queries": sample_sum(front, "http_request_duration_seconds_count", handler="query"),
        }

    def poll(self) -> None:
        for name in self.stack.consumers:
            now = self.state(name)
            if now["cycles"] > self.last[name]["cycles"]:
                self.walls[name].append(now["wall"])
            self.last[name] = now

    def result(self) -> dict[str, dict[str, float]]:
        out = {}
        for name in self.stack.consumers:
            first, last = self.start[name], self.last[name]
            cycles = last["cycles"] - first["cycles"]
            per = 1 / cycles if cycles else float("nan")
            out[name] = {
                "cycles": cycles,
                "errors": last["errors"] - first["errors"],
                "cpu_s": (last["cpu"] - first["cpu"]) * per,
                "wall_s": statistics.mean(self.walls[name]) if self.walls[name] else float("nan"),
                "wall_max_s": max(self.walls[name], default=float("nan")),
                "query_s": (last["query_s"] - first["query_s"]) * per,
                "queries": (last["queries"] - first["queries"]) * per,
                "rss": rss_bytes(self.stack.consumers[name].pid),
                **self.work_done(name),
            }
        return out

    def work_done(self, name: str) -> dict[str, Any]:
        """What the last cycle saw: proof that it read the fleet, not an empty answer."""
        port = self.stack.consumer_ports[name]
        try:
            status = httpx.get(f"http://127.0.0.1:{port}/v1/status", timeout=10).json()
        except (httpx.HTTPError, ValueError):
            return {}
        if name == "anomaly":
            return {k: status.get(k) for k in ("nodes", "jobs", "stragglers")}
        return {"states": status.get("states"), "sources": status.get("sources")}


def block_cost(stack: Stack, index: int, samples_per_s: float) -> dict[str, float]:
    """What a 2-hour block of this shard will cost, from a snapshot of its head (written as a block):
    chunk bytes per sample (from the block's own sample count) x samples per hour, plus the index,
    which grows with series, not time. Minutes of head hold partly filled chunks: the bytes per sample
    are an upper bound of what full 120-sample chunks reach."""
    url = f"http://127.0.0.1:{stack.prom_ports[index]}/api/v1/admin/tsdb/snapshot"
    name = httpx.post(url, timeout=300).json()["data"]["name"]
    snap = stack.data[index] / "snapshots" / name
    chunks = index_bytes = samples = 0
    for meta in snap.glob("*/meta.json"):
        samples += json.loads(meta.read_text())["stats"]["numSamples"]
        chunks += du(meta.parent / "chunks")
        index_bytes += (meta.parent / "index").stat().st_size
    shutil.rmtree(snap, ignore_errors=True)
    per_sample = chunks / samples if samples else float("nan")
    return {
        "bytes_per_sample": per_sample,
        "index_bytes": index_bytes,
        "block_per_h": samples_per_s * 3600 * per_sample + index_bytes / 2,  # one index per 2-hour block
    }


def query_latencies(port: int) -> dict[str, dict[str, float]]:
    """p50 and slowest of QUERY_REPEATS runs per query; a query that does not answer within
    QUERY_TIMEOUT_S counts as that long (and is reported as timed out)."""
    out = {}
    with httpx.Client(timeout=QUERY_TIMEOUT_S) as client:
        for name, expr in DASHBOARD_QUERIES.items():
            times, timeouts = [], 0
            for _ in range(QUERY_REPEATS):
                started = time.perf_counter()
                try:
                    params = {"query": expr, "dedup": "true"}
                    client.get(f"http://127.0.0.1:{port}/api/v1/query", params=params).raise_for_status()
                    times.append(time.perf_counter() - started)
                except httpx.TimeoutException:
                    times.append(QUERY_TIMEOUT_S)
                    timeouts += 1
                    break  # one timeout says enough: do not queue more of the same behind it
            times.sort()
            out[name] = {"p50": statistics.median(times), "p99": times[-1], "timeouts": timeouts}
    return out


def total(point: dict[str, Any], key: str) -> float:
    return sum(shard[key] for shard in point["per_shard"])


def row(point: dict[str, Any]) -> dict[str, float]:
    q = point["queries"]
    return {
        "nodes": point["nodes"],
        "gpus": point["nodes"] * 8,
        "series": total(point, "series"),
        "samples/s": total(point, "samples_per_s"),
        "RSS GiB": total(point, "rss") / 2**30,
        "CPU cores": total(point, "cpu"),
        "WAL GiB/h": total(point, "wal_per_h") / 2**30,
        "block GiB/h": total(point, "block_per_h") / 2**30,
        "B/sample": statistics.mean(s["bytes_per_sample"] for s in point["per_shard"]),
        "rules sum s": total(point, "rules_sum_s"),
        "rules max s": max(s["rules_max_s"] for s in point["per_shard"]),
        "query p50 s": statistics.median(v["p50"] for v in q.values()),
        "query p99 s": max(v["p99"] for v in q.values()),
        "query timeouts": sum(v.get("timeouts", 0) for v in q.values()),
        **consumer_columns(point),
        "Prometheus peak RSS GiB": total(point, "peak_rss") / 2**30,
        "bench peak RSS GiB": point.get("bench_peak_rss", float("nan")) / 2**30,
        "loadgen CPU": point["loadgen_cpu"],
        "load avg": point["load_average"],
    }


def consumer_columns(point: dict[str, Any]) -> dict[str, float]:
    """Per cycle: CPU seconds, wall seconds, and the seconds Thanos Query spent answering it."""
    out = {}
    for name, label in (("anomaly", "anomaly"), ("fleetsight-health", "health")):
        c = point.get("consumers", {}).get(name, {})
        nan = float("nan")
        out[f"{label} cycle CPU s"] = c.get("cpu_s", nan)
        out[f"{label} cycle wall s"] = c.get("wall_s", nan)
        out[f"{label} query s"] = c.get("query_s", nan)
    return out


def print_table(rows: list[dict[str, float]]) -> None:
    if not rows:
        print("(no point measured)")
        return
    widest = max(rows, key=len)  # an --earlier row may lack newer columns
    keys = list(dict.fromkeys([*widest, *(k for r in rows for k in r)]))
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(cell(r.get(k)) for k in keys) + " |")


def cell(value: float | None) -> str:
    if value is None or value != value:  # missing, or NaN (nothing measured)
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def fit(rows: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Least squares y = a + b x per column, x = series (b per 1,000 series) and x = nodes."""
    fits = {}
    series_all = np.array([r["series"] for r in rows])
    nodes_all = np.array([r["nodes"] for r in rows])
    for key in (
        "samples/s",
        "RSS GiB",
        "CPU cores",
        "WAL GiB/h",
        "block GiB/h",
        "rules sum s",
        "query p99 s",
        "anomaly cycle CPU s",
        "anomaly cycle wall s",
        "health cycle CPU s",
        "health cycle wall s",
        "bench peak RSS GiB",
    ):
        have = [i for i, r in enumerate(rows) if r.get(key) is not None and r[key] == r[key]]
        if len(have) < 2:
            continue
        y = np.array([rows[i][key] for i in have])
        series, nodes = series_all[have], nodes_all[have]
        b_s, _ = np.polyfit(series, y, 1)
        b_n, a_n = np.polyfit(nodes, y, 1)
        fits[key] = {"per_1k_series": b_s * 1000, "per_1k_nodes": b_n * 1000, "intercept": a_n}
    return fits


def plot(rows: list[dict[str, float]], fits: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes = [r["nodes"] for r in rows]
    xs = np.linspace(0, max(2048, max(nodes)), 50)
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    panels = (
        ("Prometheus RSS (GiB)", ("RSS GiB",)),
        ("Prometheus CPU (cores)", ("CPU cores",)),
        ("block bytes per hour (GiB)", ("block GiB/h",)),
        ("consumers: CPU s per cycle", ("anomaly cycle CPU s", "health cycle CPU s")),
    )
    for ax, (title, keys) in zip(axes, panels, strict=True):
        for key in keys:
            have = [r for r in rows if r.get(key) is not None and r[key] == r[key]]
            name = key.split(" cycle")[0] if len(keys) > 1 else "measured"
            ax.plot([r["nodes"] for r in have], [r[key] for r in have], "o", label=name)
            if (f := fits.get(key)) is not None:  # a column measured at fewer than 2 points has no fit
                ax.plot(
                    xs, f["intercept"] + f["per_1k_nodes"] * xs / 1000, "--", label=f"{name}, least squares"
                )
        ax.set_xlabel("nodes (8 GPUs each)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        "One Prometheus replica, FleetSight's exporters per node (measured on a shared 2-core machine)"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def run_point(
    capture_dir: Path, nodes: int, shards: int, window: float, warmup: float, options: Options
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"fleet-scale-{nodes}-") as work:
        stack = Stack(Path(work), capture_dir, nodes, shards, options)
        try:
            return measure(stack, window, warmup)
        finally:
            stack.stop()


def memory_wanted(
    measured: list[tuple[int, float, float]], nodes: int, reserve: int, limit: int = 0
) -> tuple[int, int]:
    """(predicted peak RSS of the bench's processes at ``nodes``, memory wanted before starting).

    ``measured``: (nodes, the bench's peak, Prometheus's peak) of the points so far (this run's and
    --earlier rows'; Prometheus's peak NaN where a row lacks it). Prometheus and the rest are
    predicted apart: least squares on nodes (2+ points), or one point scaled, or the priors
    (none); with a GOMEMLIMIT, Prometheus's part is at most the limit x GOMEMLIMIT_OVERSHOOT. The
    sum x MEMORY_GROWTH for the head's growth past the window, + the reserve, is what is wanted."""
    prom = [(n, p if p == p else t * PROMETHEUS_SHARE) for n, t, p in sorted(measured)]
    rest = [(n, t - p) for (n, t, _), (_, p) in zip(sorted(measured), prom, strict=True)]
    predicted_prom = extrapolate(prom, nodes, PROMETHEUS_PER_NODE * nodes, 0.0)
    predicted_rest = extrapolate(rest, nodes, REST_BASE + REST_PER_NODE * nodes, REST_BASE)
    if limit:
        predicted_prom = min(predicted_prom, limit * GOMEMLIMIT_OVERSHOOT)
    predicted = predicted_prom + predicted_rest
    return int(predicted), int(predicted * MEMORY_GROWTH) + reserve


def extrapolate(points: list[tuple[int, float]], nodes: int, prior: float, base: float) -> float:
    """Least squares on nodes (2+ points); one point: its part above ``base`` scaled with the nodes,
    never below the prior; none: the prior."""
    if len(points) >= 2:
        slope, intercept = np.polyfit(*zip(*points, strict=True), 1)
        return float(intercept + slope * nodes)
    if points:
        n0, value = points[0]
        return max(prior, base + (value - base) * nodes / n0)
    return prior


def limits(point: dict[str, Any]) -> list[str]:
    """What made this point too much for the machine: scrapes or rule groups slower than their
    interval, a consumer's cycle slower than its interval, Thanos Query timing out."""
    found = []
    for i, shard in enumerate(point["per_shard"]):
        if shard["scrape_over_interval"] > 1:
            found.append(f"shard {i}: the slowest scrape took {shard['scrape_over_interval']:.2f}x its "
                         f"interval ({shard['scrape_max_s']:.1f} s)")  # fmt: skip
        if shard["rules_over_interval"] > 1:
            found.append(f"shard {i}: a rule group took {shard['rules_over_interval']:.2f}x its interval "
                         f"(slowest {shard['rules_max_s']:.1f} s)")  # fmt: skip
    ruler = point.get("ruler") or {}
    if ruler.get("rules_over_interval", 0) > 1:
        found.append(f"Thanos Ruler: a rule group took {ruler['rules_over_interval']:.2f}x its interval")
    consumers = point.get("consumers", {})
    intervals = {"anomaly": ANOMALY_INTERVAL_S, "fleetsight-health": 5.0}
    for name, c in consumers.items():
        if c.get("wall_max_s", 0) > intervals[name]:
            found.append(f"{name}: a cycle took {c['wall_max_s']:.1f} s (interval {intervals[name]:.0f} s)")
        if c.get("errors"):
            found.append(f"{name}: {c['errors']:.0f} cycles failed reading Thanos Query (its log says why)")
        if not c.get("cycles"):
            found.append(f"{name}: no cycle completed in the window")
    timeouts = sum(v.get("timeouts", 0) for v in point["queries"].values())
    if timeouts:
        found.append(f"Thanos Query: {timeouts} dashboard queries over {QUERY_TIMEOUT_S:.0f} s")
    return found


def print_comparison(comparison: list[dict[str, Any]], nodes: int) -> None:
    print(f"\nOne replica vs 2 shards (+ Thanos Ruler for the fleet-wide rules) at {nodes} nodes:")
    for point in comparison:
        for i, shard in enumerate(point["per_shard"]):
            print(f"  shards={point['shards']} #{i}: series {shard['series']:,.0f} "
                  f"RSS {shard['rss'] / 2**30:.2f} GiB CPU {shard['cpu']:.2f} "
                  f"rules sum {shard['rules_sum_s']:.3f} s max {shard['rules_max_s']:.3f} s")  # fmt: skip
        if ruler := point.get("ruler"):
            print(f"  shards={point['shards']} Thanos Ruler: RSS {ruler['rss'] / 2**30:.2f} GiB "
                  f"CPU {ruler['cpu']:.2f} {ruler['groups']} groups, rules sum {ruler['rules_sum_s']:.3f} s "
                  f"max {ruler['rules_max_s']:.3f} s")  # fmt: skip
        print(f"  shards={point['shards']} total: {json.dumps(row(point))}")
        for name, q in point["queries"].items():
            print(f"    {name}: p50 {q['p50'] * 1000:.0f} ms p99 {q['p99'] * 1000:.0f} ms")
        for name, c in point.get("consumers", {}).items():
            print(f"    {name}: {c['cycles']:.0f} cycles, per cycle CPU {c['cpu_s']:.3f} s "
                  f"wall {c['wall_s']:.3f} s query {c['query_s']:.3f} s "
                  f"({c['queries']:.0f} queries)")  # fmt: skip


def go_bytes(limit: str) -> int:
    """A GOMEMLIMIT value in bytes (Go's suffixes B, KiB, MiB, GiB, TiB); 0 when unset."""
    if not limit:
        return 0
    units = {"TiB": 2**40, "GiB": 2**30, "MiB": 2**20, "KiB": 2**10, "B": 1}
    for unit, factor in units.items():
        if limit.endswith(unit) and limit[: -len(unit)].replace(".", "", 1).isdigit():
            return int(float(limit[: -len(unit)]) * factor)
    if limit.isdigit():
        return int(limit)
    raise SystemExit(f"--gomemlimit {limit!r}: expected e.g. 14GiB or 600MiB (Go's GOMEMLIMIT syntax)")


def read_earlier(path: Path) -> list[dict[str, float]]:
    """Rows of an earlier run: its figures file (docs/images/fleet_scale.json) or the JSON lines it
    printed, one row per point."""
    text = path.read_text()
    try:
        figures = json.loads(text)
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return figures["rows"] if isinstance(figures, dict) else [figures]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", default="128,256,512,1024,2048")
    parser.add_argument("--window", type=float, default=60.0, help="measured seconds per point")
    parser.add_argument("--warmup", type=float, default=20.0)
    parser.add_argument("--shards-at", type=int, default=512, help="N for one replica vs 2 shards (0: skip)")
    parser.add_argument("--capture", type=Path, help="a saved capture (else the twin is run first)")
    parser.add_argument(
        "--earlier",
        type=Path,
        help="an earlier run's rows, fitted too: its figures JSON or the JSON lines it printed",
    )
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images" / "fleet_scale.png")
    parser.add_argument(
        "--no-consumers", action="store_true", help="leave out the anomaly and health services"
    )
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="go on to the next point when one overran (scrape, rule group, consumer cycle, query "
        "timeout); the limits are still printed. Memory always stops the curve",
    )
    parser.add_argument(
        "--no-snapshot",
        action="store_true",
        help="skip the head snapshot that measures block bytes (its memory peak is the bench's, not "
        "production's)",
    )
    parser.add_argument(
        "--memory-reserve", type=float, default=1.5, help="GiB left to the rest of the machine (default 1.5)"
    )
    parser.add_argument(
        "--prometheus-flag", action="append", default=[], metavar="FLAG",
        help="an extra Prometheus flag, repeatable, e.g. "
        "--prometheus-flag=--storage.tsdb.head-chunks-write-queue-size=10000",
    )  # fmt: skip
    parser.add_argument(
        "--gomemlimit", default="", help="GOMEMLIMIT for Prometheus, e.g. 14GiB (default: none)"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if not THANOS.exists():
        sys.exit(f"{THANOS} is missing: run `make setup` (fleetsight setup builds Thanos)")
    options = Options(not args.no_consumers, not args.no_snapshot, args.prometheus_flag, args.gomemlimit)
    work = Path(tempfile.mkdtemp(prefix="fleet-scale-capture-"))
    capture_dir = args.capture or work / "capture"
    if args.capture is None:
        capture(work / "run").save(capture_dir)
    Capture.load(capture_dir)
    points: list[dict[str, Any]] = []
    reserve = int(args.memory_reserve * 2**30)
    stopped = "every point asked for was measured"
    earlier = read_earlier(args.earlier) if args.earlier else []
    peaks = [
        (r["nodes"], r["bench peak RSS GiB"] * 2**30, r.get("Prometheus peak RSS GiB", float("nan")) * 2**30)
        for r in earlier
        if r.get("bench peak RSS GiB")
    ]
    for nodes in (int(n) for n in args.nodes.split(",")):
        peaks += [(p["nodes"], p["bench_peak_rss"], total(p, "peak_rss")) for p in points[-1:]]
        predicted, need = memory_wanted(peaks, nodes, reserve, go_bytes(args.gomemlimit))
        print(f"{nodes} nodes: predicted peak RSS of the bench {predicted / 2**30:.1f} GiB, "
              f"wanted {need / 2**30:.1f} GiB, available {mem_available() / 2**30:.1f} GiB",
              flush=True)  # fmt: skip
        if mem_available() < need:
            stopped = (f"STOPPED before {nodes} nodes: MEMORY ({need / 2**30:.1f} GiB wanted, "
                       f"{mem_available() / 2**30:.1f} GiB available)")  # fmt: skip
            break
        point = run_point(capture_dir, nodes, 1, args.window, args.warmup, options)
        point["predicted_peak_rss"] = predicted
        points.append(point)
        print(json.dumps(row(point)), flush=True)
        print(f"  measured peak RSS of the bench {point['bench_peak_rss'] / 2**30:.2f} GiB "
              f"(predicted {predicted / 2**30:.2f})", flush=True)  # fmt: skip
        with open(args.out.with_suffix(".points.jsonl"), "a") as handle:  # kept if a later point fails
            handle.write(json.dumps(point) + "\n")
        if reasons := limits(point):
            point["limits"] = reasons
            print(f"LIMIT at {nodes} nodes: " + "; ".join(reasons), flush=True)
            if not args.keep_going:
                stopped = f"STOPPED after {nodes} nodes: " + "; ".join(reasons)
                break
    print(f"\n{stopped}", flush=True)
    for point in points:
        if point.get("limits"):
            print(f"  limits hit at {point['nodes']} nodes: " + "; ".join(point["limits"]))
    rows = sorted(earlier + [row(p) for p in points], key=lambda r: r["nodes"])
    print(f"\nOne Prometheus replica (an HA pair costs twice this), window {args.window:.0f} s, "
          f"load average {load_average():.1f}:")  # fmt: skip
    print_table(rows)
    fits = fit(rows) if len(rows) >= 2 else {}
    print("\nLeast squares (y = intercept + slope x):")
    for key, f in fits.items():
        print(f"  {key:20s} per 1,000 series {f['per_1k_series']:.4g}"
              f"   per 1,000 nodes {f['per_1k_nodes']:.4g}"
              f"   intercept {f['intercept']:.4g}")  # fmt: skip
    comparison = []
    if args.shards_at:
        single = next((p for p in points if p["nodes"] == args.shards_at), None)
        peaks += [(p["nodes"], p["bench_peak_rss"], total(p, "peak_rss")) for p in points[-1:]]
        _, need = memory_wanted(sorted(set(peaks)), args.shards_at, reserve, go_bytes(args.gomemlimit))
        if mem_available() < need:
            print(f"\nNo comparison at {args.shards_at} nodes: MEMORY ({need / 2**30:.1f} GiB wanted, "
                  f"{mem_available() / 2**30:.1f} GiB available)")  # fmt: skip
        else:
            if single is None:
                single = run_point(capture_dir, args.shards_at, 1, args.window, args.warmup, options)
            sharded = run_point(capture_dir, args.shards_at, 2, args.window, args.warmup, options)
            comparison = [single, sharded]
            print_comparison(comparison, args.shards_at)
    if len(rows) >= 2:
        plot(rows, fits, args.out)
        print(f"\nplot: {args.out}")
    results = {"rows": rows, "fits": fits, "points": points, "comparison": comparison, "stopped": stopped}
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    print(f"figures: {args.out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
