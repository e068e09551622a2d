# ruff: noqa: E501  (real log lines are long)
"""What the log benchmarks share: a stack of the log path's components held by the script (so that it
can stop and start each), in its own run folder and port range."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import time
from pathlib import Path

from fleetsight.components import load_components
from fleetsight.registry import port_offsets
from fleetsight.settings import Settings


def free_base() -> int:
    """A port base whose declared ports are all free on loopback."""
    for _ in range(200):
        base = random.randrange(20000, 58000, 100)
        if all(port_free(base + offset) for offset in port_offsets().values()):
            return base
    raise RuntimeError("no free port range")


def session_cpu_seconds(session: int) -> float:
    """User + system CPU seconds of the live processes in one session (a component and its children)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        # after the command: state ppid pgrp session ... utime(12) stime(13) cutime cstime
        if int(fields[3]) == session:
            total += sum(int(value) for value in fields[11:15])
    return total / ticks


# JVM threads by their native names (/proc/<pid>/task/<tid>/comm, cut at 15 characters): the JIT
# compilers, and the garbage collector's (G1's workers, concurrent markers, refiners, service thread).
JVM_THREAD_KINDS = {
    "jit": ("C1 CompilerThre", "C2 CompilerThre"),
    "gc": ("GC Thread#", "G1 "),
}


def jvm_thread_cpu_seconds(session: int) -> dict[str, float]:
    """CPU seconds of the JIT compiler and GC threads of the JVMs in one session, by kind. A fresh JVM
    keeps compiling for minutes under a new load, a cost a long-running server no longer pays. Threads
    that the JVM retired meanwhile are not counted (it adds and removes compiler threads as needed)."""
    ticks = os.sysconf("SC_CLK_TCK")
    totals = dict.fromkeys(JVM_THREAD_KINDS, 0)
    for stat in Path("/proc").glob("[0-9]*/task/[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name, fields = text[text.index("(") + 1 : text.rindex(")")], text.rsplit(")", 1)[1].split()
        if int(fields[3]) != session:
            continue
        for kind, prefixes in JVM_THREAD_KINDS.items():
            if name.startswith(prefixes):
                totals[kind] += int(fields[11]) + int(fields[12])
    return {kind: ticks_ / ticks for kind, ticks_ in totals.items()}


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Stack:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.components = load_components()
        self.processes: dict[str, subprocess.Popen] = {}

    def start(self, name: str, prepare: bool = True) -> None:
        component = self.components[name]
        if prepare:
            component.prepare(self.settings)
        log = self.settings.log_file(name)
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "FLEETSIGHT_RUN_DIR": str(self.settings.run_dir),
            "FLEETSIGHT_PORT_BASE": str(self.settings.port_base),
            **component.env(self.settings),
        }
        with open(log, "ab") as out:
            self.processes[name] = subprocess.Popen(
                component.command(self.settings), stdout=out, stderr=subprocess.STDOUT, env=env,
                cwd=self.settings.repo_root, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + component.ready_timeout_s + 60
        while not component.ready(self.settings):
            if self.processes[name].poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{name} did not start; see {log}")
            time.sleep(0.5)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system) used so far by each component's processes (its whole session)."""
        return {name: session_cpu_seconds(process.pid) for name, process in self.processes.items()}

    def jvm_thread_seconds(self) -> dict[str, dict[str, float]]:
        """The JIT compilers' and the GC's shares of cpu_seconds, per component (0 for no JVM)."""
        return {name: jvm_thread_cpu_seconds(process.pid) for name, process in self.processes.items()}

    def stop(self, name: str) -> None:
        process = self.processes.pop(name)
        try:
            os.killpg(process.pid, 15)
            process.wait(timeout=40)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(process.pid, 9)
            process.wait(timeout=10)

    def stop_all(self) -> None:
        for process in reversed(list(self.processes.values())):
            try:
                os.killpg(process.pid, 15)
                process.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(process.pid, 9)


# A realistic mix of node lines per topic (weights: training progress dominates, as on a real cluster).
LINES = [
    ("fleetsight-logs-application", "[{ts}] iteration {n:>8d}/ 2000000 | consumed samples: {n:>12d} | elapsed time per "
     "iteration (ms): 2512.4 | learning rate: 2.994E-04 | global batch size:   256 | lm loss: 2.345678E+00 | loss scale: "
     "1.0 | grad norm: 0.812 | number of skipped iterations:   0 | number of nan iterations:   0 |", 80),
    ("fleetsight-logs-application", "[{ts}] [rank{r}]:[E ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective "
     "operation timeout: WorkNCCL(SeqNum={n}, OpType=ALLREDUCE, NumelIn=67108864, NumelOut=67108864, Timeout(ms)=600000) "
     "ran for 600061 milliseconds before timing out.", 5),
    ("fleetsight-logs-application", "[{ts}] RuntimeError: CUDA error: an illegal memory access was encountered", 3),
    ("fleetsight-logs-kernel", "{iso} n{r:04d} kernel: [1229615.939836] NVRM: Xid (PCI:0000:3a:00): 79, pid={n}, "
     "name=python3, GPU has fallen off the bus.", 4),
    ("fleetsight-logs-kernel", "{iso} n{r:04d} kernel: [679631.862334] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 24007, "
     "Fatal, Link 28 sourcetrack TCEN0 crumbstore ECC DBE Error", 2),
    ("fleetsight-logs-kernel", "{iso} n{r:04d} kernel: [2922109.612490] LustreError: 11-0: lustre-OST0003-osc-ffff4d6a: "
     "operation ost_write to node 10.10.0.13@o2ib failed: rc = -107", 3),
    ("fleetsight-logs-kernel", "{iso} n{r:04d} kernel: [3134916.473307] mlx5_core 0000:3c:00.0: "
     "mlx5_port_change_event:307:(pid 0): Link down", 3),
]  # fmt: skip


def node_records(lines: int, seed: int = 1, start: int = 0) -> list[tuple[str, dict]]:
    """`lines` (topic, record) pairs of the mix, shaped as the node-side rsyslog sends them; offsets (and
    so document ids) from `start` on."""
    import datetime as dt

    rng = random.Random(seed)
    population = [entry for entry in LINES for _ in range(entry[2])]
    now = dt.datetime.now(dt.UTC)
    ts, iso = now.strftime("%Y-%m-%d %H:%M:%S"), now.isoformat()
    records = []
    for n in range(start, start + lines):
        topic, template, _ = rng.choice(population)
        node = f"n{n % 512:04d}"
        line = template.format(ts=ts, iso=iso, n=n, r=n % 512)
        kernel = topic.endswith("kernel")
        path = "/var/log/kern.log" if kernel else f"/var/log/jobs/9000/rank-{n % 4096}.log"
        records.append(
            (topic, {"@timestamp": iso, "message": line, "host": {"name": node},
                     "log": {"file": {"path": path}, "offset": n}, "event": {"id": f"{node}:{path}:{n}"},
                     "fleetsight": {"cluster": "bench"}})
        )  # fmt: skip
    return records
