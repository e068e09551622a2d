"""What each check's tool printed, judged: a :class:`Verdict` (passed, one-line summary, evidence).

Every parser takes the tool's raw text. Output that is empty, truncated, not the tool's format, or
holds a status word it does not know is a *failed* check whose summary says so, never an exception
and never a pass: a check that cannot read its evidence has not shown the node healthy."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from fleetsight.dcgm import names_of

HEAD = 400  # characters of unreadable output kept as evidence


@dataclass
class Verdict:
    passed: bool
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)


def unreadable(what: str, why: str, text: str) -> Verdict:
    return Verdict(False, f"{what}: unreadable output ({why})", {"output_head": text[:HEAD]})


# ---------------------------------------------------------------------------------- dcgmi diag -j
DIAG_ROOTS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")  # DCGM 4 (NvvsJsonStrings NVVS_NAME), DCGM 3
PASSING = {"pass", "warn", "skip", "not run"}  # skip/not run: the test does not apply to this node


def _json_document(text: str) -> dict[str, Any]:
    """dcgmi may print a line ("Successfully ran diagnostic for group.") before the JSON."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise ValueError("no JSON object")
    data = json.loads(text[start : end + 1])
    if not isinstance(data, dict):
        raise ValueError("the JSON is not an object")
    return data


def _diag_findings(root: dict[str, Any]) -> tuple[int, list[dict[str, Any]], list[str]]:
    """(tests seen, failures, unknown status words) over every category's tests."""
    tests, failures, unknown = 0, [], []
    for category in root.get("test_categories") or []:
        for test in category.get("tests") or []:
            tests += 1
            statuses = [(r, str(r.get("status", ""))) for r in test.get("results") or []]
            summary = str((test.get("test_summary") or {}).get("status", ""))
            for word in [s for _, s in statuses] + ([summary] if summary else []):
                if word.lower() not in PASSING | {"fail"}:
                    unknown.append(f"{test.get('name')}: {word!r}")
            for result, status in statuses:
                if status.lower() == "fail":
                    failures.append(_diag_failure(category, test, result))
            if summary.lower() == "fail" and not any(s.lower() == "fail" for _, s in statuses):
                failures.append({"category": category.get("category"), "test": test.get("name")})
    return tests, failures, unknown


def _diag_failure(category: dict[str, Any], test: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    warnings = result.get("warnings") or []
    return {
        "category": category.get("category"),
        "test": test.get("name"),
        "entity": f"{result.get('entity_group', 'GPU')} {result.get('entity_id', result.get('gpu_ids'))}",
        "error_ids": [w.get("error_id") for w in warnings if isinstance(w, dict)],
        "warnings": [str(w.get("warning", w)) if isinstance(w, dict) else str(w) for w in warnings][:5],
    }


def dcgm_diag(text: str, params: dict[str, Any]) -> Verdict:
    """`dcgmi diag -r N -j` (NVIDIA/DCGM testing/python3/dcgm_diag_schema.json)."""
    try:
        data = _json_document(text)
    except ValueError as exc:
        return unreadable("dcgmi diag", f"truncated or not JSON: {exc}", text)
    root_name = next((r for r in DIAG_ROOTS if isinstance(data.get(r), dict)), None)
    if root_name is None:
        return unreadable("dcgmi diag", f"no {DIAG_ROOTS[0]!r} object", text)
    root = data[root_name]
    meta = data.get("metadata") or {}
    evidence: dict[str, Any] = {"dcgm_version": meta.get("version") or root.get("version")}
    if root.get("runtime_error"):
        evidence["runtime_error"] = root["runtime_error"]
        return Verdict(False, f"dcgmi diag could not run: {root['runtime_error']}", evidence)
    tests, failures, unknown = _diag_findings(root)
    evidence.update(tests=tests, failures=failures)
    if unknown:
        evidence["unknown_status"] = unknown
        return Verdict(False, f"dcgmi diag: status words not understood: {', '.join(unknown[:3])}", evidence)
    if tests == 0:
        return Verdict(False, "dcgmi diag: no test results in the output", evidence)
    if failures:
        names = sorted({f"{f['test']} ({f.get('entity', 'summary')})" for f in failures})
        return Verdict(False, f"dcgmi diag failed: {', '.join(names[:4])}", evidence)
    return Verdict(True, f"dcgmi diag: {tests} tests passed", evidence)


# ---------------------------------------------------------------------------------- ib_write_bw
BW_HEADER = re.compile(r"BW average\[(Gb/sec|MB/sec)\]")


def ib_write_bw_gbits(text: str) -> float:
    """The average bandwidth of the largest message size, in Gb/s; ValueError when absent. perftest
    can print a warning line between the header and the figures ("Conflicting CPU frequency values
    detected"): only rows of numbers count."""
    header = BW_HEADER.search(text)
    if header is None:
        raise ValueError("no 'BW average[...]' header")
    rows = []
    for line in text[header.end() :].splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0].isdigit() and parts[1].isdigit():
            try:
                rows.append(float(parts[3]))
            except ValueError:
                continue
    if not rows or not math.isfinite(rows[-1]):
        raise ValueError("no result row after the header (truncated?)")
    value = rows[-1]
    return value if header.group(1) == "Gb/sec" else value * 8 / 1000  # MB/sec: 10^6 bytes


def ib_write_bw(text: str, params: dict[str, Any]) -> Verdict:
    try:
        gbits = ib_write_bw_gbits(text)
    except ValueError as exc:
        return unreadable("ib_write_bw", str(exc), text)
    limit = float(params.get("min_gbits", 0))
    evidence = {"gbits": round(gbits, 2), "min_gbits": limit}
    if gbits < limit:
        return Verdict(False, f"ib_write_bw {gbits:.1f} Gb/s < {limit:.0f}", evidence)
    return Verdict(True, f"ib_write_bw {gbits:.1f} Gb/s", evidence)


# ---------------------------------------------------------------------------------- FleetSight's probe
# One line per GPU, then a closing line, so that a probe killed half-way is told from a short one:
#   fleetsight-probe v1 test=gemm gpu=0 dtype=bf16 tflops=702.4 seconds=30.0
#   fleetsight-probe v1 test=hbm gpu=0 bytes_per_second=2.93e12 seconds=30.0
#   fleetsight-probe v1 done gpus=8
PROBE_PREFIX = "fleetsight-probe v1 "


def _probe_fields(line: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in line[len(PROBE_PREFIX) :].split() if "=" in item)


def probe_lines(text: str, params: dict[str, Any]) -> Verdict:
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
                values[fields["gpu"]] = float(fields[metric])
            except ValueError:
                return unreadable("probe", f"{metric}={fields[metric]!r} is not a number", text)
    wanted = _probe_fields(done[-1]).get("gpus", "")
    if not values or (wanted.isdigit() and len(values) != int(wanted)):
        return unreadable("probe", f"{len(values)} GPU results, the probe said {wanted or '?'}", text)
    slow = {gpu: v for gpu, v in values.items() if v < floor}
    evidence = {"metric": metric, "values": values, "expected": expected, "floor": floor}
    if slow:
        evidence["below_floor"] = slow
        worst = min(slow, key=slow.__getitem__)
        return Verdict(False, f"GPU {worst} {metric} {slow[worst]:.4g} < {floor:.4g}", evidence)
    return Verdict(True, f"{len(values)} GPUs >= {floor:.4g} {metric}", evidence)


# ---------------------------------------------------------------------------------- metric pages
def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of a Prometheus text page; ValueError when it is not one."""
    try:
        families = list(text_string_to_metric_families(text))
        return [(s.name, s.labels, s.value) for family in families for s in family.samples]
    except Exception as exc:  # the parser raises several types on bad text
        raise ValueError(f"not a Prometheus text page: {exc}") from exc


def _by_gpu(page: list[tuple[str, dict[str, str], float]], field_name: str) -> dict[str, float]:
    names = set(names_of(field_name))
    values: dict[str, float] = {}
    for name, labels, value in page:
        if name in names:  # either name of one field: the larger counts
            gpu = labels.get("gpu", "?")
            values[gpu] = max(value, values.get(gpu, value))
    return values


def row_remap(text: str, params: dict[str, Any]) -> Verdict:
    try:
        page = samples(text)
    except ValueError as exc:
        return unreadable("dcgm-exporter", str(exc), text)
    pending = _by_gpu(page, "DCGM_FI_DEV_ROW_REMAP_PENDING")
    failed = _by_gpu(page, "DCGM_FI_DEV_ROW_REMAP_FAILURE")
    rows = _by_gpu(page, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS")
    if not pending and not failed:
        return Verdict(False, "row remap fields are not published (counters file?)", {})
    evidence = {"pending": pending, "failed": failed, "uncorrectable_remapped_rows": rows}
    bad = sorted({g for g, v in pending.items() if v > 0} | {g for g, v in failed.items() if v > 0})
    if bad:
        return Verdict(False, f"row remap pending or failed on GPU {', '.join(bad)}", evidence)
    return Verdict(True, f"no pending or failed row remaps on {len(pending or failed)} GPUs", evidence)


def clock_events(text: str, params: dict[str, Any]) -> Verdict:
    try:
        page = samples(text)
    except ValueError as exc:
        return unreadable("dcgm-exporter", str(exc), text)
    reasons = _by_gpu(page, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
    if not reasons:
        return Verdict(False, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS is not published (counters file?)", {})
    bad_bits = {int(bit): str(name) for bit, name in (params.get("bad_bits") or {}).items()}
    found = {
        gpu: [name for bit, name in bad_bits.items() if int(value) // bit % 2 == 1]
        for gpu, value in reasons.items()
    }
    found = {gpu: names for gpu, names in found.items() if names}
    evidence = {"reasons": {g: int(v) for g, v in reasons.items()}, "bad": found}
    if found:
        gpu = sorted(found)[0]
        more = f" (and {len(found) - 1} more GPUs)" if len(found) > 1 else ""
        return Verdict(False, f"GPU {gpu}: {', '.join(found[gpu])}{more}", evidence)
    return Verdict(True, f"no slowdown reasons on {len(reasons)} GPUs", evidence)


def link_errors(before: str, after: str, params: dict[str, Any]) -> Verdict:
    try:
        first, second = samples(before), samples(after)
    except ValueError as exc:
        return unreadable("dcgm-exporter", str(exc), before + after)
    limits: dict[str, float] = {str(k): float(v) for k, v in (params.get("max_increase") or {}).items()}
    published, over, missing = {}, {}, []
    for field_name, limit in limits.items():
        old, new = _by_gpu(first, field_name), _by_gpu(second, field_name)
        if not new:
            missing.append(field_name)
            continue
        # a counter that went down was reset (driver reload): count from zero
        rise = {g: (v - old[g] if v >= old.get(g, 0.0) else v) for g, v in new.items()}
        published[field_name] = rise
        over.update({f"{field_name} GPU {g}": r for g, r in rise.items() if r > limit})
    evidence = {"increase": published, "not_published": missing, "limits": limits}
    if not published:
        return Verdict(False, "no NVLink/PCIe error counter is published (counters file?)", evidence)
    if over:
        first_key = sorted(over)[0]
        return Verdict(False, f"{first_key} rose by {over[first_key]:.0f} in the window", evidence)
    return Verdict(True, f"{len(published)} error counters steady over the window", evidence)


def h2d_bandwidth(text: str, params: dict[str, Any], now: float | None = None) -> Verdict:
    try:
        page = samples(text)
    except ValueError as exc:
        return unreadable("node agent", str(exc), text)
    now = time.time() if now is None else now
    values = {
        labels.get("gpu", "?"): value
        for name, labels, value in page
        if name == "fleetsight_pcie_host_to_device_bandwidth_bytes_per_second"
    }
    stamp_name = "fleetsight_pcie_host_to_device_bandwidth_timestamp_seconds"
    stamps = [v for name, _, v in page if name == stamp_name]
    if not values:
        return Verdict(False, "the node agent publishes no host-to-device bandwidth (probe off?)", {})
    age = now - max(stamps) if stamps else math.inf
    floor = float(params["min_bytes_per_second"])
    evidence = {"bytes_per_second": values, "age_seconds": round(age, 1), "floor": floor}
    if age > float(params["max_age_seconds"]):
        return Verdict(False, f"the last host-to-device measurement is {age:.0f} s old", evidence)
    slow = {g: v for g, v in values.items() if v < floor}
    if slow:
        gpu = min(slow, key=slow.__getitem__)
        summary = f"GPU {gpu} host-to-device {slow[gpu] / 1e9:.1f} GB/s < {floor / 1e9:.0f}"
        return Verdict(False, summary, evidence)
    return Verdict(True, f"{len(values)} GPUs >= {floor / 1e9:.0f} GB/s host-to-device", evidence)


ONE_SHOT: dict[str, Callable[[str, dict[str, Any]], Verdict]] = {
    "dcgm_diag": dcgm_diag,
    "ib_write_bw": ib_write_bw,
    "probe_lines": probe_lines,
    "row_remap": row_remap,
    "clock_events": clock_events,
    "h2d_bandwidth": h2d_bandwidth,
}
