"""Which twin faults the active checks catch that FleetSight's passive signals miss, on idle nodes.

    .venv/bin/python bench/checks_twin.py [--minutes 5]

One simulated cluster (8 idle nodes, no job: the nodes the intrusive checks run on), one fault per node
from minute 1. At ``--minutes`` the script reads, per node:
- passive: the node's dcgm-exporter page from the twin (twin/dcgm.py) judged as the GPU alerts judge it
  (power-brake/thermal bits, row remap pending/failed, an Xid), plus the other passive sources the twin
  records for the fault (kernel log, sysfs, UFM, BMC: the truth's effects);
- active: every check of the catalogue through the runner's parsers, with the twin's stand-ins
  (twin/checks.py) for dcgmi, the GPU probe and ib_write_bw, and the twin's dcgm page for the light ones.
Prints a Markdown table (docs/checks.md)."""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from checks import diag_parser, parsers
from checks.catalog import load_catalog
from checks.outcomes import Verdict
from fleetsight.dcgm import names_of
from twin import checks as twin_checks
from twin import dcgm
from twin.scenario import from_dict
from twin.sim import Simulation

FAULTS = [
    {"kind": "hbm_silent_corruption", "target": {"node": "n0001", "gpu": 2}},
    {"kind": "gray_slow_node", "target": {"node": "n0002"}, "magnitude": 1.4},
    {"kind": "pcie_downgrade", "target": {"node": "n0003", "gpu": 1}, "magnitude": 1},
    {"kind": "psu_failure", "target": {"node": "n0004", "psu": 2}, "magnitude": 150},
    {"kind": "hbm_row_remap", "target": {"node": "n0005", "gpu": 4}},
    {"kind": "ib_port_down", "target": {"node": "n0006", "port": 3}},
]
PASSIVE_SOURCES = ("kmsg", "sysfs", "ufm", "redfish", "bmc", "kernel")


def scenario() -> dict[str, Any]:
    faults = [{**f, "onset": "1m", "duration": "60m"} for f in FAULTS]
    return {
        "name": "checks_vs_passive",
        "seed": 36,
        "start": "2026-11-27T10:00:00Z",
        "duration": "70m",
        "tick": "5s",
        "cluster": {"name": "idle", "nodes": 8},
        "jobs": [],
        "faults": faults,
    }


def passive_gpu_signals(page: str) -> list[str]:
    seen = []
    samples = parsers.samples(page)
    for name, labels, value in samples:
        if name in names_of("DCGM_FI_DEV_CLOCKS_EVENT_REASONS") and (
            int(value) // 128 % 2 or int(value) // 64 % 2
        ):
            seen.append(f"{name}={int(value)} (power brake/thermal bit)")
        if (
            name in (*names_of("DCGM_FI_DEV_ROW_REMAP_PENDING"), *names_of("DCGM_FI_DEV_ROW_REMAP_FAILURE"))
            and value
        ):
            seen.append(f"{name}=1 (GPU {labels.get('gpu')})")
        if name in names_of("DCGM_FI_DEV_XID_ERRORS") and value:
            seen.append(f"Xid {labels.get('err_code', int(value))} (GPU {labels.get('gpu')})")
    return sorted(set(seen))


def active_results(node: str, page: str, faults: list[dict[str, Any]]) -> dict[str, Verdict]:
    catalog = load_catalog()
    out = {
        "row_remap": parsers.row_remap(page, catalog["row_remap"].params),
        "power_brake": parsers.clock_events(page, catalog["power_brake"].params),
    }
    for level in (1, 2, 3, 4):
        text = __import__("json").dumps(twin_checks.dcgmi_diag(level, faults))
        out[f"dcgm_diag_r{level}"] = diag_parser.dcgm_diag(text, {})
    for name, test in (("gemm_throughput", "gemm"), ("hbm_bandwidth", "hbm")):
        out[name] = parsers.probe_lines(twin_checks.gpu_probe(test, faults), catalog[name].params)
    ports = [
        parsers.ib_write_bw(twin_checks.ib_write_bw(f"mlx5_{p}", faults), {"min_gbits": 350})
        for p in range(8)
    ]
    bad = [f"mlx5_{p}" for p, v in enumerate(ports) if not v.passed]
    out["ib_pair_bandwidth"] = Verdict.judged(
        not bad, f"ports {', '.join(bad)} fail" if bad else "8 ports ok"
    )
    return out


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--minutes", type=float, default=5.0)
    args = options.parse_args()
    built = from_dict(scenario())
    sim = Simulation(built, built.start)
    for _ in range(int(args.minutes * 60 / built.tick)):
        sim.advance()
    rows = [
        "| fault (node) | passive signals seen | active checks that fail | caught only actively |",
        "|---|---|---|---|",
    ]
    effects = {f.spec.target.get("node"): f.effects for f in sim.faults if f.started}
    for fault in FAULTS:
        node = fault["target"]["node"]
        index = sim.node_index[node]
        page = dcgm.metrics(sim, index)
        passive = passive_gpu_signals(page)
        passive += [e["source"] for e in effects.get(node, []) if e["source"].startswith(PASSIVE_SOURCES)]
        faults = [{"kind": fault["kind"], **fault["target"], "magnitude": fault.get("magnitude", 1.3)}]
        failing = [n for n, v in active_results(node, page, faults).items() if not v.passed]
        only = "**yes**" if failing and not passive else "no"
        seen, caught = "; ".join(passive) or "none", ", ".join(failing) or "none"
        rows.append(f"| {fault['kind']} ({node}) | {seen} | {caught} | {only} |")
    print(f"twin at minute {args.minutes:g} after start (faults from minute 1), {dt.date.today()}:\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
