"""What a stock dcgm-exporter costs FleetSight, measured: the same twin scenarios evaluated with the
counters file FleetSight ships (exporters/dcgm/counters.csv) and with the stock file of the pinned image
(exporters/dcgm/upstream/default-counters.csv).

For each scenario it writes a copy whose ``dcgm.counters`` is ``shipped`` and one whose is ``stock``
(nothing else differs: same seed, faults and workload), runs ``fleetsight evaluate alerts --json`` on both
and, with ``--anomaly``, ``fleetsight evaluate anomaly --json``, and prints per alert (faults caught,
false episodes, median delay) and per straggler cause (flags whose cause was right) what each mode
catches. A row where stock catches less is a blind spot of a stock fleet; the DCGMFieldsMissing alert
names the fields behind it.

    .venv/bin/python bench/dcgm_counters_modes.py                      # the alert set, ~10 minutes
    .venv/bin/python bench/dcgm_counters_modes.py --scenario rs_thermal --scenario rs_remap
    .venv/bin/python bench/dcgm_counters_modes.py --anomaly --no-alerts   # the straggler set, ~5 min
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from evaluation.scenarios import resolve  # noqa: E402

MODES = ("shipped", "stock")
FLEETSIGHT = str(REPO / ".venv" / "bin" / "fleetsight")
ALERT_SCENARIOS = sorted(p.stem for p in (REPO / "evaluation" / "scenarios" / "alerts").glob("*.yaml"))
# The hand-written straggler set (the generated gen_* and the Kubernetes-shaped k8s_* copies left out).
ANOMALY_SCENARIOS = sorted(
    str(p)
    for p in (REPO / "evaluation" / "scenarios" / "anomaly").glob("*.yaml")
    if not p.stem.startswith(("gen_", "k8s_"))
)


def with_counters(scenario: Path, mode: str, folder: Path) -> Path:
    """A copy of the scenario whose twin dcgm-exporter publishes the given counters file."""
    data = yaml.safe_load(scenario.read_text())
    data["dcgm"] = {**(data.get("dcgm") or {}), "counters": mode}
    target = folder / f"{scenario.stem}-{mode}.yaml"
    target.write_text(yaml.safe_dump(data, sort_keys=False))
    return target


def evaluate(verb: str, scenario: Path, *extra: str) -> dict[str, Any]:
    command = [FLEETSIGHT, "evaluate", verb, "--scenario", str(scenario), "--json"]
    result = subprocess.run([*command, *extra], capture_output=True, text=True, check=False, cwd=REPO)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return json.loads(result.stdout)


def alert_rows(name: str, folder: Path) -> list[tuple[str, str, dict[str, str]]]:
    """(scenario, alert, mode -> 'caught/faults, false, median delay') for the alerts that fired or
    were expected in either mode."""
    per_mode: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        result = evaluate("alerts", with_counters(resolve(name), mode, folder), "--no-anomaly")
        per_mode[mode] = result["scenarios"][0]
        print(f"  {name} {mode}: {per_mode[mode]['wall_seconds']} s", file=sys.stderr)
    expected = {a for m in per_mode.values() for k in m["kinds"].values() for a in k["expected"]}
    rows = []
    for alert in sorted(per_mode["shipped"]["alerts"]):
        figures = {mode: per_mode[mode]["alerts"].get(alert, {}) for mode in MODES}
        if alert not in expected and not any(f.get("episodes") for f in figures.values()):
            continue
        rows.append((name, alert, {mode: alert_cell(figures[mode]) for mode in MODES}))
    return rows


def alert_cell(figures: dict[str, Any]) -> str:
    if not figures:
        return "-"
    delay = figures.get("median_delay_s")
    delay_text = f"{delay:.0f} s" if delay is not None else "-"
    return f"{figures['faults_caught']} caught, {figures['false_episodes']} false, {delay_text}"


def evaluate_many(verb: str, scenarios: list[Path]) -> dict[str, Any]:
    command = [FLEETSIGHT, "evaluate", verb, "--json"]
    command += [arg for path in scenarios for arg in ("--scenario", str(path))]
    result = subprocess.run(command, capture_output=True, text=True, check=False, cwd=REPO)
    if result.returncode != 0:
        raise SystemExit(f"evaluate {verb} failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return json.loads(result.stdout)


def anomaly_rows(names: list[str], folder: Path) -> list[tuple[str, str, dict[str, str]]]:
    """Per fault kind: recall, cause accuracy and median latency of the straggler detector."""
    per_mode = {
        mode: evaluate_many("anomaly", [with_counters(resolve(name), mode, folder) for name in names])
        for mode in MODES
    }
    kinds = sorted(set(per_mode["shipped"]["by_kind"]) | set(per_mode["stock"]["by_kind"]))
    return [
        ("anomaly set", kind, {mode: kind_cell(per_mode[mode]["by_kind"].get(kind, {})) for mode in MODES})
        for kind in kinds
    ]


def kind_cell(figures: dict[str, Any]) -> str:
    if not figures:
        return "-"
    latency = figures.get("latency_median_s")
    latency_text = f"{latency:.0f} s" if latency is not None else "-"
    cause = figures.get("cause_accuracy")
    cause_text = f"{cause:.2f}" if cause is not None else "-"
    return f"R {figures['recall']:.2f}, right cause {cause_text}, {latency_text}"


def table(title: str, rows: list[tuple[str, str, dict[str, str]]]) -> str:
    header = f"| scenario | what | {' | '.join(MODES)} | stock loses |"
    lines = [f"\n{title}", header, "|---|---|---|---|---|"]
    for scenario, what, cells in rows:
        loses = "yes" if cells["stock"] != cells["shipped"] else ""
        lines.append(f"| {scenario} | {what} | {cells['shipped']} | {cells['stock']} | {loses} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenario", action="append", help="alert scenario (default: the alert set)")
    parser.add_argument("--anomaly", action="store_true", help="also the straggler causes")
    parser.add_argument("--anomaly-scenario", action="append", default=None, help="default: hand-written set")
    parser.add_argument("--no-alerts", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dcgm-modes-") as tmp:
        folder = Path(tmp)
        if not args.no_alerts:
            rows = [row for name in (args.scenario or ALERT_SCENARIOS) for row in alert_rows(name, folder)]
            print(table("Alerts (faults caught, false episodes, median onset-to-firing delay)", rows))
        if args.anomaly:
            rows = anomaly_rows(args.anomaly_scenario or ANOMALY_SCENARIOS, folder)
            print(table("Straggler detector per fault kind (recall, cause accuracy, median latency)", rows))


if __name__ == "__main__":
    main()
