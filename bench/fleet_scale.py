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

then least squares per column against series and nodes (slope per 1,000), printed, with a plot in
docs/images/fleet_scale.png and the figures in docs/images/fleet_scale.json.

A point is skipped, and the run stops growing, when this machine cannot hold it: memory available
under MEMORY_PER_SERIES x the expected series x 2, or scrapes slower than their interval.

Usage: .venv/bin/python bench/fleet_scale.py [--nodes 128,256,512,1024,2048] [--window 90]
       [--shards-at 512] [--capture DIR]
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
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evaluation.scale_capture import capture, free_port  # noqa: E402
from metrics.scale.capture import Capture  # noqa: E402
from metrics.sharding.generate import PRODUCTION_CONFIG, shard_config  # noqa: E402

THANOS = REPO / ".cache" / "bin" / "thanos"
JOBS = ("dcgm", "fleetsight-node", "fleetsight-fabric", "node")
SERIES_PER_NODE = 1850  # the series budget's measured sum, for the memory check before a point
MEMORY_PER_SERIES = 6_000  # bytes, before a point measured it; then the last point's RSS per series
MEMORY_RESERVE = 3 * 2**30  # left to the other work on this shared machine
QUERY_REPEATS = 5
QUERY_TIMEOUT_S = 60.0
RANGE = "5m"  # the KPI queries' $__range: the window this bench has history for
DASHBOARD_QUERIES = {
    "fleet-health: exporters up": "sum by (job) (up)",
    "fleet-health: firing alerts": 'count by (severity) (ALERTS{alertstate="firing"})',
    "fleet-health: power brake GPUs": "count by (node) "
    "(floor(DCGM_FI_DEV_CLOCK_THROTTLE_REASONS / 128) % 2 == 1)",
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


# ------------------------------------------------------------------------------------ processes
def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


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
    """Load source, K Prometheus replicas (one per shard), their sidecars and Thanos Query."""

    def __init__(self, work: Path, capture_dir: Path, nodes: int, shards: int) -> None:
        self.work, self.nodes, self.shards = work, nodes, shards
        self.procs: list[subprocess.Popen] = []
        self.prom_ports: list[int] = []
        self.data: list[Path] = []
        self.sd = work / "sd"
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
                 "--storage.tsdb.max-block-duration=2h", "--web.enable-admin-api"],
                f"prometheus-{index}")  # fmt: skip
            self.wait(lambda p=prom: self.ok(f"http://127.0.0.1:{p}/-/ready"), 120, "Prometheus")
            self.start([str(THANOS), "sidecar", f"--tsdb.path={data}", f"--prometheus.url=http://127.0.0.1:{prom}",
                        f"--grpc-address=127.0.0.1:{side_grpc}", f"--http-address=127.0.0.1:{side_http}"],
                       f"sidecar-{index}")  # fmt: skip
            self.prom_ports.append(prom)
            self.data.append(data)
            grpc.append(side_grpc)
        self.query_port = free_port()
        self.query = self.start(
            [str(THANOS), "query", f"--http-address=127.0.0.1:{self.query_port}",
             f"--grpc-address=127.0.0.1:{free_port()}",
             "--query.replica-label=replica", *(f"--endpoint=127.0.0.1:{p}" for p in grpc)],
            "query")  # fmt: skip

    def config(self, index: int, own_port: int) -> dict[str, Any]:
        production = yaml.safe_load(PRODUCTION_CONFIG.read_text())
        production["global"]["external_labels"]["replica"] = "A"
        rules = [str(REPO / "rules" / "*.yml")]
        config = shard_config(production, self.shards, index, rules)
        config.pop("alerting", None)  # no Alertmanager in the bench: alerts are evaluated, not sent
        jobs = []
        for job in config["scrape_configs"]:
            if job["job_name"] == "prometheus":
                job["static_configs"] = [{"targets": [f"127.0.0.1:{own_port}"]}]  # itself: its own metrics
                jobs.append(job)
                continue
            if job["job_name"] not in JOBS:
                continue
            job = {k: v for k, v in job.items() if not k.endswith(("_sd_configs", "static_configs"))}
            job["file_sd_configs"] = [{"files": [str(self.sd / f"{job['job_name']}.json")]}]
            if job["job_name"] == "dcgm":  # the twin-address rewrite is for compose only
                job["relabel_configs"] = [r for r in job.get("relabel_configs", []) if "twin" not in str(r)]
            jobs.append(job)
        config["scrape_configs"] = jobs
        return config

    def start(self, command: list[str], name: str) -> subprocess.Popen:
        log = open(self.work / f"{name}.log", "w")  # noqa: SIM115 (closed with the process)
        process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
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
    up = "count(up == 1)"
    stack.wait(lambda: sum(stack.query_prom(i, up) or 0 for i in range(stack.shards)) >= targets,
               300, f"{targets} targets up")  # fmt: skip
    time.sleep(warmup)
    pids = stack.prometheus_pids()
    cpu0 = [cpu_seconds(p) for p in pids]
    lg0, q0 = cpu_seconds(stack.loadgen.pid), cpu_seconds(stack.query.pid)
    wal0 = [du(d / "wal") for d in stack.data]
    t0 = time.monotonic()
    time.sleep(window)
    elapsed = time.monotonic() - t0
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
            "scrape_max_s": stack.query_prom(i, "max(scrape_duration_seconds)"),
        }
        for i in range(stack.shards)
    ]
    for i, shard in enumerate(per_shard):
        shard.update(block_cost(stack, i, shard["samples_per_s"]))
    latencies = query_latencies(stack.query_port)
    return {
        "nodes": stack.nodes,
        "shards": stack.shards,
        "per_shard": per_shard,
        "loadgen_cpu": (cpu_seconds(stack.loadgen.pid) - lg0) / elapsed,
        "query_cpu": (cpu_seconds(stack.query.pid) - q0) / elapsed,
        "queries": latencies,
        "load_average": load_average(),
    }


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
        "loadgen CPU": point["loadgen_cpu"],
        "load avg": point["load_average"],
    }


def print_table(rows: list[dict[str, float]]) -> None:
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(f"{r[k]:,.0f}" if abs(r[k]) >= 100 else f"{r[k]:.3g}" for k in keys) + " |")


def fit(rows: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Least squares y = a + b x per column, x = series (b per 1,000 series) and x = nodes."""
    fits = {}
    series = np.array([r["series"] for r in rows])
    nodes = np.array([r["nodes"] for r in rows])
    for key in (
        "samples/s",
        "RSS GiB",
        "CPU cores",
        "WAL GiB/h",
        "block GiB/h",
        "rules sum s",
        "query p99 s",
    ):
        y = np.array([r[key] for r in rows])
        b_s, _ = np.polyfit(series, y, 1)
        b_n, a_n = np.polyfit(nodes, y, 1)
        fits[key] = {"per_1k_series": b_s * 1000, "per_1k_nodes": b_n * 1000, "intercept": a_n}
    return fits


def plot(rows: list[dict[str, float]], fits: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes = [r["nodes"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    titles = ("Prometheus RSS (GiB)", "Prometheus CPU (cores)", "block bytes per hour (GiB)")
    for ax, key, label in zip(axes, ("RSS GiB", "CPU cores", "block GiB/h"), titles, strict=True):
        ax.plot(nodes, [r[key] for r in rows], "o", label="measured")
        xs = np.linspace(0, max(2048, max(nodes)), 50)
        f = fits[key]
        ax.plot(xs, f["intercept"] + f["per_1k_nodes"] * xs / 1000, "--", label="least squares")
        ax.set_xlabel("nodes (8 GPUs each)")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(
        "One Prometheus replica, FleetSight's exporters per node (measured on a shared 2-core machine)"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def run_point(capture_dir: Path, nodes: int, shards: int, window: float, warmup: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"fleet-scale-{nodes}-") as work:
        stack = Stack(Path(work), capture_dir, nodes, shards)
        try:
            return measure(stack, window, warmup)
        finally:
            stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", default="128,256,512,1024,2048")
    parser.add_argument("--window", type=float, default=90.0, help="measured seconds per point")
    parser.add_argument("--warmup", type=float, default=30.0)
    parser.add_argument("--shards-at", type=int, default=512, help="N for one replica vs 2 shards (0: skip)")
    parser.add_argument("--capture", type=Path, help="a saved capture (else the twin is run first)")
    parser.add_argument(
        "--earlier", type=Path, help="JSON lines of rows printed by an earlier run, fitted too"
    )
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images" / "fleet_scale.png")
    args = parser.parse_args()
    if not THANOS.exists():
        sys.exit(f"{THANOS} is missing: run `make setup` (fleetsight setup builds Thanos)")
    work = Path(tempfile.mkdtemp(prefix="fleet-scale-capture-"))
    capture_dir = args.capture or work / "capture"
    if args.capture is None:
        capture(work / "run").save(capture_dir)
    Capture.load(capture_dir)
    points = []
    for nodes in (int(n) for n in args.nodes.split(",")):
        per_series = MEMORY_PER_SERIES
        if points:
            per_series = row(points[-1])["RSS GiB"] * 2**30 / row(points[-1])["series"]
        need = int(nodes * SERIES_PER_NODE * per_series * 1.5) + MEMORY_RESERVE
        if mem_available() < need:
            print(f"stop at {nodes} nodes: {mem_available() / 2**30:.1f} GiB available, "
                  f"{need / 2**30:.1f} GiB wanted (memory of this shared machine)", flush=True)  # fmt: skip
            break
        point = run_point(capture_dir, nodes, 1, args.window, args.warmup)
        points.append(point)
        print(json.dumps(row(point)), flush=True)
        with open(args.out.with_suffix(".points.jsonl"), "a") as handle:  # kept if a later point fails
            handle.write(json.dumps(point) + "\n")
        if point["per_shard"][0]["scrape_max_s"] > 4:
            print(f"stop after {nodes} nodes: a scrape took {point['per_shard'][0]['scrape_max_s']:.1f} s "
                  "(interval 5 s): the CPU of this shared machine", flush=True)  # fmt: skip
            break
    earlier = [json.loads(line) for line in args.earlier.read_text().splitlines()] if args.earlier else []
    rows = sorted(earlier + [row(p) for p in points], key=lambda r: r["nodes"])
    print(
        f"\nOne Prometheus replica (an HA pair costs twice this), window {args.window:.0f} s, shared machine:"
    )
    print_table(rows)
    fits = fit(rows) if len(rows) >= 2 else {}
    print("\nLeast squares (y = intercept + slope x):")
    for key, f in fits.items():
        print(f"  {key:12s} per 1,000 series {f['per_1k_series']:.4g}"
              f"   per 1,000 nodes {f['per_1k_nodes']:.4g}"
              f"   intercept {f['intercept']:.4g}")  # fmt: skip
    comparison = []
    if args.shards_at:
        single = next((p for p in points if p["nodes"] == args.shards_at), None)
        if single is None:
            single = run_point(capture_dir, args.shards_at, 1, args.window, args.warmup)
        sharded = run_point(capture_dir, args.shards_at, 2, args.window, args.warmup)
        comparison = [p for p in (single, sharded) if p]
        print(f"\nOne replica vs 2 shards at {args.shards_at} nodes (per shard, then total):")
        for point in comparison:
            for i, shard in enumerate(point["per_shard"]):
                print(f"  shards={point['shards']} #{i}: series {shard['series']:,.0f} "
                      f"RSS {shard['rss'] / 2**30:.2f} GiB "
                      f"CPU {shard['cpu']:.2f} rules {shard['rules_sum_s']:.3f} s")  # fmt: skip
            print(f"  shards={point['shards']} total: {row(point)}")
            for name, q in point["queries"].items():
                print(f"    {name}: p50 {q['p50'] * 1000:.0f} ms p99 {q['p99'] * 1000:.0f} ms")
    if len(rows) >= 2:
        plot(rows, fits, args.out)
        print(f"\nplot: {args.out}")
    results = {"rows": rows, "fits": fits, "points": points, "comparison": comparison}
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    print(f"figures: {args.out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
