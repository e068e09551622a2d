"""End-to-end check of the health service on the live stack: a twin scenario of your choice played in
real time, the stack's own components around it (exporters, Prometheus with rules/, Alertmanager, the
anomaly service), and the health service reading them. For every fault in the twin's ground truth it
reports the state and reason its node reached, how long after onset, and when it came back.

The stack is started from the components' own declarations (their ``prepare`` and ``command``), only the
twin's command is replaced to play the chosen scenario; ``fleetsight up`` always plays the demo.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from fleetsight.components import Component, fleetsight_command, load_components
from fleetsight.procs import kill_group, terminate_group
from fleetsight.settings import Settings
from health.component import serve_command
from health.policy import parse_duration

AROUND_THE_TWIN = ("slack-sink", "alertmanager", "exporter-node", "exporter-fabric", "anomaly", "prometheus")
SEVERITY_ORDER = ("healthy", "degraded", "unhealthy", "draining", "drained", "repair")


@dataclass
class Started:
    name: str
    process: subprocess.Popen[bytes] | None
    log: Path
    problem: str = ""


@dataclass
class Timeline:
    """What the health API said about one node over the run: (wall time, state, reason signals)."""

    samples: list[tuple[float, str, list[str]]] = field(default_factory=list)


class TwinStack:
    def __init__(
        self,
        folder: Path,
        scenario: Path,
        port_base: int,
        policy: Path,
        speed: str = "realtime",
        around: tuple[str, ...] = AROUND_THE_TWIN,
    ) -> None:
        self.around = around
        self.folder = folder.resolve()
        self.scenario = scenario.resolve()
        self.policy = policy.resolve()
        self.speed = speed
        self.settings = Settings(run_dir=self.folder / "run", port_base=port_base)
        self.env = {
            **os.environ,
            "FLEETSIGHT_RUN_DIR": str(self.settings.run_dir),
            "FLEETSIGHT_PORT_BASE": str(port_base),
        }
        self.truth = self.folder / "truth.jsonl"
        self.started: list[Started] = []

    # ------------------------------------------------------------------------------ processes
    def _spawn(self, name: str, command: list[str], env: dict[str, str] | None = None) -> Started:
        log = self.settings.log_file(name)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as handle:
            process = subprocess.Popen(
                command,
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.settings.repo_root,
                env={**self.env, **(env or {})},
                start_new_session=True,
            )
        started = Started(name, process, log)
        self.started.append(started)
        return started

    def _wait_ready(self, started: Started, ready, timeout: float) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while not ready(self.settings):
            if started.process is not None and started.process.poll() is not None:
                started.problem = f"exited {started.process.returncode}: {tail(started.log)}"
                return
            if time.monotonic() > deadline:
                started.problem = f"not ready after {timeout:.0f}s: {tail(started.log)}"
                return
            time.sleep(0.5)

    def start(self) -> None:
        components = load_components()
        names = [n for n in self.around if n in components]
        self.settings.run_dir.mkdir(parents=True, exist_ok=True)
        # Prometheus scrapes only what this stack runs (metrics/local.py reads the supervisor's state file).
        listed = [{"name": n} for n in ("twin", *names, "health")]
        (self.settings.run_dir / "state.json").write_text(json.dumps({"components": listed}))
        twin = self._spawn(
            "twin",
            fleetsight_command(
                "twin",
                "run",
                "--scenario",
                str(self.scenario),
                "--out",
                str(self.settings.data_dir("twin")),
                "--truth",
                str(self.truth),
                "--serve",
                "--speed",
                self.speed,
                "--listen",
                f"127.0.0.1:{self.settings.port('twin')}",
            ),
        )
        self._wait_ready(twin, components["twin"].ready, 120)
        if twin.problem:
            raise RuntimeError(f"the twin did not start: {twin.problem}")
        for name in names:
            if name == "prometheus":
                self._start_health()
            self._start_component(components[name])

    def _start_component(self, component: Component) -> None:
        why = component.missing(self.settings)
        if why:
            self.started.append(Started(component.name, None, Path("/dev/null"), why))
            return
        try:
            component.prepare(self.settings)
        except Exception as exc:  # another component's bug: report it, run the rest
            self.started.append(Started(component.name, None, Path("/dev/null"), f"prepare failed: {exc}"))
            return
        started = self._spawn(component.name, component.command(self.settings), component.env(self.settings))
        self._wait_ready(started, component.ready, component.ready_timeout_s)

    def _start_health(self) -> None:
        s = self.settings
        command = serve_command(
            f"127.0.0.1:{s.port('health')}",
            s.data_dir("health"),
            policy=self.policy,
            cluster="twin",
            alertmanagers=[s.url("alertmanager")],
            prometheus=s.url("prometheus"),
            scheduler=s.url("twin", "/slurm/v0.0.40"),
        )
        started = self._spawn("health", command)
        self._wait_ready(started, load_components()["health"].ready, 30)
        if started.problem:
            raise RuntimeError(f"the health service did not start: {started.problem}")

    def stop(self) -> None:
        for started in reversed(self.started):
            if started.process is not None and started.process.poll() is None:
                terminate_group(started.process.pid)
        for started in self.started:
            if started.process is None:
                continue
            try:
                started.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                kill_group(started.process.pid)
                started.process.wait(timeout=5)

    def problems(self) -> dict[str, str]:
        return {s.name: s.problem for s in self.started if s.problem}

    # ------------------------------------------------------------------------------ observation
    def observe(self, until: float, interval: float = 2.0) -> tuple[dict[str, Timeline], int]:
        """Sample the health API until ``until``; also the most HealthCircuitBreakerOpen alerts seen
        active at once in the Alertmanager."""
        timelines: dict[str, Timeline] = {}
        url = self.settings.url("health", "/v1/nodes")
        alerts_url = self.settings.url("alertmanager", "/api/v2/alerts")
        most_breaker_alerts = 0
        with httpx.Client(timeout=5) as client:
            while time.time() < until:
                try:
                    body = client.get(url).json()
                    alerts = client.get(
                        alerts_url, params={"filter": 'alertname="HealthCircuitBreakerOpen"'}
                    ).json()
                except (httpx.HTTPError, ValueError):
                    body, alerts = {"nodes": []}, []
                active = [a for a in alerts if a.get("status", {}).get("state") == "active"]
                most_breaker_alerts = max(most_breaker_alerts, len(active))
                now = time.time()
                for item in body["nodes"]:
                    signals = [r["signal"] for r in item["reasons"] if "last_seen" not in r]
                    timelines.setdefault(item["node"], Timeline()).samples.append(
                        (now, item["state"], signals)
                    )
                time.sleep(interval)
        return timelines, most_breaker_alerts

    def faults(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.truth.read_text().splitlines() if line.strip()]


def tail(path: Path, lines: int = 8) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def summarize(fault: dict[str, Any], timeline: Timeline | None) -> dict[str, Any]:
    """State reached (the most severe), its reasons, seconds from onset to the first change and to the
    most severe state, and seconds from the fault's end back to healthy."""
    node = fault.get("target", {}).get("node")
    row: dict[str, Any] = {
        "kind": fault["kind"],
        "node": node or "-",
        "state": "healthy",
        "reasons": [],
        "first_change_s": None,
        "worst_s": None,
        "back_healthy_s": None,
    }
    if timeline is None:
        return row
    onset, end = fault["onset_unix"], fault["end_unix"]
    after = [(t, s, r) for t, s, r in timeline.samples if t >= onset]
    changed = [(t, s, r) for t, s, r in after if s != "healthy"]
    if not changed:
        return row
    worst = max(changed, key=lambda x: SEVERITY_ORDER.index(x[1]))
    row.update(
        state=worst[1],
        reasons=worst[2],
        first_change_s=round(changed[0][0] - onset),
        worst_s=round(worst[0] - onset),
    )
    healthy_again = [t for t, s, _ in after if t >= end and s == "healthy"]
    if healthy_again:
        row["back_healthy_s"] = round(healthy_again[0] - end)
    return row


def bystanders(faults: list[dict[str, Any]], timelines: dict[str, Timeline]) -> dict[str, list[str]]:
    """Nodes with no fault of their own that left healthy: the signals that moved them."""
    faulty = {f.get("target", {}).get("node") for f in faults}
    moved: dict[str, list[str]] = {}
    for node, timeline in timelines.items():
        if node in faulty:
            continue
        states = {s for _, s, _ in timeline.samples if s != "healthy"}
        if states:
            signals = sorted({sig for _, s, r in timeline.samples if s != "healthy" for sig in r})
            moved[node] = [*sorted(states), *signals]
    return moved


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| fault kind | node | state reached | reasons | first change after onset | most severe after onset "
        "| healthy again after the fault ended |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:

        def secs(v: int | None) -> str:
            return "-" if v is None else f"{v} s"

        lines.append(
            f"| {r['kind']} | {r['node']} | {r['state']} | {', '.join(r['reasons']) or '-'} | "
            f"{secs(r['first_change_s'])} | {secs(r['worst_s'])} | {secs(r['back_healthy_s'])} |"
        )
    return "\n".join(lines)


def run_check(scenario: Path, folder: Path, port_base: int, policy: Path, settle_s: float) -> dict[str, Any]:
    """Play the scenario to its end plus settle_s, and summarise every fault."""
    stack = TwinStack(folder, scenario, port_base, policy)
    try:
        started = time.time()
        stack.start()
        # the twin plays from "now" when paced; its truth file fills as faults happen
        raw = yaml.safe_load(scenario.read_text())
        until = started + parse_duration(raw["duration"], "duration") + settle_s
        timelines, breaker_alerts = stack.observe(until=until)
        faults = stack.faults()
        rows = [summarize(f, timelines.get(f.get("target", {}).get("node", ""))) for f in faults]
        drain_list = httpx.get(stack.settings.url("health", "/v1/drain-list"), timeout=5).json()
        return {
            "rows": rows,
            "bystanders": bystanders(faults, timelines),
            "problems": stack.problems(),
            "held_by_breaker": breaker_history(timelines),
            "breaker_alerts_at_once": breaker_alerts,
            "final_drain_list": drain_list,
        }
    finally:
        stack.stop()


def breaker_history(timelines: dict[str, Timeline]) -> list[str]:
    return sorted(n for n, t in timelines.items() if any("circuit_breaker" in r for _, _, r in t.samples))
