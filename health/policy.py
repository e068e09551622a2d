"""The health policy (health/policy.yml): loaded once, validated, with clear errors for bad files."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fleetsight import durations

DEFAULT_POLICY = Path(__file__).with_name("policy.yml")
EFFECTS = ("ignore", "blind", "degraded", "unhealthy", "repair")


class PolicyError(ValueError):
    """The policy file is malformed; the message names the key."""


def parse_duration(value: Any, key: str) -> float:
    """Seconds from 30, "30s", "5m", "2h", "1d"."""
    try:
        return durations.seconds(value)
    except ValueError:
        raise PolicyError(f"{key}: {value!r} is not a duration (e.g. 30s, 5m, 2h)") from None


@dataclass(frozen=True)
class Breaker:
    window_s: float = 3600.0
    max_cluster_fraction: float = 0.10
    max_unit_fraction: float = 0.25
    min_nodes: int = 1
    unit_label: str = "su"
    unit_fallback_label: str = "rack"
    nodes_per_unit: int = 32


@dataclass(frozen=True)
class Policy:
    signals: dict[str, str] = field(default_factory=dict)
    unknown_alerts: str = "by_severity"
    runbook_base: str = "docs/runbooks/"
    # Signals that are not alerts, and the runbook that covers each (policy.yml `runbooks:`).
    runbooks: dict[str, str] = field(default_factory=dict)
    clean_for_s: float = 300.0
    confirm_for_s: float = 0.0
    auto_drain: bool = True
    breaker: Breaker = Breaker()
    preflight_fail: str = "open"
    preflight_timeout_s: float = 3.0
    unknown_nodes_fit: bool = True
    open_reads: bool = True
    assumed_node_mtbf_s: float = 2000 * 3600.0
    min_failures: int = 3
    refresh_interval_s: float = 5.0
    source_timeout_s: float = 3.0
    events_kept: int = 10000
    dcgm_fields_interval_s: float = 60.0
    # Events drive the state; the sweep re-reads every source to repair what an event missed.
    reconcile_interval_s: float = 300.0
    # A firing alert (Prometheus's ALERTS) that no answering Alertmanager knows, for longer than this, is
    # an event lost with the Alertmanager (a restart forgets; Prometheus re-sends every minute): the
    # sweep takes it from Prometheus. Longer than the re-send plus an evaluation, so the normal path wins.
    unknown_alert_grace_s: float = 120.0
    # Blind spots that leave a node without any GPU signal (policy.yml `unobserved:`): signal name and
    # the alert labels it must carry, e.g. ExporterDown with job=dcgm. Such a node is `unobserved`.
    unobserved: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (("ExporterDown", (("job", "dcgm"),)),)
    batch_s: float = 0.2  # events arriving this close together are decided (and written) as one batch
    scheduler_interval_s: float = 30.0  # the scheduler's view between sweeps (every tick while draining)

    def effect(self, signal: str, severity: str | None = None) -> str:
        """What a signal does to a node: ignore, blind, degraded, unhealthy or repair."""
        if signal in self.signals:
            return self.signals[signal]
        if self.unknown_alerts == "by_severity":
            return "unhealthy" if (severity or "").lower() in ("critical", "page") else "degraded"
        return self.unknown_alerts

    def leaves_unobserved(self, signal: str, labels: dict[str, str]) -> bool:
        """Does this blind spot leave the node with no GPU signal at all?"""
        return any(
            name == signal and all(labels.get(k) == v for k, v in matchers)
            for name, matchers in self.unobserved
        )

    def runbook(self, signal: str) -> str:
        """The runbook for a signal: the alert's own (``<alertname>.md``), or the one policy.yml names for
        a signal that is not an alert (``straggler`` -> ``StragglerNode``)."""
        return f"{self.runbook_base}{self.runbooks.get(signal, signal)}.md"


def _section(raw: dict[str, Any], key: str) -> dict[str, Any]:
    value = raw.get(key) or {}
    if not isinstance(value, dict):
        raise PolicyError(f"{key}: expected a mapping, got {type(value).__name__}")
    return value


def _fraction(value: Any, key: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"{key}: {value!r} is not a number") from exc
    if not 0 < number <= 1:
        raise PolicyError(f"{key}: {number} must be a fraction in (0, 1]")
    return number


def _choice(value: Any, key: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise PolicyError(f"{key}: {value!r} is not one of {', '.join(allowed)}")
    return str(value)


def _unobserved(value: Any, default: tuple[Any, ...]) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    """`unobserved:` is a list of mappings: `signal` plus the labels the alert must carry."""
    if value is None:
        return default
    if not isinstance(value, list) or not all(isinstance(v, dict) and "signal" in v for v in value):
        raise PolicyError("unobserved: expected a list of mappings, each with `signal` and optional labels")
    return tuple(
        (str(v["signal"]), tuple(sorted((str(k), str(x)) for k, x in v.items() if k != "signal")))
        for v in value
    )


def from_dict(raw: dict[str, Any]) -> Policy:
    if not isinstance(raw, dict):
        raise PolicyError("the policy must be a YAML mapping")
    signals = _section(raw, "signals")
    for name, effect in signals.items():
        _choice(effect, f"signals.{name}", EFFECTS)
    hysteresis = _section(raw, "hysteresis")
    breaker = _section(raw, "circuit_breaker")
    preflight = _section(raw, "preflight")
    api = _section(raw, "api")
    checkpoint = _section(raw, "checkpoint")
    refresh = _section(raw, "refresh")
    defaults = Policy()
    return Policy(
        signals={str(k): str(v) for k, v in signals.items()},
        unknown_alerts=_choice(
            raw.get("unknown_alerts", defaults.unknown_alerts), "unknown_alerts", ("by_severity", *EFFECTS)
        ),
        runbook_base=str(raw.get("runbook_base", defaults.runbook_base)),
        runbooks={str(k): str(v) for k, v in _section(raw, "runbooks").items()},
        clean_for_s=parse_duration(hysteresis.get("clean_for", "5m"), "hysteresis.clean_for"),
        confirm_for_s=parse_duration(hysteresis.get("confirm_for", 0), "hysteresis.confirm_for"),
        auto_drain=bool(raw.get("auto_drain", True)),
        breaker=Breaker(
            window_s=parse_duration(breaker.get("window", "1h"), "circuit_breaker.window"),
            max_cluster_fraction=_fraction(
                breaker.get("max_cluster_fraction", 0.10), "circuit_breaker.max_cluster_fraction"
            ),
            max_unit_fraction=_fraction(
                breaker.get("max_unit_fraction", 0.25), "circuit_breaker.max_unit_fraction"
            ),
            min_nodes=int(breaker.get("min_nodes", 1)),
            unit_label=str(breaker.get("unit_label", "su")),
            unit_fallback_label=str(breaker.get("unit_fallback_label", "rack")),
            nodes_per_unit=int(breaker.get("nodes_per_unit", 32)),
        ),
        preflight_fail=_choice(preflight.get("fail", "open"), "preflight.fail", ("open", "closed")),
        preflight_timeout_s=parse_duration(preflight.get("timeout", "3s"), "preflight.timeout"),
        unknown_nodes_fit=_choice(
            preflight.get("unknown_nodes", "fit"), "preflight.unknown_nodes", ("fit", "unfit")
        )
        == "fit",
        open_reads=bool(api.get("open_reads", True)),
        assumed_node_mtbf_s=parse_duration(
            checkpoint.get("assumed_node_mtbf", "2000h"), "checkpoint.assumed_node_mtbf"
        ),
        min_failures=int(checkpoint.get("min_failures", 3)),
        refresh_interval_s=parse_duration(refresh.get("interval", "5s"), "refresh.interval"),
        source_timeout_s=parse_duration(refresh.get("source_timeout", "3s"), "refresh.source_timeout"),
        events_kept=int(refresh.get("events_kept", 10000)),
        dcgm_fields_interval_s=parse_duration(refresh.get("dcgm_fields", "1m"), "refresh.dcgm_fields"),
        reconcile_interval_s=parse_duration(refresh.get("reconcile", "5m"), "refresh.reconcile"),
        unknown_alert_grace_s=parse_duration(
            refresh.get("unknown_alert_grace", "2m"), "refresh.unknown_alert_grace"
        ),
        batch_s=parse_duration(refresh.get("batch", "0.2s"), "refresh.batch"),
        unobserved=_unobserved(raw.get("unobserved"), defaults.unobserved),
        scheduler_interval_s=parse_duration(refresh.get("scheduler", "30s"), "refresh.scheduler"),
    )


def load(path: Path = DEFAULT_POLICY) -> Policy:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise PolicyError(f"cannot read policy {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise PolicyError(f"policy {path} is not valid YAML: {exc}") from exc
    try:
        return from_dict(raw or {})
    except PolicyError as exc:
        raise PolicyError(f"policy {path}: {exc}") from exc
