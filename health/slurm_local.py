"""A real single-host Slurm on loopback, for development and tests: munged with its own key and socket,
slurmctld, one slurmd per declared node (``slurmd -N <name>``: every node is NodeAddr=127.0.0.1 with a free
port of its own), and slurmrestd on a UNIX socket (rest_auth/local; it refuses to run as root, so it runs as
``nobody``). Everything lives in one folder; nothing touches /etc, /run or the system's services.

What it took (Debian 12, Slurm 22.05): see docs/health.md, "A real Slurm on one host".
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from fleetsight.procs import free_loopback_port, kill_group, terminate_group

BINARIES = ("munged", "slurmctld", "slurmd", "slurmrestd", "scontrol", "sinfo")


def missing() -> str | None:
    absent = [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    return f"not installed: {', '.join(absent)} (run `fleetsight setup`)" if absent else None


class LocalSlurm:
    """Start with :meth:`start`, stop with :meth:`stop`; ``env`` is what scontrol/sinfo need."""

    def __init__(
        self,
        folder: Path,
        nodes: Iterable[str],
        ctld_port: int,
        cluster: str = "fleetsight",
        prolog: Path | None = None,
    ) -> None:
        self.prolog = prolog  # slurm.conf Prolog= (run at allocation: PrologFlags=Alloc)
        self.folder = folder.resolve()
        self.nodes = list(nodes)
        self.ctld_port = ctld_port
        self.cluster = cluster
        self.processes: list[subprocess.Popen[bytes]] = []
        self.named: dict[str, subprocess.Popen[bytes]] = {}
        self.conf = self.folder / "slurm.conf"
        self.munge_socket = self.folder / "munge" / "munge.sock"
        self.rest_socket = self.folder / "rest" / "slurmrestd.sock"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # ------------------------------------------------------------------------------ configuration
    def write_config(self) -> None:
        closed = [p for p in self.folder.parents if p != Path("/") and not p.stat().st_mode & 0o001]
        if closed:  # slurmrestd runs as nobody and must read slurm.conf
            raise RuntimeError(
                f"local Slurm: {closed[0]} is not traversable by other users; use a folder under /tmp"
            )
        for sub in ("munge", "state", "log", "rest", *(f"spool/{n}" for n in self.nodes)):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        self.folder.chmod(0o755)
        (self.folder / "munge").chmod(0o711)  # clients (slurmrestd as nobody) must reach the socket
        key = self.folder / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o600)
        shutil.chown(self.folder / "rest", user="nobody")
        host = socket.gethostname().split(".")[0]
        f = self.folder
        lines = [
            f"ClusterName={self.cluster}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "CredType=cred/munge",
            f"StateSaveLocation={f}/state",
            f"SlurmdSpoolDir={f}/spool/%n",
            f"SlurmctldPidFile={f}/slurmctld.pid",
            f"SlurmdPidFile={f}/spool/slurmd-%n.pid",
            f"SlurmctldLogFile={f}/log/slurmctld.log",
            f"SlurmdLogFile={f}/log/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SchedulerType=sched/builtin",
            "ReturnToService=2",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SlurmdTimeout=60",
        ]
        if self.prolog is not None:
            lines += [f"Prolog={self.prolog}", "PrologFlags=Alloc"]
        for node in self.nodes:  # each slurmd needs a port of its own: free ones, chosen now
            lines.append(
                f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={free_loopback_port()} CPUs=1"
            )
        lines.append("PartitionName=batch Nodes=ALL Default=YES State=UP MaxTime=INFINITE")
        self.conf.write_text("\n".join(lines) + "\n")

    # ------------------------------------------------------------------------------ processes
    def _spawn(self, name: str, command: list[str]) -> None:
        log = (self.folder / "log" / f"{name}.out").open("ab")
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        self.processes.append(process)
        self.named[name] = process

    def hang(self, node: str) -> None:
        """Freeze a node's slurmd (SIGSTOP), as a hung host's: slurmctld marks it NOT_RESPONDING at its
        next ping and DOWN after SlurmdTimeout."""
        os.killpg(self.named[f"slurmd-{node}"].pid, signal.SIGSTOP)

    def unhang(self, node: str) -> None:
        """Thaw it. (Slurm 22.05 does not ping a DOWN node: it stays DOWN until its slurmd registers.)"""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.named[f"slurmd-{node}"].pid, signal.SIGCONT)

    def reboot(self, node: str) -> None:
        """Kill a node's slurmd, frozen or not, and start a new one: it registers with slurmctld as after
        a host's reboot (with ReturnToService=2, a DOWN node returns to service then)."""
        old = self.named[f"slurmd-{node}"]
        kill_group(old.pid)
        old.wait(timeout=10)
        self.processes.remove(old)
        self._spawn(f"slurmd-{node}", self._slurmd(node))

    def _slurmd(self, node: str) -> list[str]:
        return ["slurmd", "-D", "-N", node, "-f", str(self.conf)]

    def start(self, timeout: float = 30.0) -> None:
        self.write_config()
        m = self.folder / "munge"
        self._spawn(
            "munged",
            [
                "munged",
                "-F",
                "-f",
                f"--key-file={m}/munge.key",
                f"--socket={self.munge_socket}",
                f"--log-file={m}/munged.log",
                f"--pid-file={m}/munged.pid",
                f"--seed-file={m}/seed",
            ],
        )
        self._wait(lambda: self.munge_socket.exists(), timeout, "munged's socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: self._run("scontrol", "ping").returncode == 0, timeout, "slurmctld to answer")
        for node in self.nodes:
            self._spawn(f"slurmd-{node}", self._slurmd(node))
        self._wait(self._all_nodes_up, timeout, "every slurmd to register")
        self.rest_socket.unlink(missing_ok=True)
        self._spawn(
            "slurmrestd",
            [
                "runuser",
                "-u",
                "nobody",
                "--",
                "env",
                f"SLURM_CONF={self.conf}",
                "slurmrestd",
                "-a",
                "rest_auth/local",
                "-s",
                "openapi/v0.0.38",
                f"unix:{self.rest_socket}",
            ],
        )
        self._wait(lambda: self.rest_socket.exists(), timeout, "slurmrestd's socket")

    def _all_nodes_up(self) -> bool:
        out = self._run("sinfo", "-N", "-h", "-o", "%N %T").stdout.split()
        states = dict(zip(out[0::2], out[1::2], strict=False))
        return all(
            states.get(n, "").rstrip("*") in ("idle", "allocated", "mixed") and not states[n].endswith("*")
            for n in self.nodes
        )

    def _run(self, *command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(command, capture_output=True, text=True, env=self.env, timeout=30, check=False)

    def _wait(self, predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while not predicate():
            dead = [p.args for p in self.processes if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                self.stop()
                logs = "\n".join(
                    f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                    for p in (self.folder / "log").glob("*.out")
                )
                raise RuntimeError(f"local Slurm: gave up waiting for {what} (exited: {dead})\n{logs}")
            time.sleep(0.2)

    def stop(self) -> None:
        for node in self.nodes:  # a frozen slurmd would ignore SIGTERM
            if f"slurmd-{node}" in self.named:
                self.unhang(node)
        for process in reversed(self.processes):
            if process.poll() is None:
                terminate_group(process.pid)
        for process in self.processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                kill_group(process.pid)
                process.wait(timeout=5)
        self.processes.clear()
        self.named.clear()
