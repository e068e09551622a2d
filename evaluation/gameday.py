"""A game day: the local stack plays a twin scenario with hardware faults while FleetSight's own processes
are killed, paused and restarted on a seeded schedule (evaluation/gameday_chaos.py); afterwards the
history is judged (evaluation/gameday_verdict.py): which alerts arrived and how late, which log lines were
lost or doubled, what the health service did and whether it acted wrongly, how long each component took
to come back.

The stack is the components' own declarations, as in the health check (evaluation/health.py, whose
TwinStack this extends with the log path and both replicas of each pair), run by the stack's supervisor in
this process: it restarts what the chaos kills, as it does under ``fleetsight up``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from alerting.component import slack_record_file
from alerting.slack_sink import read_records
from fleetsight.components import Component, load_components
from fleetsight.prometheus import Prometheus, PrometheusError
from fleetsight.settings import Settings
from health.component import election_args
from twin.truth import Fault

from . import gameday_chaos as chaos
from . import log_ledger
from .gameday_links import LinkProxy
from .gameday_verdict import (
    ALERT_ALLOWANCE_S,
    Verdict,
    journeys,
    judge,
    non_leader_writes,
    slack_alerts,
    wrongly_out_of_service,
)
from .health import Timeline, TwinStack

AROUND_THE_TWIN = (
    "slack-sink",
    "alertmanager",
    "alertmanager-b",
    "exporter-node",
    "exporter-fabric",
    "kafka",
    "opensearch",
    "logs-shipper",
    "logs-node",
    "checks",
    "prometheus",  # the health service starts just before it (TwinStack)
    "prometheus-b",
    "anomaly",
    "thanos-sidecar",
    "thanos-sidecar-b",
    "thanos-query",
)
SAMPLE_S = 2.0
STATUS_TIMEOUT_S = 2.0  # a paused replica must not hold the sampling up for long
# the health service's replicas in this stack: component -> its identity in the election
HEALTH_REPLICAS = {"health": "health-a", "health-b": "health-b"}
_LOG_TIME = re.compile(r"^ts=(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d+) ")
_STATE_CHANGE = re.compile(r"event=state_change node=(\S+) from=(\S+) to=(\S+) reasons=(\S*)")
_LEADERSHIP = re.compile(r"event=leader_(acquired|lost)\b")
LEDGER_TIMEOUT_S = 300.0
FIRING_STEP_S = 5


@dataclass(frozen=True)
class GameDayOptions:
    scenario: Path
    folder: Path
    seed: int
    duration_s: float  # how long the chaos goes on
    mean_gap_s: float  # the mean time between two disruptions
    settle_s: float  # watching goes on this long after the chaos, for late alerts and recoveries
    policy: Path
    port_base: int
    alert_allowance_s: float = ALERT_ALLOWANCE_S
    kinds: tuple[str, ...] = tuple(chaos.KINDS)


@dataclass
class GameDayResult:
    options: GameDayOptions
    plan: list[chaos.Disruption]
    verdict: Verdict
    ledger: log_ledger.LedgerCount | None
    problems: dict[str, str]
    light_check_errors: list[str]

    def to_json(self) -> dict[str, Any]:
        options = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self.options).items()}
        verdict = self.verdict
        return {
            "options": options,
            "plan": [asdict(d) for d in self.plan],
            "holds": verdict.holds,
            "invariants": [{"name": n, "holds": ok, "evidence": e} for n, ok, e in verdict.invariants],
            "journeys": [asdict(j) for j in verdict.journeys],
            "logs": asdict(self.ledger) if self.ledger else None,
            "recovery": verdict.recovery,
            "disruptions": verdict.disruptions,
            "component_kinds": verdict.kinds,
            "health_decisions": verdict.decisions,
            "problems": self.problems,
            "light_check_errors": self.light_check_errors,
        }


class GameDayStack(TwinStack):
    """The twin, the whole stack around it (both replicas of each pair, the log path) and the health
    service as its pair (health-a and health-b on health-lease's Lease), told about both Alertmanagers;
    health-a's links to Prometheus A and Alertmanager A go through proxies the chaos can cut
    (evaluation/gameday_links.py)."""

    links: dict[str, LinkProxy]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.must_start = ("twin", "health-lease", *HEALTH_REPLICAS)

    def components(self) -> list[Component]:
        """TwinStack's order with the Lease before health-a and health-b after it."""
        registry = load_components()
        order = super().components()
        at = next(i for i, c in enumerate(order) if c.name == "health")
        health_a = dataclasses.replace(order[at], depends_on=(*order[at].depends_on, "health-lease"))
        health_b = self.here(registry["health-b"], command=self._health_b_command)
        order[at : at + 1] = [self.here(registry["health-lease"]), health_a, health_b]
        return order

    def start(self) -> None:
        self.links = {
            "health->prometheus": LinkProxy(
                "health->prometheus", ("127.0.0.1", self.settings.port("prometheus"))
            ),
            "health->alertmanager": LinkProxy(
                "health->alertmanager", ("127.0.0.1", self.settings.port("alertmanager"))
            ),
        }
        super().start()

    def stop(self) -> None:
        super().stop()
        for link in getattr(self, "links", {}).values():
            link.close()

    def _health_command(self, settings: Settings) -> list[str]:
        return self.health_replica(
            settings,
            alertmanagers=[self.links["health->alertmanager"].url, settings.url("alertmanager_b")],
            prometheus=self.links["health->prometheus"].url,
            extra=election_args(settings, HEALTH_REPLICAS["health"]),
        )

    def _health_b_command(self, settings: Settings) -> list[str]:
        return self.health_replica(
            settings,
            alertmanagers=[settings.url("alertmanager"), settings.url("alertmanager_b")],
            port="health_b",
            state="health-b",
            extra=election_args(settings, HEALTH_REPLICAS["health-b"]),
        )

    def roles(self, client: httpx.Client) -> dict[str, str]:
        """Each health replica's role as it says it (leader, follower), or "down" when it does not answer."""
        roles = {}
        for name, port in (("health", "health"), ("health-b", "health_b")):
            try:
                roles[name] = str(client.get(self.settings.url(port, "/v1/status")).json().get("role", ""))
            except (httpx.HTTPError, ValueError):
                roles[name] = "down"
        return roles

    def holder(self, role: str) -> str | None:
        """The replica that holds a role now (a chaos target "health-leader" or "health-follower")."""
        with httpx.Client(timeout=STATUS_TIMEOUT_S) as client:
            roles = self.roles(client)
        return next((name for name, said in roles.items() if said == role), None)

    def targets(self) -> dict[str, chaos.Target]:
        """What the chaos may disrupt: every supervised component but the twin (the cluster itself)."""
        assert self.supervisor is not None
        supervisor = self.supervisor

        def pid_of(name: str) -> Callable[[], int | None]:
            def pid() -> int | None:
                process = supervisor.processes.get(name)
                return process.pid if process is not None and process.poll() is None else None

            return pid

        return {
            c.name: chaos.Target(pid_of(c.name), lambda c=c: c.ready(self.settings))
            for c in supervisor.components
            if c.name != "twin"
        }

    def sample_nodes(self, client: httpx.Client, roles: dict[str, str]) -> list[dict[str, Any]] | None:
        """The nodes as the leader says (a follower's copy when no replica leads), or None."""
        for name in sorted(roles, key=lambda n: roles[n] != "leader"):
            port = "health" if name == "health" else "health_b"
            try:
                return client.get(self.settings.url(port, "/v1/nodes")).json()["nodes"]
            except (httpx.HTTPError, ValueError, KeyError):
                continue  # down or paused: no sample, not "healthy"
        return None


@dataclass
class Observed:
    timelines: dict[str, Timeline]
    leadership: list[tuple[float, str, str]]  # (wall time, replica identity, role)


def observe(stack: GameDayStack, until: float, progress: Callable[[str], None]) -> Observed:
    """Sample the health replicas' roles and the nodes every SAMPLE_S until ``until`` (and run the light
    checks as nodes' timers would); report progress once a minute."""
    seen = Observed({}, [])
    timelines = seen.timelines
    last_report = time.time()
    with httpx.Client(timeout=STATUS_TIMEOUT_S) as client:
        while time.time() < until:
            roles = stack.roles(client)
            seen.leadership += [(time.time(), HEALTH_REPLICAS[name], role) for name, role in roles.items()]
            nodes = stack.sample_nodes(client, roles)
            now = time.time()
            for item in nodes or []:
                signals = [r["signal"] for r in item["reasons"] if "last_seen" not in r]
                timelines.setdefault(item["node"], Timeline()).samples.append((now, item["state"], signals))
            stack.light_checks(now)
            if now - last_report >= 60:
                last_report = now
                progress(f"{until - now:.0f} s to go; {len(stack.faults())} faults so far")
            time.sleep(SAMPLE_S)
    return seen


def decisions(settings: Settings) -> list[dict[str, Any]]:
    """Every state change each health replica logged (``event=state_change``), with the replica that
    logged it (by its log file: a follower that decides shows in its own log) and the log line's time."""
    found = []
    for identity, at, match in _replica_log_lines(settings, _STATE_CHANGE):
        node, before, after, reasons = match.groups()
        found.append(
            {"t": at, "replica": identity, "what": f"{node} {before} -> {after} ({reasons or 'no reason'})"}
        )
    return found


def own_leadership(settings: Settings) -> list[tuple[float, str, str]]:
    """Each replica's own account of its role changes (``event=leader_acquired`` / ``leader_lost``), as
    (time, replica, role): what the verdict falls back on for a decision no role sample was near (one
    made while the stack was starting, before the watch began)."""
    return [
        (at, identity, "leader" if match.group(1) == "acquired" else "follower")
        for identity, at, match in _replica_log_lines(settings, _LEADERSHIP)
    ]


def _replica_log_lines(
    settings: Settings, pattern: re.Pattern[str]
) -> list[tuple[str, float, re.Match[str]]]:
    """(replica identity, the line's time, the match past the time stamp) for each line of each health
    replica's log that ``pattern`` matches."""
    found = []
    for name, identity in HEALTH_REPLICAS.items():
        path = settings.log_file(name)
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        for line in lines:
            stamped = _LOG_TIME.match(line)
            match = pattern.search(line, stamped.end()) if stamped else None
            if stamped and match:
                stamp, millis = stamped.groups()
                at = time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000
                found.append((identity, at, match))
    return found


def rule_firings(urls: list[str], start: float, end: float) -> dict[tuple[str, str], float]:
    """(alertname, node) -> the first time its alert was firing in either Prometheus replica (their own
    ALERTS series: Thanos Query's deduplication may show the replica that fired later). A replica that
    does not answer is left out; none answering raises."""
    first: dict[tuple[str, str], float] = {}
    errors = []
    for url in urls:
        try:
            with Prometheus(url, timeout=60) as prometheus:
                series = prometheus.query_range(
                    'ALERTS{alertstate="firing",node!=""}', start, end, FIRING_STEP_S
                )
        except PrometheusError as exc:
            errors.append(exc)
            continue
        for item in series:
            key = (item["metric"].get("alertname", ""), item["metric"].get("node", ""))
            at = float(item["values"][0][0])
            first[key] = min(at, first.get(key, at))
    if len(errors) == len(urls):
        raise errors[0]
    return first


def run_gameday(options: GameDayOptions, progress: Callable[[str], None] = lambda _m: None) -> GameDayResult:
    disruptions = chaos.plan(
        options.seed, options.duration_s, options.mean_gap_s, {k: chaos.KINDS[k] for k in options.kinds}
    )
    options.folder.mkdir(parents=True, exist_ok=True)
    history_file = (options.folder / "history.jsonl").open("a")

    def record(entry: dict[str, Any]) -> None:
        history_file.write(json.dumps(entry) + "\n")
        history_file.flush()
        if entry["event"] in ("disrupted", "recovered", "not_recovered", "skipped", "restored"):
            progress(_describe(entry))

    history = chaos.History(record)
    stack = GameDayStack(
        options.folder, options.scenario, options.port_base, options.policy, around=AROUND_THE_TWIN
    )
    stop_watching = threading.Event()
    cleanup = contextlib.ExitStack()
    try:
        progress(f"starting the stack on port base {options.port_base}")
        stack.start()
        assert stack.supervisor is not None
        progress(f"{len(stack.supervisor.components)} components ready")
        # The supervisor's restarts print their events: to its log, not among the game day's output.
        cleanup.enter_context(stack.supervisor_log())
        watcher = threading.Thread(target=stack.supervisor.watch, args=(stop_watching.is_set,), daemon=True)
        watcher.start()
        began = time.time()
        history.add(
            "began", seed=options.seed, plan=[asdict(d) for d in disruptions], problems=stack.problems()
        )
        progress(f"{len(disruptions)} disruptions over {options.duration_s:.0f} s (seed {options.seed})")
        roles = {
            "health-leader": lambda: stack.holder("leader"),
            "health-follower": lambda: stack.holder("follower"),
        }
        runner = chaos.Chaos(disruptions, stack.targets(), history, dict(stack.links), roles)
        runner.start()
        until = began + options.duration_s + options.settle_s
        seen = observe(stack, until, progress)
        runner.stop()
        if not runner.wait_recovered(chaos.RECOVERY_DEADLINE_S):
            progress("some disruptions were still being watched when the game day ended")
        watched_until = time.time()
        stop_watching.set()
        watcher.join(timeout=120)
        faults = stack.faults()
        ledger = _log_ledger(stack, progress)
        verdict = _judge(stack, options, faults, seen, history, began, watched_until, ledger)
        history.add("ended", holds=verdict.holds, broken=verdict.broken())
        return GameDayResult(
            options, disruptions, verdict, ledger, stack.problems(), stack.light_errors[-20:]
        )
    finally:
        stop_watching.set()
        cleanup.close()
        stack.stop()
        history_file.close()


def _log_ledger(stack: GameDayStack, progress: Callable[[str], None]) -> log_ledger.LedgerCount:
    """Stop the twin (the writer), then wait until every line it wrote is indexed, and count."""
    assert stack.supervisor is not None
    stack.supervisor.stop_one("twin")
    progress("twin stopped; waiting for every log line it wrote to be indexed")
    nodes_root = stack.settings.data_dir("twin") / "nodes"
    return log_ledger.settle(stack.settings.url("opensearch"), nodes_root, LEDGER_TIMEOUT_S)


def _judge(
    stack: GameDayStack,
    options: GameDayOptions,
    faults: list[Fault],
    seen: Observed,
    history: chaos.History,
    began: float,
    watched_until: float,
    ledger: log_ledger.LedgerCount,
) -> Verdict:
    try:
        # from before the first fault: the twin plays its faults from its own start, before the stack is up
        since = min([began, *(f.onset for f in faults)]) - 60
        replicas = [stack.settings.url("prometheus"), stack.settings.url("prometheus_b")]
        firings = rule_firings(replicas, since, watched_until)
    except PrometheusError as exc:
        history.add("firings_unavailable", error=str(exc))
        firings = {}
    alerts = slack_alerts(read_records(slack_record_file(stack.settings)))
    rows = journeys(faults, alerts, firings, seen.timelines, watched_until, options.alert_allowance_s)
    wrong_nodes = wrongly_out_of_service(faults, seen.timelines)
    made = decisions(stack.settings)
    wrong_writes = non_leader_writes(made, seen.leadership, own_leadership(stack.settings))
    by_own_log = sum(1 for decision in made if decision.get("judged_by") == "own log")
    return judge(rows, ledger, wrong_nodes, list(history.events), wrong_writes, len(made), by_own_log)


def _describe(entry: dict[str, Any]) -> str:
    """One progress line for a history event; a role (health-leader) names the replica that held it."""
    name = entry.get("component", "")
    if entry.get("process"):
        name = f"{name} ({entry['process']})"
    if entry["event"] == "disrupted":
        held = f" for {entry['hold_s']:.0f} s" if entry.get("hold_s") else ""
        return f"+{entry['at_s']:.0f} s {entry['action']} {name}{held}"
    if entry["event"] == "recovered":
        return f"  {name} back {entry['recovery_s']:.0f} s after the {entry['action']}"
    if entry["event"] == "restored":
        return f"  {name} restored"
    if entry["event"] == "not_recovered":
        return f"  {name} NOT back {entry['after_s']:.0f} s after the {entry['action']}"
    return f"  skipped {entry.get('action')} {name}: {entry.get('reason')}"
