"""The fabric's gray failures scored as a classification: for each fabric fault of an `evaluate alerts`
run, which kind the alerts that fired on its node(s) say it is, against the kind the twin injected; the
confusion table, per-kind precision/recall/F1 and their macro average; and for every flash cut the time
from the cut (the truth's ``cuts``) to an InfiniBandFlashCut alert firing on its port.

A fault's label is the kind of the fabric alerts that fired for it: its own kind when only its own
alerts fired (EXPECTED_BY_KIND), the other kind whose alert fired first otherwise, ``none`` when none
fired. Congestion has no alert of its own: it is classified right when no fabric alert fires on any host
behind the congested leaf (a page for a victim is a misclassification).

Usage (after ``fleetsight evaluate alerts ... --json > results.json``)::

    .venv/bin/python -m evaluation.fabric_confusion results.json [more.json ...]

The truth is re-simulated from each scenario's file (the twin is deterministic from its seed), found by
name among ``evaluation/scenarios/fabric/`` and ``alerts/`` unless ``--scenarios DIR`` says where. The
loud port kinds (ib_link_flap, ib_port_down) count as classes too when a run has them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .alert_scoring import AFTER_END_GRACE_S, EXPECTED_BY_KIND

FABRIC_KINDS = ("ib_flash_cut", "ib_lane_downshift", "ib_degrading_link", "ib_congestion")
# The loud port kinds, scored as classes too when a run has them: a flap must not read as a flash cut.
LOOKALIKE_KINDS = ("ib_link_flap", "ib_port_down")
# The kind each fabric alert stands for (the kind whose own alert it is).
ALERT_KIND = {
    "InfiniBandFlashCut": "ib_flash_cut",
    "InfiniBandPortRateDegraded": "ib_lane_downshift",
    "InfiniBandSymbolErrors": "ib_degrading_link",
    "InfiniBandLinkFlapping": "ib_link_flap",
    "InfiniBandPortDown": "ib_port_down",
}
CUT_WINDOW_S = 60.0  # the target: every flash cut found within a minute
SCENARIO_DIRS = (
    Path(__file__).resolve().parent / "scenarios" / "fabric",
    Path(__file__).resolve().parent / "scenarios" / "alerts",
)


@dataclass
class FabricFault:
    id: str
    kind: str
    nodes: list[str]
    port: str
    onset: float
    end: float
    cuts: list[list[float]] = field(default_factory=list)


def _unix(iso: str) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def label(fault: FabricFault, episodes: list[dict[str, Any]]) -> str:
    """The kind the fabric alerts that fired on the fault's hosts during it say it is."""
    own = set(EXPECTED_BY_KIND.get(fault.kind, ()))
    fired = sorted(
        (_unix(e["start"]), e["alertname"])
        for e in episodes
        if e["alertname"] in ALERT_KIND
        and e["labels"].get("node") in fault.nodes
        and _unix(e["start"]) <= fault.end + AFTER_END_GRACE_S
        and _unix(e["end"]) >= fault.onset
    )
    others = [name for _, name in fired if name not in own]
    if others:
        return ALERT_KIND[others[0]]
    if fired:
        return fault.kind
    return "ib_congestion" if fault.kind == "ib_congestion" else "none"


def cut_delays(fault: FabricFault, episodes: list[dict[str, Any]]) -> list[float | None]:
    """Per cut: seconds from the cut to an InfiniBandFlashCut on its port firing (0 when one already
    fired for an earlier cut), None when none fired within 5 minutes of it."""
    device = fault.port
    spans = [
        (_unix(e["start"]), _unix(e["end"]))
        for e in episodes
        if e["alertname"] == "InfiniBandFlashCut"
        and e["labels"].get("node") in fault.nodes
        and e["labels"].get("device") in (None, device)
    ]
    delays: list[float | None] = []
    for at, _length in fault.cuts:
        hits = [max(0.0, start - at) for start, end in spans if end >= at and start <= at + 300.0]
        delays.append(min(hits) if hits else None)
    return delays


def lead_s(fault: FabricFault, episodes: list[dict[str, Any]]) -> float | None:
    """A degrading link's warning: seconds from the first InfiniBandSymbolErrors on its port to the failure
    (the fault's end); None when none fired before it."""
    starts = [
        _unix(e["start"])
        for e in episodes
        if e["alertname"] == "InfiniBandSymbolErrors"
        and e["labels"].get("node") in fault.nodes
        and e["labels"].get("device") in (None, fault.port)
        and fault.onset <= _unix(e["start"]) <= fault.end
    ]
    return fault.end - min(starts) if starts else None


def scores(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """Confusion counts, per-kind precision/recall/F1 and the macro F1 over the kinds present."""
    confusion: dict[str, dict[str, int]] = {}
    for truth, predicted in pairs:
        row = confusion.setdefault(truth, {})
        row[predicted] = row.get(predicted, 0) + 1
    per_kind = {}
    for kind in (*FABRIC_KINDS, *LOOKALIKE_KINDS):
        tp = sum(1 for t, p in pairs if t == kind and p == kind)
        fp = sum(1 for t, p in pairs if t != kind and p == kind)
        fn = sum(1 for t, p in pairs if t == kind and p != kind)
        if tp + fp + fn == 0:
            continue  # a kind absent from the runs and never predicted: no score either way
        precision = tp / (tp + fp) if tp + fp else 0.0
        recall = tp / (tp + fn) if tp + fn else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_kind[kind] = {"precision": precision, "recall": recall, "f1": f1, "support": tp + fn}
    macro = sum(k["f1"] for k in per_kind.values()) / len(per_kind) if per_kind else None
    return {"confusion": confusion, "per_kind": per_kind, "macro_f1": macro}


def simulated_truth(scenario_file: Path) -> list[FabricFault]:
    """The scenario's fabric faults, with the times of each flash cut, from a run of the twin."""
    from twin.scenario import load  # the twin only where a truth must be re-made
    from twin.sim import Simulation

    scenario = load(scenario_file)
    sim = Simulation(scenario, scenario.start)
    while sim.t < scenario.duration:
        sim.advance()
    sim.refresh_truth()
    faults = []
    for line in sim.truth_lines:
        if line["benign"] or line["kind"] not in (*FABRIC_KINDS, *LOOKALIKE_KINDS):
            continue
        target = line["target"]
        nodes = line.get("nodes") if line["kind"] == "ib_congestion" else [target["node"]]
        faults.append(
            FabricFault(
                str(line["id"]),
                line["kind"],
                list(nodes or [target["node"]]),
                str(target.get("port", "mlx5_0")),
                float(line["onset_unix"]),
                float(line["end_unix"]),
                list(line.get("cuts", [])),
            )
        )
    return faults


def scenario_files(folders: tuple[Path, ...]) -> dict[str, Path]:
    import yaml

    files = {}
    for path in sorted(p for folder in folders for p in folder.glob("*.yaml")):
        files[str((yaml.safe_load(path.read_text()) or {}).get("name", path.stem))] = path
    return files


def evaluate(results: list[dict[str, Any]], folders: tuple[Path, ...]) -> dict[str, Any]:
    files = scenario_files(folders)
    pairs: list[tuple[str, str]] = []
    rows = []
    delays: list[float | None] = []
    for result in results:
        for scenario in result["scenarios"]:
            name = scenario["scenario"]
            if name not in files:
                raise SystemExit(f"scenario {name!r}: no file of that name in {', '.join(map(str, folders))}")
            episodes = scenario.get("episodes", [])
            for fault in simulated_truth(files[name]):
                predicted = label(fault, episodes)
                pairs.append((fault.kind, predicted))
                cut = cut_delays(fault, episodes) if fault.kind == "ib_flash_cut" else []
                delays += cut
                caught = scenario["kinds"].get(fault.kind, {}).get("delays_s") or [None]
                rows.append(
                    {
                        "scenario": name,
                        "kind": fault.kind,
                        "label": predicted,
                        "delay_s": caught[0],
                        "cut_delays_s": cut,
                        "lead_s": lead_s(fault, episodes) if fault.kind == "ib_degrading_link" else None,
                    }
                )
    found = [d for d in delays if d is not None and d <= CUT_WINDOW_S]
    return {
        "faults": rows,
        **scores(pairs),
        "cuts": {"total": len(delays), "within_60s": len(found), "max_delay_s": max(found, default=None)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evaluation.fabric_confusion",
        description="Confusion table and macro-F1 of the fabric's gray-failure kinds from `fleetsight "
        "evaluate alerts --json` results; the time to each flash cut's alert.",
        epilog="example: fleetsight evaluate alerts --agent-step 15s --no-anomaly --json "
        "--scenario evaluation/scenarios/fabric/fabric_flash_cut_a.yaml > fc.json; "
        "python -m evaluation.fabric_confusion fc.json",
    )
    parser.add_argument(
        "results", nargs="+", type=Path, help="JSON written by `fleetsight evaluate alerts --json`"
    )
    parser.add_argument(
        "--scenarios",
        type=Path,
        action="append",
        help="a folder of scenario files (default: evaluation/scenarios/fabric and alerts); repeat for more",
    )
    args = parser.parse_args(argv)
    results = []
    for path in args.results:
        try:
            results.append(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            parser.error(f"{path}: not a results file of `evaluate alerts --json`: {exc}")
    print(json.dumps(evaluate(results, tuple(args.scenarios or SCENARIO_DIRS)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
