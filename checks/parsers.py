"""What each check's tool printed, judged: perftest's ``ib_write_bw``, FleetSight's GPU probe lines,
and the metric pages of dcgm-exporter and the node agent; ``ONE_SHOT`` names every parser of one output
(``dcgmi diag``'s is in checks/diag_parser.py). Each returns a :class:`~checks.outcomes.Verdict` and
never raises (checks/outcomes.py says why an unreadable output is an unknown, not a failure)."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from fleetsight.dcgm import names_of

from .diag_parser import dcgm_diag
from .outcomes import HEAD, Verdict, never_raises, unreadable

# ---------------------------------------------------------------------------------- ib_write_bw
BW_HEADER = re.compile(r"BW average\[(Gb/sec|MB/sec)\]")


def ib_write_bw_gbits(text: str) -> float:
    """The average bandwidth of the largest message size, in Gb/s; ValueError when absent. perftest
    can print a warning line between the header and the figures ("Conflicting CPU frequency values
    detected"): only rows of numbers count, and only rows with every column of the header (#bytes,
    #iterations, then one per bracketed unit), so that a row cut short is not read as a figure."""
    header = BW_HEADER.search(text)
    if header is None:
        raise ValueError("no 'BW average[...]' header")
    line_start = text.rfind("\n", 0, header.start()) + 1
    line_end = text.find("\n", header.end())
    header_line = text[line_start : len(text) if line_end < 0 else line_end]
    columns = max(4, header_line.count("#") + header_line.count("["))
    rows = []
    for line in text[header.end() :].splitlines():
        parts = line.split()
        if len(parts) >= columns and parts[0].isdigit() and parts[1].isdigit():
            try:
                rows.append(float(parts[3]))
            except ValueError:
                continue
    if not rows or not math.isfinite(rows[-1]):
        raise ValueError("no result row after the header (truncated?)")
    value = rows[-1]
    return value if header.group(1) == "Gb/sec" else value * 8 / 1000  # MB/sec: 10^6 bytes


# perftest's words when the TCP handshake (management network) worked but the RDMA queue pair could not
# be brought up over the InfiniBand link: the tool and the partner answered, the link did not. That is
# evidence against the link (a port down on either end), not a blind spot.
LINK_FAILURES = ("Unable to Connect the HCA's through the link", "to RTR")


@never_raises("ib_write_bw")
def ib_write_bw(text: str, params: dict[str, Any]) -> Verdict:
    try:
        gbits = ib_write_bw_gbits(text)
    except ValueError as exc:
        if BW_HEADER.search(text) is None and any(words in text for words in LINK_FAILURES):
            evidence = {"output_head": text[:HEAD]}
            return Verdict.judged(False, "ib_write_bw: the link did not come up (queue pair)", evidence)
        return unreadable("ib_write_bw", str(exc), text)
    limit = float(params.get("min_gbits", 0))
    evidence = {"gbits": round(gbits, 2), "min_gbits": limit}
    if gbits < limit:
        return Verdict.judged(False, f"ib_write_bw {gbits:.1f} Gb/s < {limit:.0f}", evidence)
    return Verdict.judged(True, f"ib_write_bw {gbits:.1f} Gb/s", evidence)


# ---------------------------------------------------------------------------------- FleetSight's probe
# One line per GPU, then a closing line, so that a probe killed half-way is told from a short one:
#   fleetsight-probe v1 test=gemm gpu=0 dtype=bf16 tflops=702.4 seconds=30.0
#   fleetsight-probe v1 test=hbm gpu=0 bytes_per_second=2.93e12 seconds=30.0
#   fleetsight-probe v1 done gpus=8
PROBE_PREFIX = "fleetsight-probe v1 "


def _probe_fields(line: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in line[len(PROBE_PREFIX) :].split() if "=" in item)


@never_raises("probe")
def probe_lines(text: str, params: dict[str, Any]) -> Verdict:
    """The probe's lines (checks/gpu_probe.py). No closing line (killed, truncated), a count that does
    not match it, or a figure that is not a finite number: unknown. A GPU under the floor: failed."""
    metric, expected = str(params["metric"]), float(params["expected"])
    floor = expected * float(params["min_ratio"])
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith(PROBE_PREFIX)]
    done = [line for line in lines if line.split()[2:3] == ["done"]]
    if not done:
        return unreadable("probe", "no closing 'done' line (killed or truncated)", text)
    values: dict[str, float] = {}
    for line in lines:
        fields = _probe_fields(line)
        if "gpu" in fields and metric in fields:
            try:
                value = float(fields[metric])
            except ValueError:
                value = math.nan
            if not math.isfinite(value):
                return unreadable("probe", f"{metric}={fields[metric]!r} is not a number", text)
            values[fields["gpu"]] = value
    wanted = _probe_fields(done[-1]).get("gpus", "")
    if not wanted.isdigit():
        return unreadable("probe", f"the closing line names no GPU count ({done[-1]!r})", text)
    if not values or len(values) != int(wanted):
        return unreadable("probe", f"{len(values)} GPU results, the probe said {wanted}", text)
    slow = {gpu: v for gpu, v in values.items() if v < floor}
    evidence = {"metric": metric, "values": values, "expected": expected, "floor": floor}
    if slow:
        evidence["below_floor"] = slow
        worst = min(slow, key=slow.__getitem__)
        return Verdict.judged(False, f"GPU {worst} {metric} {slow[worst]:.4g} < {floor:.4g}", evidence)
    return Verdict.judged(True, f"{len(values)} GPUs >= {floor:.4g} {metric}", evidence)


# ---------------------------------------------------------------------------------- metric pages
def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of a Prometheus text page; ValueError when it is not one."""
    try:
        families = list(text_string_to_metric_families(text))
        return [(s.name, s.labels, s.value) for family in families for s in family.samples]
    except Exception as exc:  # the parser raises several types on bad text
        raise ValueError(f"not a Prometheus text page: {exc}") from exc


def _page(text: str) -> list[tuple[str, dict[str, str], float]]:
    """A page a check can read: an empty answer is no page (unreadable), not a page without the fields."""
    if not text.strip():
        raise ValueError("empty page")
    return samples(text)


def _by_gpu(page: list[tuple[str, dict[str, str], float]], field_name: str) -> dict[str, float]:
    """The field's value per GPU; under either name of one field the larger counts, and a number over a
    NaN (a NaN stays only where it is all there is)."""
    names = set(names_of(field_name))
    values: dict[str, float] = {}
    for name, labels, value in page:
        if name in names:
            gpu = labels.get("gpu", "?")
            old = values.get(gpu)
            if old is None or (math.isfinite(value) and (not math.isfinite(old) or value > old)):
                values[gpu] = value
    return values


def _not_numbers(*fields: dict[str, float]) -> list[str]:
    return sorted({gpu for values in fields for gpu, v in values.items() if not math.isfinite(v)})


def _shown(values: dict[str, float]) -> dict[str, float | None]:
    """Values as evidence (posted as JSON): a NaN or an infinity as null."""
    return {key: v if math.isfinite(v) else None for key, v in values.items()}


@never_raises("dcgm-exporter")
def row_remap(text: str, params: dict[str, Any]) -> Verdict:
    try:
        page = _page(text)
    except ValueError as exc:
        return unreadable("dcgm-exporter", str(exc), text)
    pending = _by_gpu(page, "DCGM_FI_DEV_ROW_REMAP_PENDING")
    failed = _by_gpu(page, "DCGM_FI_DEV_ROW_REMAP_FAILURE")
    rows = _by_gpu(page, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS")
    if not pending and not failed:
        return Verdict.blind("not_published", "row remap fields are not published (counters file?)")
    evidence = {
        "pending": _shown(pending),
        "failed": _shown(failed),
        "uncorrectable_remapped_rows": _shown(rows),
    }
    bad = sorted({g for g, v in pending.items() if v > 0} | {g for g, v in failed.items() if v > 0})
    if bad:
        return Verdict.judged(False, f"row remap pending or failed on GPU {', '.join(bad)}", evidence)
    if nan := _not_numbers(pending, failed):
        return unreadable("dcgm-exporter", f"row remap value not a number on GPU {', '.join(nan)}", text)
    return Verdict.judged(True, f"no pending or failed row remaps on {len(pending or failed)} GPUs", evidence)


@never_raises("dcgm-exporter")
def clock_events(text: str, params: dict[str, Any]) -> Verdict:
    try:
        page = _page(text)
    except ValueError as exc:
        return unreadable("dcgm-exporter", str(exc), text)
    reasons = _by_gpu(page, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
    if not reasons:
        return Verdict.blind(
            "not_published", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS is not published (counters file?)"
        )
    bad_bits = {int(bit): str(name) for bit, name in (params.get("bad_bits") or {}).items() if int(bit) > 0}
    readable = {gpu: int(value) for gpu, value in reasons.items() if math.isfinite(value)}
    found = {
        gpu: [name for bit, name in bad_bits.items() if value // bit % 2 == 1]
        for gpu, value in readable.items()
    }
    found = {gpu: names for gpu, names in found.items() if names}
    evidence = {"reasons": readable, "bad": found}
    if found:
        gpu = sorted(found)[0]
        more = f" (and {len(found) - 1} more GPUs)" if len(found) > 1 else ""
        return Verdict.judged(False, f"GPU {gpu}: {', '.join(found[gpu])}{more}", evidence)
    if nan := _not_numbers(reasons):
        return unreadable("dcgm-exporter", f"clock event reasons not a number on GPU {', '.join(nan)}", text)
    return Verdict.judged(True, f"no slowdown reasons on {len(reasons)} GPUs", evidence)


def _rise(old: float, new: float) -> float:
    if not math.isfinite(old):
        return math.nan
    return new - old if new >= old else new


@never_raises("dcgm-exporter")
def link_errors(before: str, after: str, params: dict[str, Any]) -> Verdict:
    try:
        first, second = _page(before), _page(after)
    except ValueError as exc:
        return unreadable("dcgm-exporter", str(exc), before + after)
    limits: dict[str, float] = {str(k): float(v) for k, v in (params.get("max_increase") or {}).items()}
    published, over, missing, nan = {}, {}, [], []
    for field_name, limit in limits.items():
        old, new = _by_gpu(first, field_name), _by_gpu(second, field_name)
        if not new:
            missing.append(field_name)
            continue
        # a counter that went down was reset (driver reload): count from zero; a GPU without a finite
        # first value has no window (NaN: unreadable, unless another counter rose)
        rise = {g: _rise(old.get(g, math.nan), v) for g, v in new.items()}
        published[field_name] = rise
        over.update({f"{field_name} GPU {g}": r for g, r in rise.items() if r > limit})
        nan += [f"{field_name} GPU {g}" for g, r in rise.items() if not math.isfinite(r)]
    evidence = {
        "increase": {k: _shown(v) for k, v in published.items()},
        "not_published": missing,
        "limits": limits,
    }
    if not published:
        return Verdict.blind(
            "not_published", "no NVLink/PCIe error counter is published (counters file?)", evidence
        )
    if over:
        first_key = sorted(over)[0]
        return Verdict.judged(False, f"{first_key} rose by {over[first_key]:.0f} in the window", evidence)
    if nan:
        return unreadable("dcgm-exporter", f"not a number: {', '.join(nan[:3])}", before + after)
    return Verdict.judged(True, f"{len(published)} error counters steady over the window", evidence)


@never_raises("node agent")
def h2d_bandwidth(text: str, params: dict[str, Any], now: float | None = None) -> Verdict:
    try:
        page = _page(text)
    except ValueError as exc:
        return unreadable("node agent", str(exc), text)
    now = time.time() if now is None else now
    values = {
        labels.get("gpu", "?"): value
        for name, labels, value in page
        if name == "fleetsight_pcie_host_to_device_bandwidth_bytes_per_second"
    }
    stamp_name = "fleetsight_pcie_host_to_device_bandwidth_timestamp_seconds"
    stamps = [v for name, _, v in page if name == stamp_name and math.isfinite(v)]
    if not values:
        return Verdict.blind(
            "not_published", "the node agent publishes no host-to-device bandwidth (probe off?)"
        )
    age = now - max(stamps) if stamps else math.inf
    floor = float(params["min_bytes_per_second"])
    evidence = {
        "bytes_per_second": _shown(values),
        "age_seconds": round(age, 1) if math.isfinite(age) else None,
        "floor": floor,
    }
    if not age <= float(params["max_age_seconds"]):
        return Verdict.blind(
            "not_published", f"the last host-to-device measurement is {age:.0f} s old", evidence
        )
    slow = {g: v for g, v in values.items() if v < floor}
    if slow:
        gpu = min(slow, key=slow.__getitem__)
        summary = f"GPU {gpu} host-to-device {slow[gpu] / 1e9:.1f} GB/s < {floor / 1e9:.0f}"
        return Verdict.judged(False, summary, evidence)
    if nan := _not_numbers(values):
        return unreadable(
            "node agent", f"host-to-device bandwidth not a number on GPU {', '.join(nan)}", text
        )
    return Verdict.judged(True, f"{len(values)} GPUs >= {floor / 1e9:.0f} GB/s host-to-device", evidence)


ONE_SHOT: dict[str, Callable[[str, dict[str, Any]], Verdict]] = {
    "dcgm_diag": dcgm_diag,
    "ib_write_bw": ib_write_bw,
    "probe_lines": probe_lines,
    "row_remap": row_remap,
    "clock_events": clock_events,
    "h2d_bandwidth": h2d_bandwidth,
}
