"""End-to-end check of the health service on the live stack: a twin scenario of your choice played in
real time, the stack's own components around it (exporters, Prometheus with rules/, Alertmanager, the
anomaly service), and the health service reading them. For every fault in the twin's ground truth it
reports the state and reason its node reached, how long after onset, and when it came back.

The stack is the components' own declarations run by the stack's supervisor (fleetsight/supervisor.py),
in this process; only the twin's command (to play the chosen scenario; ``fleetsight up`` always plays
the demo) and the health service's (its policy) are this check's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from fleetsight.components import Component, fleetsight_command, load_components
from fleetsight.settings import Settings
from fleetsight.supervisor import Supervisor
from health.component import events_token_file, serve_command
from health.policy import parse_duration
from twin.scenario import load as scenario_load
from twin.truth import Fault, load_faults

AROUND_THE_TWIN = (
    "slack-sink",
    "alertmanager",
    "exporter-node",
    "exporter-fabric",
    "anomaly",
    "checks",
    "prometheus",
)
LIGHT_CHECK = "dcgm_diag_r1"  # the light check played on every node, through the twin's stand-in tools
LIGHT_EVERY_S = 60.0
SEVERITY_ORDER = ("healthy", "unobserved", "degraded", "unhealthy", "draining", "drained", "repair")
# States that take a node out of service: for a fault that is not the node's hardware (the truth's
# "hardware": false: a silent or blind source, a missing tool, Fabric Manager down, an application's
# Xids) reaching one of them is a wrong drain; reaching "degraded" is a wrong degrade ("unobserved" is
# what a blind node should show).
DRAIN_STATES = ("unhealthy", "draining", "drained", "repair")


@dataclass
class Timeline:
    """What the health API said about one node over the run: (wall time, state, reason signals), and the
    blind spots it showed (signal -> first wall time)."""

    samples: list[tuple[float, str, list[str]]] = field(default_factory=list)
    blind: dict[str, float] = field(default_factory=dict)


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
        self.port_base = port_base
        # the stack's one cluster name is the scenario's: the twin's targets, Prometheus's external label,
        # the health records and the log documents all carry it
        cluster = scenario_load(self.scenario).cluster.name
        self.settings = Settings(run_dir=self.folder / "run", port_base=port_base, cluster=cluster)
        self.truth = self.folder / "truth.jsonl"
        self.supervisor: Supervisor | None = None
        self.light_ran = float("-inf")
        self.light_errors: list[str] = []
        self.must_start: tuple[str, ...] = ("twin", "health")  # the others' failures are reported

    # ------------------------------------------------------------------------------ processes
    def components(self) -> list[Component]:
        """The registry's components around the twin, in start order, with this check's twin (its
        scenario, pace and truth file) and health service (its policy), all in this stack's run folder
        and ports."""
        registry = load_components()
        here = self.here
        twin = here(registry["twin"], command=self._twin_command, ready_timeout_s=120.0)
        health = here(registry["health"], command=self._health_command, depends_on=("alertmanager",))
        order = [twin]
        for name in (n for n in self.around if n in registry):
            if name == "prometheus":  # the health service before Prometheus, which scrapes it
                order.append(health)
            order.append(here(registry[name]))
        return order

    def here(self, component: Component, **changes: Any) -> Component:
        """A component of this stack: its run folder and ports in the environment, and ``changes``."""
        local = {
            "FLEETSIGHT_RUN_DIR": str(self.settings.run_dir),
            "FLEETSIGHT_PORT_BASE": str(self.port_base),
            "FLEETSIGHT_CLUSTER": self.settings.cluster,
        }
        env = component.env
        return dataclasses.replace(component, env=lambda s: {**env(s), **local}, **changes)

    def _twin_command(self, settings: Settings) -> list[str]:
        return fleetsight_command(
            "twin",
            "run",
            "--scenario",
            str(self.scenario),
            "--out",
            str(settings.data_dir("twin")),
            "--truth",
            str(self.truth),
            "--serve",
            "--speed",
            self.speed,
            "--listen",
            f"127.0.0.1:{settings.port('twin')}",
            "--cluster-name",
            settings.cluster,
        )

    def _health_command(self, settings: Settings) -> list[str]:
        return self.health_replica(settings, alertmanagers=[settings.url("alertmanager")])

    def health_replica(
        self,
        settings: Settings,
        *,
        alertmanagers: list[str],
        prometheus: str | None = None,
        port: str = "health",
        state: str = "health",
        extra: tuple[str, ...] = (),
    ) -> list[str]:
        """A health service of this stack (with this check's policy, on the twin's scheduler): on the
        port named ``port``, its state in the data folder ``state``."""
        return serve_command(
            f"127.0.0.1:{settings.port(port)}",
            settings.data_dir(state),
            policy=self.policy,
            cluster=settings.cluster,
            alertmanagers=alertmanagers,
            prometheus=prometheus or settings.url("prometheus"),
            scheduler=settings.url("twin", "/slurm/v0.0.40"),
            events_token_file=events_token_file(settings),  # the Alertmanager's webhook to it
            extra=extra,
        )

    def start(self) -> None:
        """Start the stack with the supervisor (in this process: its events go to the run folder's
        supervisor.log); the twin and the health service must come up, the others are reported."""
        self.settings.run_dir.mkdir(parents=True, exist_ok=True)
        self.supervisor = Supervisor(self.settings, self.components())
        with self.supervisor_log():
            self.supervisor.start_all()
        for name in self.must_start:
            state = self.supervisor.states[name]
            if state.status != "ready":
                raise RuntimeError(f"the {name} did not start: {state.detail}: {tail(Path(state.log))}")

    def stop(self) -> None:
        if self.supervisor is not None:
            with self.supervisor_log():
                self.supervisor.stop_all()

    def supervisor_log(self) -> contextlib.AbstractContextManager[Any]:
        log = self.settings.log_file("supervisor")
        log.parent.mkdir(parents=True, exist_ok=True)
        stack = contextlib.ExitStack()
        stack.enter_context(contextlib.redirect_stdout(stack.enter_context(log.open("a"))))
        return stack

    def problems(self) -> dict[str, str]:
        if self.supervisor is None:
            return {}
        return {
            name: f"{state.status}: {state.detail}"
            for name, state in self.supervisor.states.items()
            if state.status not in ("ready", "stopped")
        }

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
                    timeline = timelines.setdefault(item["node"], Timeline())
                    timeline.samples.append((now, item["state"], signals))
                    for spot in item.get("blind_spots", []):
                        timeline.blind.setdefault(spot["signal"], now)
                self.light_checks(now)
                time.sleep(interval)
        return timelines, most_breaker_alerts

    def light_checks(self, now: float) -> None:
        """Every LIGHT_EVERY_S, the light check on every node the twin has, as a node's timer runs it: the
        real runner and parser, the twin's stand-in for the tool (which answers "not found" where a
        check_tool_missing fault says so), the result posted to the checks service with its token."""
        if now - self.light_ran < LIGHT_EVERY_S or self.supervisor is None:
            return
        self.light_ran = now
        from checks import runner
        from checks.catalog import load_catalog
        from checks.component import token_file

        check = load_catalog()[LIGHT_CHECK]
        stand_in = [sys.executable, "-m", "twin.checks", "--faults", str(self.truth), "--node", "{node}"]
        tools = runner.Tools({"dcgmi": [*stand_in, "dcgmi"]})
        try:
            nodes = [
                n["node"]
                for n in httpx.get(self.settings.url("health", "/v1/nodes"), timeout=5).json()["nodes"]
            ]
            results = [runner.run_check(check, node, tools) for node in nodes]
            token = token_file(self.settings).read_text().strip()
            runner.post_results(self.settings.url("checks"), results, token)
        except (httpx.HTTPError, OSError, ValueError) as exc:
            self.light_errors.append(f"{time.strftime('%H:%M:%S')} {exc}")

    def faults(self) -> list[Fault]:
        """The faults the twin has begun so far (it rewrites its truth file whole as they happen)."""
        return load_faults(self.truth)


def tail(path: Path, lines: int = 8) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def summarize(fault: Fault, timeline: Timeline | None, node: str | None = None) -> dict[str, Any]:
    """State reached (the most severe), its reasons, seconds from onset to the first change and to the
    most severe state, and seconds from the fault's end back to healthy; on ``node`` (one of the hosts
    that a fault without a node of its own touched: a crashed job's), else on the fault's node. A fault
    that is not the hardware's gets a verdict: right (the node stayed in service, not degraded), wrong
    drain or wrong degrade."""
    row: dict[str, Any] = {
        "kind": fault.kind,
        "node": node or fault.node or "-",
        "state": "healthy",
        "reasons": [],
        "first_change_s": None,
        "worst_s": None,
        "back_healthy_s": None,
        "hardware": fault.hardware,
        "verdict": "" if fault.hardware else "right",
    }
    if timeline is None:
        return row
    onset, end = fault.onset, fault.end
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
    if not fault.hardware and worst[1] in DRAIN_STATES:
        row["verdict"] = "wrong drain"
    elif not fault.hardware and worst[1] == "degraded":
        row["verdict"] = "wrong degrade"
    return row


def fault_rows(faults: list[Fault], timelines: dict[str, Timeline]) -> list[dict[str, Any]]:
    """One row per fault and node it touched (a crashed job's: every node of the job)."""
    touched = [(fault, node) for fault in faults for node in (fault.nodes or [""])]
    return [summarize(fault, timelines.get(node), node or None) for fault, node in touched]


def node_rows(faults: list[Fault], timelines: dict[str, Timeline]) -> list[dict[str, Any]]:
    """Every node the health service knew, faulty or not: its faults (hardware or not), the worst state
    it reached, that state's reasons, the blind spots it showed, and the first action: seconds from the
    node's first fault to its first state out of service (or, for a node without a hardware fault, to any
    state that is not healthy or unobserved)."""
    by_node: dict[str, list[Fault]] = {}
    for fault in faults:
        for node in fault.nodes:
            by_node.setdefault(node, []).append(fault)
    rows = []
    for node, timeline in sorted(timelines.items()):
        mine = by_node.get(node, [])
        hardware = any(f.hardware for f in mine)
        worst = max(timeline.samples, key=lambda x: SEVERITY_ORDER.index(x[1]), default=(0.0, "healthy", []))
        onset = min((f.onset for f in mine), default=None)
        acted = [t for t, st, _ in timeline.samples if st in DRAIN_STATES]
        row = {
            "node": node,
            "faults": [f"{f.kind}{'' if f.hardware else ' (not hardware)'}" for f in mine],
            "hardware_fault": hardware,
            "worst_state": worst[1],
            "reasons": worst[2],
            "blind_spots": sorted(timeline.blind),
            "first_action_s": round(acted[0] - onset) if acted and onset is not None else None,
            "blind_alert_s": {
                name: round(t - onset) if onset is not None else None
                for name, t in sorted(timeline.blind.items())
            },
        }
        row["wrongly_out_of_service"] = not hardware and bool(acted)
        rows.append(row)
    return rows


def node_markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| node | faults | worst state | reasons | blind spots (s after onset) | first action after onset |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        blind = ", ".join(f"{k} {v} s" for k, v in r["blind_alert_s"].items()) or "-"
        action = "-" if r["first_action_s"] is None else f"{r['first_action_s']} s"
        lines.append(
            f"| {r['node']} | {', '.join(r['faults']) or '-'} | {r['worst_state']} | "
            f"{', '.join(r['reasons']) or '-'} | {blind} | {action} |"
        )
    return "\n".join(lines)


def wrong_drains(rows: list[dict[str, Any]]) -> list[str]:
    """``kind node`` of every fault that is not the hardware's whose node was drained (or repaired)."""
    return [f"{r['kind']} {r['node']}" for r in rows if r.get("verdict") == "wrong drain"]


def bystanders(faults: list[Fault], timelines: dict[str, Timeline]) -> dict[str, list[str]]:
    """Nodes with no fault of their own that left healthy: the signals that moved them."""
    faulty = {node for f in faults for node in f.nodes}
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
        "| healthy again after the fault ended | not the hardware: verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:

        def secs(v: int | None) -> str:
            return "-" if v is None else f"{v} s"

        lines.append(
            f"| {r['kind']} | {r['node']} | {r['state']} | {', '.join(r['reasons']) or '-'} | "
            f"{secs(r['first_change_s'])} | {secs(r['worst_s'])} | {secs(r['back_healthy_s'])} | "
            f"{r.get('verdict') or '-'} |"
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
        rows = fault_rows(faults, timelines)
        nodes = node_rows(faults, timelines)
        drain_list = httpx.get(stack.settings.url("health", "/v1/drain-list"), timeout=5).json()
        return {
            "rows": rows,
            "nodes": nodes,
            "nodes_out_of_service_without_a_hardware_fault": [
                n["node"] for n in nodes if n["wrongly_out_of_service"]
            ],
            "light_check_errors": stack.light_errors[-20:],
            "wrong_drains": wrong_drains(rows),
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
