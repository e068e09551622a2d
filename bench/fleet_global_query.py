"""What the global view costs as clusters are added, and what one cut-off cluster costs it (issue 45).

For K = 2, 4, 8 clusters (--clusters): K Prometheus servers, each over its own TSDB blocks of an hour of
dcgm-exporter-shaped history (--nodes nodes x 8 GPUs, 4 GPU fields, every 15 s, cut with promtool) and
carrying its `cluster` external label, each with a Thanos sidecar; one global Thanos Query over every
sidecar, as docs/fleet.md deploys it. Then --repeat times each of the fleet page's kind of queries:

  instant   sum by (cluster) (DCGM_FI_DEV_POWER_USAGE)           at the history's end
  range     avg by (cluster) (DCGM_FI_DEV_GPU_UTIL), 1 h, 60 s step

printing per K the latency median / p90 and the CPU seconds per query of Thanos Query and of all the
stores together (/proc of each process). Then one cluster is cut off as a dead link looks: its sidecar
stopped with SIGSTOP (connections stay open, nothing answers), and the instant query is timed again,
once with the Query as shipped (`--store.response-timeout` at Thanos's default, 0: no limit) and once
with `--store.response-timeout=5s`; each attempt is bounded by --cut-timeout.

    .venv/bin/python bench/fleet_global_query.py                    # K = 2, 4, 8; 64 nodes a cluster
    .venv/bin/python bench/fleet_global_query.py --clusters 2 --nodes 16 --repeat 5   # a quick look

Loopback only; everything runs under a temporary folder (--work) removed at the end unless --keep.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fleetsight.settings import Settings  # noqa: E402
from metrics.install import THANOS_BUILD  # noqa: E402

FIELDS = ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK")
STEP_S = 15
HOUR_S = 3600
QUERIES = {
    "instant": ("/api/v1/query", {"query": "sum by (cluster) (DCGM_FI_DEV_POWER_USAGE)"}),
    "range": ("/api/v1/query_range", {"query": "avg by (cluster) (DCGM_FI_DEV_GPU_UTIL)", "step": "60"}),
}
TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def history(cluster: str, nodes: int, end: int, folder: Path) -> None:
    """An hour of dcgm-exporter-shaped samples for one cluster, as TSDB blocks (promtool)."""
    folder.mkdir(parents=True)
    text = folder / "history.om"
    with text.open("w") as out:
        for field in FIELDS:
            out.write(f"# TYPE {field} gauge\n")
            for node in range(nodes):
                for gpu in range(8):
                    labels = f'cluster="{cluster}",node="{cluster}-n{node:04d}",gpu="{gpu}",job="dcgm"'
                    base = 300 + (node * 8 + gpu) % 97
                    for at in range(end - HOUR_S, end, STEP_S):
                        out.write(f"{field}{{{labels}}} {base + (at // STEP_S) % 13} {at}\n")
        out.write("# EOF\n")
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(text), str(folder / "data")],
        check=True,
        capture_output=True,
    )
    text.unlink()


class Processes:
    def __init__(self) -> None:
        self.running: list[subprocess.Popen[bytes]] = []

    def start(self, command: list[str], log: Path) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)
        self.running.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGCONT)
                process.terminate()
        for process in self.running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=20)
            if process.poll() is None:
                process.kill()
        self.running.clear()


def wait_for(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            found = predicate()
            if found:
                return found
        time.sleep(0.5)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


@contextlib.contextmanager
def fleet(k: int, nodes: int, end: int, work: Path, response_timeout: str | None) -> Iterator[dict]:
    """K clusters' Prometheus + sidecars and one global Query; yields their URLs and processes."""
    thanos = str(THANOS_BUILD.binary(Settings()))
    procs = Processes()
    stores, sidecars = [], []
    try:
        for index in range(k):
            name = f"c{index + 1}"
            folder = work / name
            if not (folder / "data").exists():
                history(name, nodes, end, folder)
            port, grpc = free_port(), free_port()
            config = {"global": {"external_labels": {"cluster": name, "replica": "A"}}}
            (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
            stores.append(procs.start([
                "prometheus", f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=30d",
            ], folder / "prometheus.log"))  # fmt: skip
            wait_for(lambda p=port: httpx.get(f"http://127.0.0.1:{p}/-/ready").status_code == 200, 60, name)
            sidecar = procs.start([
                thanos, "sidecar", f"--tsdb.path={folder / 'data'}", f"--prometheus.url=http://127.0.0.1:{port}",
                f"--grpc-address=127.0.0.1:{grpc}", f"--http-address=127.0.0.1:{free_port()}",
            ], folder / "sidecar.log")  # fmt: skip
            stores.append(sidecar)
            sidecars.append((sidecar, grpc))
        query_port = free_port()
        extra = [f"--store.response-timeout={response_timeout}"] if response_timeout else []
        query = procs.start([
            thanos, "query", f"--http-address=127.0.0.1:{query_port}",
            f"--grpc-address=127.0.0.1:{free_port()}",
            "--query.replica-label=replica", *extra, *(f"--endpoint=127.0.0.1:{g}" for _, g in sidecars),
        ], work / f"query-{k}.log")  # fmt: skip
        url = f"http://127.0.0.1:{query_port}"

        def every_cluster() -> bool:
            body = httpx.get(f"{url}/api/v1/query", params={**QUERIES["instant"][1], "time": end - 30}).json()
            return len(body["data"]["result"]) == k

        wait_for(every_cluster, 120, f"all {k} clusters in the global Query")
        yield {"url": url, "query": query, "stores": stores, "sidecars": sidecars}
    finally:
        procs.stop_all()


def timed(url: str, name: str, end: int, timeout: float) -> float | None:
    path, params = QUERIES[name]
    params = {**params, **({"time": end - 30} if name == "instant" else {"start": end - HOUR_S, "end": end})}
    started = time.perf_counter()
    try:
        response = httpx.get(f"{url}{path}", params=params, timeout=timeout)
    except httpx.TimeoutException:
        return None
    response.raise_for_status()
    return time.perf_counter() - started


def measure(k: int, nodes: int, end: int, work: Path, repeat: int) -> dict[str, float]:
    row: dict[str, float] = {"clusters": k}
    with fleet(k, nodes, end, work, None) as stack:
        for name in QUERIES:
            timed(stack["url"], name, end, 60)  # warm
            query_cpu = cpu_seconds(stack["query"].pid)
            store_cpu = sum(cpu_seconds(p.pid) for p in stack["stores"])
            times = [timed(stack["url"], name, end, 60) or 60.0 for _ in range(repeat)]
            row[f"{name} p50 ms"] = statistics.median(times) * 1000
            row[f"{name} p90 ms"] = sorted(times)[int(0.9 * (len(times) - 1))] * 1000
            row[f"{name} query CPU ms"] = (cpu_seconds(stack["query"].pid) - query_cpu) / repeat * 1000
            row[f"{name} stores CPU ms"] = (
                (sum(cpu_seconds(p.pid) for p in stack["stores"]) - store_cpu) / repeat * 1000
            )
    return row


def cut_off(k: int, nodes: int, end: int, work: Path, cut_timeout: float) -> dict[str, str]:
    """The instant query with one cluster's sidecar stopped (SIGSTOP), default and 5 s response timeout."""
    found = {}
    for label, response_timeout in (
        ("Thanos default (no limit)", None),
        ("--store.response-timeout=5s", "5s"),
    ):
        with fleet(k, nodes, end, work, response_timeout) as stack:
            before = timed(stack["url"], "instant", end, cut_timeout)
            sidecar, _ = stack["sidecars"][-1]
            sidecar.send_signal(signal.SIGSTOP)
            try:
                after = timed(stack["url"], "instant", end, cut_timeout)
            finally:
                sidecar.send_signal(signal.SIGCONT)
            shown = f"{after * 1000:.0f} ms" if after is not None else f"no answer in {cut_timeout:.0f} s"
            found[label] = f"{(before or 0) * 1000:.0f} ms before, {shown} with one cluster cut off"
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clusters", default="2,4,8", help="cluster counts to measure (default 2,4,8)")
    parser.add_argument("--nodes", type=int, default=64, help="nodes per cluster, 8 GPUs each (default 64)")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs of each query (default 20)")
    parser.add_argument("--cut-timeout", type=float, default=60.0, help="seconds one cut-off query may take")
    parser.add_argument(
        "--work", type=Path, default=None, help="folder for the blocks and logs (default: temp)"
    )
    parser.add_argument("--keep", action="store_true", help="keep --work")
    args = parser.parse_args()
    counts = sorted({int(c) for c in args.clusters.split(",")})
    if not counts or counts[0] < 1 or args.nodes < 1 or args.repeat < 1:
        parser.error("--clusters wants positive counts (e.g. 2,4,8); --nodes and --repeat at least 1")
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            parser.error(f"{tool} is not installed: run `fleetsight setup`")
    work = args.work or Path(tempfile.mkdtemp(prefix="fleet-global-"))
    end = (int(time.time()) // 60) * 60 - 600
    rows = []
    try:
        for k in counts:
            print(f"measuring {k} clusters x {args.nodes} nodes ...", file=sys.stderr, flush=True)
            rows.append(measure(k, args.nodes, end, work, args.repeat))
        columns = list(rows[0])
        print("| " + " | ".join(columns) + " |")
        print("|" + "---|" * len(columns))
        for row in rows:
            print(
                "| " + " | ".join(f"{row[c]:.0f}" if c != "clusters" else str(row[c]) for c in columns) + " |"
            )
        print(f"\nOne cluster cut off (its sidecar SIGSTOPped), {counts[-1]} clusters:", file=sys.stdout)
        for label, text in cut_off(counts[-1], args.nodes, end, work, args.cut_timeout).items():
            print(f"- {label}: {text}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
