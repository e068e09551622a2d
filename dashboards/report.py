"""The executive report: KPIs of a period from Prometheus/Thanos, with their trend, as HTML and JSON.

Failures are read from what dcgm-exporter publishes on every cluster, node by node, minute by
minute: a GPU that reports an Xid (classified with the shared Xid catalogue) or vanishes, a power
brake (throttle bit 128), thermal throttling (bits 32 and 64), HBM rows waiting for a remap, and a
node whose GPUs all vanish (the host is down). Where the node agent's series exist, network (IB
ports down), storage (Lustre RPC waits far above normal) and NVSwitch (a fatal SXid, until the
node reboots) failures are added; otherwise the report says network and storage were not
measured. An episode is a run of consecutive minutes in one state; the node is unfit for work
during it.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from fleetsight.dcgm import promql_selector_any
from fleetsight.prometheus import Prometheus, PrometheusError, PrometheusQueryError
from fleetsight.xid_catalog import lookup

STEP_S = 60
MIN_COVERAGE = 0.5  # a period with less data than this is not compared against
MIN_EPISODE_S = 180  # shorter runs are noise (a throttle blip, a missed scrape), not failures
CLOCK_EVENTS = promql_selector_any("DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
# Fire-Flyer's taxonomy: GPU (by Xid class), network, storage, host, power.
SIGNALS: dict[str, str] = {
    # dcgm-exporter 3.x: the last Xid; 4.x: one series per code (err_code="0", value 0, without one).
    # In 4.x a reset GPU's code series stops and the err_code="0" one returns: read the last minute's
    # samples only, or the stopped series would live on for the 5-minute lookback (as "present" below).
    "xid": f"max by (node) (last_over_time({promql_selector_any('DCGM_FI_DEV_XID_ERRORS')}[1m]))",
    # The clock-event reasons under either name (the counters file decides); max by (node) first, so
    # a GPU under both names is one series before the bit arithmetic.
    "power": f"max by (node) (floor(max by (node, gpu) ({CLOCK_EVENTS}) / 128) % 2)",
    "thermal": f"max by (node) ((floor(max by (node, gpu) ({CLOCK_EVENTS}) / 32) % 2"
    f" + floor(max by (node, gpu) ({CLOCK_EVENTS}) / 64) % 2) > bool 0)",
    "row_remap": "max by (node) (DCGM_FI_DEV_ROW_REMAP_PENDING > bool 0)",
    # One count per GPU: with hpc_job on the series, a job change briefly shows two series per GPU.
    # Samples of the last minute, not the latest one: a series that stops without a staleness marker
    # (backfilled history, a Thanos store) would otherwise live on for the 5-minute lookback, and a
    # crashed host would show up 5 minutes late and 5 minutes short.
    "present": "count by (node) (count by (node, gpu) (count_over_time(DCGM_FI_DEV_POWER_USAGE[1m])))",
    "network": "max by (node) (fleetsight_infiniband_port_up == bool 0)",
    "storage": "max by (node) (rate(fleetsight_lustre_client_rpc_wait_seconds_total[5m])"
    " / rate(fleetsight_lustre_client_rpc_requests_total[5m]) > bool 1)",
}
# An NVSwitch fatal SXid (node agent, from the kernel log) leaves the node's NVLink fabric down until
# the node reboots; the reboot shows as its IB counters starting again from zero.
NVSWITCH_FATAL = 'max by (node) (fleetsight_nvswitch_sxid_errors_total{severity="fatal"})'
REBOOTS = "max by (node) (resets(fleetsight_infiniband_port_xmit_data_bytes_total[2m]))"
SERIES = {
    "utilization": "avg(DCGM_FI_DEV_GPU_UTIL) / 100",
    "power_watts": "sum(DCGM_FI_DEV_POWER_USAGE)",
    "tensor_active": "avg(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)",
}


class ReportError(RuntimeError):
    """Prometheus refused a query or holds no data for the period."""


@dataclass
class Episode:
    node: str
    category: str
    detail: str
    start: float
    end: float

    @property
    def hours(self) -> float:
        return (self.end - self.start) / 3600


@dataclass
class Period:
    start: float
    end: float
    node_hours: float = 0.0
    unfit_node_hours: float = 0.0
    episodes: list[Episode] = field(default_factory=list)
    measured: list[str] = field(default_factory=list)
    utilization: float = 0.0
    energy_kwh: float = 0.0
    effective_training_ratio: float = 0.0
    timeline: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    @property
    def availability(self) -> float:
        return 1 - self.unfit_node_hours / self.node_hours if self.node_hours else 0.0

    @property
    def mtbf_hours(self) -> float | None:
        return self.node_hours / len(self.episodes) if self.episodes else None

    @property
    def mttr_hours(self) -> float | None:
        return sum(e.hours for e in self.episodes) / len(self.episodes) if self.episodes else None


def query_range(prom: Prometheus, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    """The expression's series over the period, a point a minute; any failure is the report's error (its
    command line says it as it is)."""
    try:
        return prom.query_range(expr, start, end, STEP_S)
    except PrometheusQueryError as exc:
        raise ReportError(f"Prometheus refused {expr!r}: {exc.error}") from exc
    except PrometheusError as exc:
        raise ReportError(str(exc)) from exc


def node_minutes(prom: Prometheus, expr: str, start: float, end: float) -> dict[str, dict[float, float]]:
    """node -> {minute: value} for a per-node expression."""
    return {
        series["metric"].get("node", ""): {float(t): float(v) for t, v in series["values"]}
        for series in query_range(prom, expr, start, end)
    }


def classify(signal: str, value: float) -> tuple[str, str] | None:
    """(category, detail) of one node-minute's signal value, or None when healthy."""
    if value <= 0:
        return None
    if signal == "xid":
        info = lookup(int(value))
        if info.action in ("none", "restart_app"):
            return None  # the application's fault, not the GPU's: the node stays fit for work
        return "gpu", f"Xid {int(value)} ({info.category})"
    return {
        "power": ("power", "power brake"),
        "thermal": ("gpu", "thermal throttling"),
        "row_remap": ("gpu", "HBM row remap pending"),
        "network": ("network", "InfiniBand port down"),
        "storage": ("storage", "Lustre RPC wait > 1 s"),
    }[signal]


def episodes_of(states: dict[str, dict[float, tuple[str, str] | None]]) -> list[Episode]:
    """Consecutive minutes of one node in the same (category, detail) state, as episodes."""
    found = []
    for node, minutes in states.items():
        current: Episode | None = None
        for minute in sorted(minutes):
            state = minutes[minute]
            if current and (state is None or (current.category, current.detail) != state):
                found.append(current)
                current = None
            if state and current is None:
                current = Episode(node, state[0], state[1], minute, minute + STEP_S)
            elif state and current:
                current.end = minute + STEP_S
        if current:
            found.append(current)
    return [episode for episode in found if episode.end - episode.start >= MIN_EPISODE_S]


def measure(prom: Prometheus, start: float, end: float) -> Period:
    period = Period(start, end)
    present = node_minutes(prom, SIGNALS["present"], start, end)
    if not present:
        raise ReportError(f"no dcgm-exporter series between {iso(start)} and {iso(end)}")
    minutes = sorted({m for per_node in present.values() for m in per_node})
    expected = (end - start) / STEP_S
    if len(minutes) < MIN_COVERAGE * expected:
        raise ReportError(
            f"metrics cover only {len(minutes)} of {expected:.0f} minutes between {iso(start)} and {iso(end)}"
        )
    states: dict[str, dict[float, tuple[str, str] | None]] = {
        node: dict.fromkeys(minutes) for node in present
    }
    for node, per_node in states.items():
        usual = max(present[node].values())
        for minute in minutes:
            if minute not in present[node]:
                per_node[minute] = ("host", "node down (no GPU metrics)")
            elif present[node][minute] < usual:  # a GPU that vanished from the bus takes its series along
                per_node[minute] = ("gpu", "GPU missing (fallen off the bus?)")
    for signal, expr in SIGNALS.items():
        if signal == "present":
            continue
        values = node_minutes(prom, expr, start, end)
        if values:
            period.measured.append(signal)
        for node, per_node in values.items():
            for minute, value in per_node.items():
                state = classify(signal, value)
                if state and node in states and states[node].get(minute) is None:
                    states[node][minute] = state
    for node, down in nvswitch_down(prom, start, end).items():
        for minute in down:
            if minute in states.get(node, {}) and states[node][minute] is None:
                states[node][minute] = ("gpu", "NVSwitch fatal SXid (until reboot)")
    period.episodes = episodes_of(states)
    period.node_hours = len(states) * len(minutes) * STEP_S / 3600
    period.unfit_node_hours = sum(e.hours for e in period.episodes)
    add_usage(prom, period)
    return period


def nvswitch_down(prom: Prometheus, start: float, end: float) -> dict[str, list[float]]:
    """node -> minutes from a fatal SXid to the node's next reboot. The counter appears with its
    first event: a series there from the period's first minute is an older event, not counted."""
    fatal = node_minutes(prom, NVSWITCH_FATAL, start, end)
    reboots = node_minutes(prom, REBOOTS, start, end) if fatal else {}
    down: dict[str, list[float]] = {}
    for node, values in fatal.items():
        previous: float | None = None
        failing = False
        for minute in sorted(values):
            value = values[minute]
            # Before its first sample the counter was 0, unless it was already there when the period began.
            before = previous if previous is not None else (value if minute <= start else 0.0)
            if value > before:
                failing = True
            elif failing and reboots.get(node, {}).get(minute, 0) > 0:
                failing = False
            if failing:
                down.setdefault(node, []).append(minute)
            previous = value
    return down


def add_usage(prom: Prometheus, period: Period) -> None:
    for name, expr in SERIES.items():
        result = query_range(prom, expr, period.start, period.end)
        period.timeline[name] = [(float(t), float(v)) for t, v in result[0]["values"]] if result else []
    utilization = [v for _, v in period.timeline["utilization"]]
    period.utilization = sum(utilization) / len(utilization) if utilization else 0.0
    period.energy_kwh = sum(v for _, v in period.timeline["power_watts"]) * STEP_S / 3600 / 1000
    # Productive minutes: the fleet's tensor activity within half of its usual level; checkpoints,
    # stalls, restarts and failures fall below.
    tensor = sorted(v for _, v in period.timeline["tensor_active"])
    if tensor:
        usual = tensor[len(tensor) // 2]
        period.effective_training_ratio = sum(v >= usual / 2 for v in tensor) / len(tensor)


@dataclass(frozen=True)
class Figure:
    key: str
    title: str
    value: float | None
    previous: float | None
    unit: str
    meaning: str

    def trend(self) -> str:
        if self.value is None or self.previous is None:
            return "no earlier period to compare"
        delta = self.value - self.previous
        return f"{'up' if delta > 0 else 'down' if delta < 0 else 'flat'} {fmt(abs(delta), self.unit)}"


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "ratio":
        return f"{100 * value:.1f} %"
    if unit == "":
        return f"{value:,.0f}"
    if unit == "currency":
        return f"{value:,.0f}"
    return f"{value:,.1f} {unit}".strip()


def figures(now: Period, before: Period | None, price_per_kwh: float) -> list[Figure]:
    def prev(getter: Callable[[Period], float | None]) -> float | None:
        return getter(before) if before else None

    failures = len(now.episodes)
    return [
        Figure("availability", "Availability", now.availability, prev(lambda p: p.availability), "ratio",
               "Share of node-hours in which a node was fit for work (no failure signal)."),
        Figure("failures", "Failures", failures, prev(lambda p: len(p.episodes)), "",
               "Distinct failure episodes on all nodes, each a run of minutes in one failure state."),
        Figure("mtbf_hours", "Mean time between failures", now.mtbf_hours, prev(lambda p: p.mtbf_hours),
               "node-hours", "Node-hours of operation per failure: how long a node runs before one."),
        Figure("mttr_hours", "Mean time to repair", now.mttr_hours, prev(lambda p: p.mttr_hours), "h",
               "How long a failure keeps its node out of work, on average."),
        Figure("gpu_utilization", "GPU utilization", now.utilization, prev(lambda p: p.utilization), "ratio",
               "Average DCGM GPU utilization over all GPUs (NCCL waits count as busy)."),
        Figure("effective_training_ratio", "Effective training time", now.effective_training_ratio,
               prev(lambda p: p.effective_training_ratio), "ratio",
               "Share of minutes the fleet's tensor cores worked at their usual level (not stalled, "
               "checkpointing or failed)."),
        Figure("energy_kwh", "Energy (GPUs)", now.energy_kwh, prev(lambda p: p.energy_kwh), "kWh",
               "Energy drawn by the GPUs over the period."),
        Figure("energy_cost", "Energy cost", now.energy_kwh * price_per_kwh,
               prev(lambda p: p.energy_kwh * price_per_kwh), "currency",
               f"GPU energy at {price_per_kwh} per kWh."),
    ]  # fmt: skip


def top_nodes(period: Period, count: int = 10) -> list[dict[str, Any]]:
    lost: dict[str, float] = defaultdict(float)
    causes: dict[str, Counter[str]] = defaultdict(Counter)
    for episode in period.episodes:
        lost[episode.node] += episode.hours
        causes[episode.node][episode.detail] += 1
    ranked = sorted(lost.items(), key=lambda item: -item[1])[:count]
    return [
        {"node": node, "hours_lost": round(hours, 2), "causes": dict(causes[node])} for node, hours in ranked
    ]


def taxonomy(period: Period) -> dict[str, int]:
    counts = Counter(e.category for e in period.episodes)
    return {category: counts.get(category, 0) for category in ("gpu", "network", "storage", "host", "power")}


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def build_report(
    prometheus_url: str, start: float, end: float, price_per_kwh: float = 0.12
) -> dict[str, Any]:
    """The report's figures as JSON-ready data (also what the HTML shows)."""
    with Prometheus(prometheus_url, timeout=60) as prom:
        now = measure(prom, start, end)
        try:
            before: Period | None = measure(prom, 2 * start - end, start)
        except ReportError:
            before = None
    return {
        "period": {"from": iso(start), "to": iso(end), "start": start, "end": end},
        "figures": [{**asdict(f), "trend": f.trend()} for f in figures(now, before, price_per_kwh)],
        "failures_by_category": taxonomy(now),
        "categories_measured": sorted({"gpu", "power", "host"} | set(now.measured) & {"network", "storage"}),
        "top_nodes": top_nodes(now),
        "episodes": [asdict(e) for e in now.episodes],
        "node_hours": now.node_hours,
        "_period": now,
    }


def png(draw: Callable[[Any], None], width: float = 7.5, height: float = 2.8) -> str:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    fig, axis = pyplot.subplots(figsize=(width, height), dpi=110)
    draw(axis)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    pyplot.close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


def hours_axis(points: list[tuple[float, float]], start: float) -> list[float]:
    return [(t - start) / 3600 for t, _ in points]


def plots(report: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Plot name -> (base64 PNG, one sentence on what it shows)."""
    period: Period = report["_period"]
    start = period.start

    def timeline(name: str, label: str, scale: float = 1.0) -> Callable[[Any], None]:
        def draw(axis: Any) -> None:
            points = period.timeline[name]
            axis.plot(hours_axis(points, start), [v * scale for _, v in points], color="#2b6cb0")
            axis.set_xlabel("hours since the start of the period")
            axis.set_ylabel(label)
            axis.grid(alpha=0.3)

        return draw

    def failures(axis: Any) -> None:
        counts = report["failures_by_category"]
        axis.bar(list(counts), list(counts.values()), color="#c05621")
        axis.set_ylabel("failure episodes")

    def nodes(axis: Any) -> None:
        top = report["top_nodes"][::-1]
        axis.barh([t["node"] for t in top], [t["hours_lost"] for t in top], color="#9b2c2c")
        axis.set_xlabel("node-hours unfit for work")

    def unfit(axis: Any) -> None:
        hours = max(1, round((period.end - period.start) / 3600))
        buckets = [0.0] * hours
        for episode in period.episodes:
            t = episode.start
            while t < episode.end:
                index = min(hours - 1, int((t - start) // 3600))
                buckets[index] += STEP_S / 3600
                t += STEP_S
        nodes_count = period.node_hours / hours if hours else 1
        shares = [1 - b / nodes_count for b in buckets]
        axis.plot(range(hours), shares, color="#2f855a", marker=".")
        # Zoomed to the dips: on a 0..1 axis a fleet at 99.7 % is a flat line.
        axis.set_ylim(max(0.0, min(shares) - 0.01), 1.002)
        axis.yaxis.set_major_formatter(lambda value, _pos: f"{100 * value:.1f} %")
        axis.set_xlabel("hour of the period")
        axis.set_ylabel("availability")
        axis.grid(alpha=0.3)

    return {
        "availability": (png(unfit), "Hour by hour, the share of nodes fit for work; dips are failures."),
        "failures": (png(failures), "Failure episodes by category (Fire-Flyer's taxonomy)."),
        "top_nodes": (png(nodes), "The ten nodes that were out of work the longest: candidates for repair."),
        "utilization": (png(timeline("utilization", "GPU utilization %", 100)),
                        "Average GPU utilization; troughs are checkpoints, stalls and idle nodes."),
        "power": (png(timeline("power_watts", "GPU power kW", 1 / 1000)),
                  "Power drawn by all GPUs; it follows the work."),
    }  # fmt: skip


def render_html(report: dict[str, Any]) -> str:
    cards = "".join(
        f"<div class='card'><div class='t'>{html.escape(f['title'])}</div>"
        f"<div class='v'>{fmt(f['value'], f['unit'])}</div><div class='d'>{html.escape(f['trend'])}</div>"
        f"<div class='m'>{html.escape(f['meaning'])}</div></div>"
        for f in report["figures"]
    )
    figures_html = "".join(
        f"<figure><img alt='{name}' src='data:image/png;base64,{image}'><figcaption>{html.escape(text)}"
        "</figcaption></figure>"
        for name, (image, text) in plots(report).items()
    )
    rows = "".join(
        f"<tr><td>{html.escape(t['node'])}</td><td>{t['hours_lost']}</td>"
        f"<td>{html.escape(', '.join(f'{k} x{v}' for k, v in t['causes'].items()))}</td></tr>"
        for t in report["top_nodes"]
    )
    measured = ", ".join(report["categories_measured"])
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>FleetSight report {report["period"]["from"]}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #1a202c; max-width: 1100px; }}
.cards {{ display: grid; grid-template-columns: repeat(4, 1fr); gap: 12px; }}
.card {{ border: 1px solid #cbd5e0; border-radius: 6px; padding: 10px; }}
.t {{ font-size: 0.85em; color: #4a5568; }} .v {{ font-size: 1.6em; font-weight: bold; }}
.d {{ font-size: 0.8em; color: #2b6cb0; }} .m {{ font-size: 0.75em; color: #4a5568; margin-top: 4px; }}
figure {{ display: inline-block; margin: 10px; }} figcaption {{ font-size: 0.85em; color: #4a5568; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #cbd5e0; padding: 4px 8px; }}
</style></head><body>
<h1>FleetSight: fleet report</h1>
<p>{report["period"]["from"]} to {report["period"]["to"]}; {report["node_hours"]:.0f} node-hours.
Failure categories measured: {measured}.</p>
<div class="cards">{cards}</div>
<h2>Plots</h2>{figures_html}
<h2>Nodes that cost the most time</h2>
<table><tr><th>node</th><th>node-hours lost</th><th>causes</th></tr>{rows}</table>
</body></html>
"""


def slack_summary(report: dict[str, Any]) -> str:
    lines = [f"*FleetSight report* {report['period']['from']} to {report['period']['to']}"]
    for figure in report["figures"]:
        lines.append(f"- {figure['title']}: {fmt(figure['value'], figure['unit'])} ({figure['trend']})")
    if report["top_nodes"]:
        worst = report["top_nodes"][0]
        lines.append(f"- Costliest node: {worst['node']} ({worst['hours_lost']} node-hours)")
    return "\n".join(lines)


def public(report: dict[str, Any]) -> dict[str, Any]:
    """The report without its in-memory parts, for JSON."""
    return {key: value for key, value in report.items() if not key.startswith("_")}
