"""Where the health service's signals come from, each over its real protocol:

- Alertmanager API v2 (``GET /api/v2/alerts``): the alerts firing for a node (label ``node``);
- Prometheus HTTP API: the node list and scalable units (``up`` targets' labels), exporter reachability
  (``up == 0``), the anomaly service's ``fleetsight_straggler``, and ``ALERTS`` when there is no
  Alertmanager;
- the anomaly service's ``GET /v1/stragglers``;
- the scheduler's own view: slurmrestd-style ``/nodes`` and ``/jobs`` (real slurmrestd or the twin).

A source that fails is reported (``ok=False`` with the error) and the others still count: a node is
never declared healthy or unhealthy because a source went away.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from .engine import SchedulerView, Signal
from .policy import Policy

log = logging.getLogger("health.sources")
NODE_LABELS = ("node", "hostname", "host")


@dataclass
class SourceResult:
    name: str
    ok: bool
    signals: list[Signal] = field(default_factory=list)
    nodes: dict[str, str] = field(default_factory=dict)
    scheduler: dict[str, SchedulerView] = field(default_factory=dict)
    error: str = ""


def parse_time(value: str | None, default: float) -> float:
    if not value:
        return default
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return default


def node_of(labels: dict[str, str]) -> str | None:
    for key in NODE_LABELS:
        if labels.get(key):
            return labels[key]
    return None


def expand_hostlist(expression: str) -> list[str]:
    """Slurm hostlist: "n[0001-0003,0007],gpu5" -> n0001 n0002 n0003 n0007 gpu5."""
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", expression or ""):
        match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not match:
            names.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for item in ranges.split(","):
            low, _, high = item.partition("-")
            for number in range(int(low), int(high or low) + 1):
                names.append(f"{prefix}{number:0{len(low)}d}{suffix}")
    return names


def split_urls(urls: str | None) -> list[str]:
    """``"http://a:9093, http://b:9093/"`` -> ``["http://a:9093", "http://b:9093"]``."""
    return [url.strip().rstrip("/") for url in (urls or "").split(",") if url.strip()]


class Sources:
    """Collects every configured source once per refresh."""

    def __init__(
        self,
        policy: Policy,
        alertmanager_url: str | None = None,
        prometheus_url: str | None = None,
        anomaly_url: str | None = None,
        scheduler_url: str | None = None,
        scheduler_token: str | None = None,
        scheduler_socket: str | None = None,
        static_nodes: Iterable[str] = (),
    ) -> None:
        self.policy = policy
        self.alertmanager_url = alertmanager_url
        # An HA pair (or more), comma-separated: Prometheus sends every alert to each, so either answers.
        self.alertmanager_urls = split_urls(alertmanager_url)
        self.prometheus_url = prometheus_url
        self.anomaly_url = anomaly_url
        self.scheduler_url = scheduler_url.rstrip("/") if scheduler_url else None
        self.static_nodes = list(static_nodes)
        self.client = httpx.Client(timeout=policy.source_timeout_s)
        # slurmrestd: JWT in a header over TCP, or rest_auth/local over its UNIX socket
        headers = {"X-SLURM-USER-TOKEN": scheduler_token} if scheduler_token else {}
        transport = httpx.HTTPTransport(uds=scheduler_socket) if scheduler_socket else None
        self.scheduler_client = httpx.Client(
            timeout=policy.source_timeout_s, headers=headers, transport=transport
        )
        self.first_seen: dict[str, float] = {}  # Prometheus-derived signals carry no start time
        self.key_source: dict[str, str] = {}
        self.touched: set[str] = set()
        # The scheduler's last full node list (name -> state words, partitions), for service discovery:
        # None until /nodes has answered once; kept as it was when a later read fails.
        self.inventory: dict[str, dict[str, Any]] | None = None

    def close(self) -> None:
        self.client.close()
        self.scheduler_client.close()

    def collect(self, now: float) -> list[SourceResult]:
        self.touched: set[str] = set()
        results = [SourceResult("static", True, nodes={n: "" for n in self.static_nodes})]
        for name, url, method in (
            ("alertmanager", self.alertmanager_url, self._alertmanager),
            ("prometheus", self.prometheus_url, self._prometheus),
            ("anomaly", self.anomaly_url, self._anomaly),
            ("scheduler", self.scheduler_url, self._scheduler),
        ):
            if not url:
                continue
            try:
                results.append(method(now))
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
                log.warning("event=source_failed source=%s error=%s", name, exc)
                results.append(SourceResult(name, False, error=f"{type(exc).__name__}: {exc}"))
        # forget the start of signals gone this round (a source that failed keeps its own)
        failed = {r.name for r in results if not r.ok}
        self.first_seen = {
            k: v for k, v in self.first_seen.items() if k in self.touched or self.key_source.get(k) in failed
        }
        self.key_source = {k: v for k, v in self.key_source.items() if k in self.first_seen}
        return results

    def _since(self, signal_key: str, now: float, source: str = "prometheus") -> float:
        self.touched.add(signal_key)
        self.key_source[signal_key] = source
        return self.first_seen.setdefault(signal_key, now)

    def _signal(self, node: str, name: str, source: str, since: float, **extra: Any) -> Signal:
        severity = extra.pop("severity", None)
        runbook = extra.pop("runbook", "") or self.policy.runbook(name)
        return Signal(node, name, source, since, self.policy.effect(name, severity), runbook=runbook, **extra)

    # ------------------------------------------------------------------------------ Alertmanager
    def _active_alerts(self) -> tuple[list[dict[str, Any]], list[str]]:
        """Active alerts of every Alertmanager of the pair, once each (by fingerprint), and which
        Alertmanagers did not answer; raises only when none did."""
        alerts: dict[str, dict[str, Any]] = {}
        failures: list[str] = []
        for url in self.alertmanager_urls:
            try:
                response = self.client.get(
                    f"{url}/api/v2/alerts",
                    params={"active": "true", "silenced": "false", "inhibited": "false"},
                )
                response.raise_for_status()
                answered = response.json()
            except (httpx.HTTPError, ValueError) as exc:
                failures.append(f"{url}: {type(exc).__name__}: {exc}")
                if len(failures) == len(self.alertmanager_urls):
                    raise
                continue
            for alert in answered:
                key = alert.get("fingerprint") or repr(sorted(alert.get("labels", {}).items()))
                alerts.setdefault(key, alert)
        return list(alerts.values()), failures

    def _alertmanager(self, now: float) -> SourceResult:
        active, failures = self._active_alerts()
        if failures:
            log.warning("event=alertmanager_peer_failed errors=%s", "; ".join(failures))
        signals = []
        for alert in active:
            labels = alert.get("labels", {})
            node = node_of(labels)
            if node is None or alert.get("status", {}).get("state", "active") != "active":
                continue
            annotations = alert.get("annotations", {})
            signals.append(
                self._signal(
                    node,
                    labels.get("alertname", "unnamed"),
                    "alertmanager",
                    parse_time(alert.get("startsAt"), now),
                    severity=labels.get("severity"),
                    runbook=annotations.get("runbook_url", ""),
                    summary=annotations.get("summary", ""),
                    evidence={"labels": labels, "fingerprint": alert.get("fingerprint")},
                )
            )
        return SourceResult("alertmanager", True, signals=signals, error="; ".join(failures))

    # ------------------------------------------------------------------------------ Prometheus
    def query(self, promql: str) -> list[dict[str, Any]]:
        response = self.client.get(f"{self.prometheus_url}/api/v1/query", params={"query": promql})
        response.raise_for_status()
        body = response.json()
        if body.get("status") != "success":
            raise ValueError(f"Prometheus answered {body.get('errorType')}: {body.get('error')}")
        return body["data"]["result"]

    def _prometheus(self, now: float) -> SourceResult:
        result = SourceResult("prometheus", True)
        breaker = self.policy.breaker
        reach: dict[str, list[tuple[str, float]]] = {}
        for series in self.query('up{node!=""}'):
            labels = series["metric"]
            node = labels["node"]
            unit = labels.get(breaker.unit_label) or labels.get(breaker.unit_fallback_label) or ""
            if unit or node not in result.nodes:
                result.nodes[node] = unit
            reach.setdefault(node, []).append((labels.get("job", ""), float(series["value"][1])))
        for node, jobs in reach.items():
            down = sorted(job for job, value in jobs if value == 0)
            if down:
                key = f"{node}:exporter_unreachable"
                result.signals.append(
                    self._signal(
                        node,
                        "exporter_unreachable",
                        "prometheus",
                        self._since(key, now),
                        summary=f"Prometheus cannot scrape {', '.join(down)} on {node}",
                        evidence={"labels": {}, "down_jobs": down, "all_down": len(down) == len(jobs)},
                    )
                )
        for series in self.query("fleetsight_straggler > 0"):
            labels = series["metric"]
            node = labels.get("node")
            if node:
                key = f"{node}:straggler:{labels.get('hpc_job')}"
                result.signals.append(
                    self._straggler(node, labels, float(series["value"][1]), self._since(key, now))
                )
        if not self.alertmanager_url:
            for series in self.query('ALERTS{alertstate="firing"}'):
                labels = series["metric"]
                node = node_of(labels)
                if node:
                    name = labels.get("alertname", "unnamed")
                    key = f"{node}:{name}:{sorted(labels.items())}"
                    result.signals.append(
                        self._signal(
                            node,
                            name,
                            "prometheus",
                            self._since(key, now),
                            severity=labels.get("severity"),
                            evidence={"labels": labels},
                        )
                    )
        return result

    def _straggler(self, node: str, labels: dict[str, str], score: float, since: float) -> Signal:
        job = labels.get("hpc_job", "")
        return self._signal(
            node,
            "straggler",
            "anomaly",
            since,
            summary=f"straggler in job {job}: {labels.get('cause', 'unknown cause')}",
            evidence={"labels": {"hpc_job": job, "cause": labels.get("cause", "")}, "score": score},
        )

    # ------------------------------------------------------------------------------ anomaly service
    def _anomaly(self, now: float) -> SourceResult:
        response = self.client.get(f"{self.anomaly_url}/v1/stragglers")
        response.raise_for_status()
        body = response.json()
        items = body.get("stragglers", body.get("items", [])) if isinstance(body, dict) else body
        signals = []
        for item in items:
            node = item.get("node") if isinstance(item, dict) else None
            if not node:
                continue
            labels = {
                "hpc_job": str(item.get("hpc_job", item.get("job", ""))),
                "cause": str(item.get("cause", "")),
            }
            key = f"{node}:straggler:{labels['hpc_job']}"
            since = parse_time(item.get("since"), self._since(key, now, "anomaly"))
            signals.append(self._straggler(node, labels, float(item.get("score", 1.0)), since))
        return SourceResult("anomaly", True, signals=signals)

    # ------------------------------------------------------------------------------ scheduler
    def _scheduler(self, now: float) -> SourceResult:
        result = SourceResult("scheduler", True)
        busy: set[str] = set()
        jobs = self.scheduler_client.get(f"{self.scheduler_url}/jobs")
        jobs.raise_for_status()
        for job in jobs.json().get("jobs", []):
            state = job.get("job_state")
            states = state if isinstance(state, list) else [state]
            if "RUNNING" in states or "COMPLETING" in states:
                busy.update(expand_hostlist(job.get("nodes", "")))
        nodes = self.scheduler_client.get(f"{self.scheduler_url}/nodes")
        if nodes.status_code == 404:  # a jobs-only endpoint (older twins): busy nodes are all it knows
            result.scheduler = {n: SchedulerView(busy=True) for n in busy}
            return result
        nodes.raise_for_status()
        inventory: dict[str, dict[str, Any]] = {}
        for item in nodes.json().get("nodes", []):
            name = item["name"]
            # v0.0.40+ (23.11): state ["DOWN", "DRAIN", "NOT_RESPONDING"]; v0.0.38 (22.05): state "down"
            # and state_flags ["DRAIN", "NOT_RESPONDING"]; both read as the same words
            state = item.get("state", [])
            words = [w.upper() for w in (state if isinstance(state, list) else str(state).split("+"))]
            words += [w.upper() for w in item.get("state_flags", [])]
            reason = item.get("reason") or ""
            allocated = any(w in ("ALLOCATED", "MIXED", "COMPLETING") for w in words)
            result.scheduler[name] = SchedulerView(tuple(words), reason, busy=allocated or name in busy)
            result.nodes.setdefault(name, "")
            inventory[name] = {"state": words, "partitions": list(item.get("partitions") or [])}
            # NOT_RESPONDING alone is also what a freshly resumed node shows until its next ping
            for word, signal in (
                ("DOWN", "scheduler_down"),
                ("FAIL", "scheduler_fail"),
                ("NOT_RESPONDING", "scheduler_not_responding"),
            ):
                if word in words:
                    key = f"{name}:{signal}"
                    result.signals.append(
                        self._signal(
                            name,
                            signal,
                            "scheduler",
                            self._since(key, now, "scheduler"),
                            summary=f"the scheduler reports {name} {'+'.join(words)}: {reason}",
                            evidence={"labels": {}, "states": words, "reason": reason},
                        )
                    )
                    break
        self.inventory = inventory
        return result
