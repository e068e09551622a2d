"""Where the health service's signals come from, each over its real protocol:

- Alertmanager API v2 (``GET /api/v2/alerts``): the alerts firing for a node (label ``node``);
- Prometheus HTTP API: the node list and scalable units (``up`` targets' labels), the anomaly service's
  ``fleetsight_straggler``, and ``ALERTS`` when there is no Alertmanager. A raw ``up == 0`` is no signal:
  one missed scrape is noise; the ``NodeDown`` / ``ExporterDown`` alerts carry reachability with the
  debounce (``for:``) their rules give it;
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

from fleetsight.dcgm import NEEDED_FIELDS, missing_fields_promql, names_of
from fleetsight.prometheus import Prometheus, PrometheusError
from fleetsight.slurmrest import SlurmRest, job_nodes, job_states

from .model import SchedulerView, Signal
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
    # Prometheus only: the needed DCGM fields dcgm-exporter does not publish (missing_dcgm_fields)
    dcgm_fields: list[dict[str, Any]] | None = None


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


def missing_dcgm_fields(series: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Prometheus's answer to missing_fields_promql() as one entry per missing field: its names, the
    nodes lacking it per cluster, and the alerts and signals it blinds (NEEDED_FIELDS, the same list
    as the DCGMFieldsMissing alert's)."""
    nodes: dict[str, dict[str, int]] = {}
    for item in series:
        labels = item.get("metric", {})
        nodes.setdefault(labels.get("field", ""), {})[labels.get("cluster", "")] = int(
            float(item["value"][1])
        )
    return [
        {
            "field": need.field,
            "names": list(names_of(need.field)),
            "nodes_without_it": nodes[need.field],
            "blinds_alerts": list(need.alerts),
            "blinds_signals": list(need.signals),
            "note": need.note,
        }
        for need in NEEDED_FIELDS
        if need.field in nodes
    ]


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
        self.prometheus = Prometheus(prometheus_url, policy.source_timeout_s) if prometheus_url else None
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
        # a base URL (http://slurmrestd:6820: the newest API version it offers, from its OpenAPI
        # document) or a versioned one (http://slurmrestd:6820/slurm/v0.0.38, pinned)
        self.slurm = SlurmRest(self.scheduler_url, self.scheduler_client) if self.scheduler_url else None
        self.first_seen: dict[str, float] = {}  # Prometheus-derived signals carry no start time
        self.key_source: dict[str, str] = {}
        self.touched: set[str] = set()
        # The scheduler's last full node list (name -> state words, partitions), for service discovery:
        # None until /nodes has answered once; kept as it was when a later read fails.
        self.inventory: dict[str, dict[str, Any]] | None = None
        # The fleet's missing DCGM fields change with a deployment, not a scrape: asked for once per
        # policy.dcgm_fields_interval_s, the answer kept in between (None until Prometheus answered).
        self.dcgm_fields: list[dict[str, Any]] | None = None
        self.dcgm_fields_at = float("-inf")

    def close(self) -> None:
        self.client.close()
        self.scheduler_client.close()
        if self.prometheus is not None:
            self.prometheus.close()

    def collect_one(self, name: str, now: float) -> list[SourceResult]:
        """One source alone (the scheduler's poll between sweeps)."""
        return self.collect(now, only={name})

    def collect(self, now: float, only: set[str] | None = None) -> list[SourceResult]:
        self.touched: set[str] = set()
        results = [SourceResult("static", True, nodes={n: "" for n in self.static_nodes})]
        for name, url, method in (
            ("alertmanager", self.alertmanager_url, self._alertmanager),
            ("prometheus", self.prometheus_url, self._prometheus),
            ("anomaly", self.anomaly_url, self._anomaly),
            ("scheduler", self.scheduler_url, self._scheduler),
        ):
            if not url or (only is not None and name not in only):
                continue
            try:
                results.append(method(now))
            except (httpx.HTTPError, PrometheusError, ValueError, KeyError, TypeError) as exc:
                log.warning("event=source_failed source=%s error=%s", name, exc)
                results.append(SourceResult(name, False, error=f"{type(exc).__name__}: {exc}"))
        # forget the start of signals gone this round (a source that failed keeps its own)
        # (and a source not read this round keeps its own too)
        kept = {r.name for r in results if not r.ok}
        if only is not None:
            kept |= {"alertmanager", "prometheus", "anomaly", "scheduler"} - only
        self.first_seen = {
            k: v for k, v in self.first_seen.items() if k in self.touched or self.key_source.get(k) in kept
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
        """Every alert of every Alertmanager of the pair (silenced and inhibited ones too: their
        ``status.state`` says so), once each (by fingerprint), and which Alertmanagers did not answer;
        raises only when none did."""
        alerts: dict[str, dict[str, Any]] = {}
        failures: list[str] = []
        for url in self.alertmanager_urls:
            try:
                response = self.client.get(
                    f"{url}/api/v2/alerts",
                    params={"active": "true", "silenced": "true", "inhibited": "true", "unprocessed": "true"},
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
        known: set[tuple[str, str]] = set()
        for alert in active:
            labels = alert.get("labels", {})
            known.add((labels.get("alertname", ""), node_of(labels) or ""))
            if alert.get("status", {}).get("state", "active") != "active":
                continue  # silenced, inhibited, or not yet processed
            signal = self.alert_signal(alert, now)
            if signal is not None:
                signals.append(signal)
        if self.prometheus_url:
            signals += self._alerts_alertmanager_lost(known, now)
        return SourceResult("alertmanager", True, signals=signals, error="; ".join(failures))

    def _alerts_alertmanager_lost(self, known: set[tuple[str, str]], now: float) -> list[Signal]:
        """Alerts firing in Prometheus for longer than the grace that no answering Alertmanager knows
        in any state: events the Alertmanager lost (it keeps alerts in memory only, and a restarted
        one knows nothing until Prometheus re-sends). Signals of this source, so that the next sweep
        drops them once the Alertmanager knows the alert again (and decides about silences)."""
        grace = round(self.policy.unknown_alert_grace_s)
        firing = 'ALERTS{alertstate="firing"}'
        try:
            series = self.query(f"{firing} and {firing} offset {grace}s")
        except (PrometheusError, ValueError, KeyError) as exc:
            log.warning("event=unknown_alerts_unread error=%s", exc)
            return []
        signals = []
        for item in series:
            labels = {k: v for k, v in item["metric"].items() if k not in ("__name__", "alertstate")}
            node, name = node_of(labels), labels.get("alertname", "unnamed")
            if node is None or (name, node) in known:
                continue
            log.warning("event=alert_unknown_to_alertmanager alertname=%s node=%s", name, node)
            signals.append(
                self._signal(
                    node,
                    name,
                    "alertmanager",
                    self._since(f"{node}:{name}:{sorted(labels.items())}", now, "alertmanager"),
                    severity=labels.get("severity"),
                    evidence={"labels": labels, "from": "Prometheus ALERTS: unknown to Alertmanager"},
                )
            )
        return signals

    def alert_signal(self, alert: dict[str, Any], now: float) -> Signal | None:
        """The signal of one alert as Alertmanager gives it (API v2 or a webhook notification: the same
        labels, so the same reason key), or None when it names no node."""
        labels = alert.get("labels", {})
        node = node_of(labels)
        if node is None:
            return None
        annotations = alert.get("annotations", {})
        return self._signal(
            node,
            labels.get("alertname", "unnamed"),
            "alertmanager",
            parse_time(alert.get("startsAt"), now),
            severity=labels.get("severity"),
            runbook=annotations.get("runbook_url", ""),
            summary=annotations.get("summary", ""),
            evidence={"labels": labels, "fingerprint": alert.get("fingerprint")},
        )

    # ------------------------------------------------------------------------------ Prometheus
    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query now; PrometheusError when Prometheus fails (a failed source, not a crash)."""
        assert self.prometheus is not None  # asked only with a Prometheus URL
        return self.prometheus.query(promql)

    def _prometheus(self, now: float) -> SourceResult:
        result = SourceResult("prometheus", True)
        breaker = self.policy.breaker
        for series in self.query('up{node!=""}'):  # the inventory only: reachability is an alert's
            labels = series["metric"]
            node = labels["node"]
            unit = labels.get(breaker.unit_label) or labels.get(breaker.unit_fallback_label) or ""
            if unit or node not in result.nodes:
                result.nodes[node] = unit
        for series in self.query("fleetsight_straggler > 0"):
            labels = series["metric"]
            node = labels.get("node")
            if node:
                key = f"{node}:straggler:{labels.get('hpc_job')}"
                result.signals.append(
                    self._straggler(node, labels, float(series["value"][1]), self._since(key, now))
                )
        result.dcgm_fields = self._dcgm_fields(now)
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

    def _dcgm_fields(self, now: float) -> list[dict[str, Any]] | None:
        if now - self.dcgm_fields_at >= self.policy.dcgm_fields_interval_s:
            self.dcgm_fields = missing_dcgm_fields(self.query(missing_fields_promql()))
            self.dcgm_fields_at = now
        return self.dcgm_fields

    def refresh_dcgm_fields(self, now: float) -> None:
        """The missing-DCGM-fields answer on its own interval, between sweeps (Prometheus errors are the
        next sweep's to report)."""
        if self.prometheus_url:
            try:
                self._dcgm_fields(now)
            except (PrometheusError, ValueError, KeyError, TypeError) as exc:
                log.warning("event=dcgm_fields_failed error=%s", exc)

    def straggler_event(self, item: dict[str, Any], now: float) -> Signal | None:
        """The signal of one anomaly-service flag or clear (POST /v1/events/anomaly): the same reason
        key as the same straggler read from /v1/stragglers or ``fleetsight_straggler``."""
        node = item.get("node")
        if not node:
            return None
        labels = {
            "hpc_job": str(item.get("hpc_job", item.get("job", ""))),
            "cause": str(item.get("cause", "")),
        }
        since = parse_time(item.get("since"), now)
        return self._straggler(str(node), labels, float(item.get("score", 1.0)), since)

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
        assert self.slurm is not None  # collect() calls this only with a scheduler URL
        for job in self.slurm.json("jobs").get("jobs", []):
            # v0.0.38 (22.05): job_state "RUNNING"; v0.0.40+ (23.11): ["RUNNING", "COMPLETING"]
            if {"RUNNING", "COMPLETING"} & set(job_states(job)):
                busy.update(job_nodes(job))
        nodes = self.slurm.get("nodes")
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
