"""K-shard Prometheus configurations, derived from metrics/prometheus.yml (never edited by hand).

Each shard is an HA pair (replica A and B, as today) that scrapes 1/K of the nodes: every scrape job
keeps its production source, intervals and relabelling, and gets three relabel steps appended that
keep a target only when the hash of its shard key falls in this shard. The key is the target's `node`
label (the host part of the address when a target has no `node`), so every exporter of one node
(dcgm-exporter, the node agent, node_exporter) lands in the same shard, and the rules that join them
on `node` still find both sides. Hashing the address instead would split a node's exporters across
shards (they listen on different ports, sometimes behind different addresses); sharding per rack
would need an inventory in the configuration and leave shards uneven as racks fill.

The shard's own Prometheus peers (job `prometheus`) are not sharded: each pair scrapes itself.

Rules: rules/*.yml are split into the shard-local ones (rules-shard/, loaded by every shard) and the
fleet-wide ones named in placement.yml (rules-fleet/, for Thanos Ruler over Thanos Query).
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
PRODUCTION_CONFIG = HERE.parent / "prometheus.yml"
RULES_DIR = HERE.parents[1] / "rules"
PLACEMENT = HERE / "placement.yml"
UNSHARDED_JOBS = {"prometheus"}
SHARD_LABEL = "shard"


def shard_relabelling(shards: int, index: int) -> list[dict[str, Any]]:
    key, shard = "__tmp_shard_key", "__tmp_shard"
    return [
        # The key: the host of the address (a node's exporters share it)...
        {
            "source_labels": ["__address__"],
            "regex": "(.+?)(?::\\d+)?",
            "target_label": key,
            "replacement": "$1",
        },
        # ...or, better, the node it describes when the target names one (the twin serves every node
        # from one address; a site's targets files name the node).
        {"source_labels": ["node"], "regex": "(.+)", "target_label": key, "replacement": "$1"},
        {"source_labels": [key], "modulus": shards, "target_label": shard, "action": "hashmod"},
        {"source_labels": [shard], "regex": str(index), "action": "keep"},
    ]


def shard_config(
    production: dict[str, Any], shards: int, index: int, rule_files: list[str]
) -> dict[str, Any]:
    """Shard ``index`` of ``shards``: production's file with the shard's targets, label and rules."""
    if shards < 1 or not 0 <= index < shards:
        raise ValueError(f"shard {index} of {shards}: need 0 <= index < shards")
    config = copy.deepcopy(production)
    config["global"].setdefault("external_labels", {})[SHARD_LABEL] = str(index)
    config["rule_files"] = rule_files
    # Alertmanager deduplicates alerts by labels: drop the shard as the replica is dropped.
    relabel = config.setdefault("alerting", {}).setdefault("alert_relabel_configs", [])
    relabel.append({"regex": SHARD_LABEL, "action": "labeldrop"})
    for job in config["scrape_configs"]:
        if job["job_name"] not in UNSHARDED_JOBS and shards > 1:
            job["relabel_configs"] = [*job.get("relabel_configs", []), *shard_relabelling(shards, index)]
    return config


def fleet_wide_names(placement: Path = PLACEMENT) -> set[str]:
    return set(yaml.safe_load(placement.read_text())["fleet_wide"])


def rule_name(rule: dict[str, Any]) -> str:
    return rule.get("record") or rule["alert"]


def split_rules(
    rules_dir: Path = RULES_DIR, placement: Path = PLACEMENT
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(shard-local, fleet-wide) rule files, by file name; groups keep their names and intervals."""
    fleet = fleet_wide_names(placement)
    found: set[str] = set()
    local_files: dict[str, Any] = {}
    fleet_files: dict[str, Any] = {}
    for path in sorted(rules_dir.glob("*.yml")):
        for group in yaml.safe_load(path.read_text()).get("groups", []):
            for files, keep in ((local_files, False), (fleet_files, True)):
                rules = [r for r in group["rules"] if (rule_name(r) in fleet) == keep]
                found |= {rule_name(r) for r in rules if keep}
                if rules:
                    files.setdefault(path.name, {"groups": []})["groups"].append({**group, "rules": rules})
    if missing := fleet - found:
        raise ValueError(f"{placement}: no rule named {sorted(missing)} in {rules_dir}")
    return local_files, fleet_files


def write(out: Path, shards: int, production: Path = PRODUCTION_CONFIG, rules_dir: Path = RULES_DIR,
          rules_path: str = "/etc/prometheus") -> list[Path]:  # fmt: skip
    """prometheus-shard-<k>.yml for every shard, rules-shard/ and rules-fleet/ under ``out``."""
    config = yaml.safe_load(production.read_text())
    local_files, fleet_files = split_rules(rules_dir)
    written = []
    for folder, files in (("rules-shard", local_files), ("rules-fleet", fleet_files)):
        (out / folder).mkdir(parents=True, exist_ok=True)
        for name, content in files.items():
            (out / folder / name).write_text(yaml.safe_dump(content, sort_keys=False))
    for index in range(shards):
        path = out / f"prometheus-shard-{index}.yml"
        rules = [f"{rules_path}/rules-shard/*.yml"]
        path.write_text(yaml.safe_dump(shard_config(config, shards, index, rules), sort_keys=False))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Write K shard configurations (each for an HA pair with its Thanos sidecar) derived "
        "from metrics/prometheus.yml, and rules/*.yml split into shard-local and fleet-wide (Thanos Ruler).",
        epilog="Example: python -m metrics.sharding.generate --shards 4 --out /etc/fleetsight/shards",
    )
    parser.add_argument("--shards", type=int, required=True, help="how many shards (HA pairs)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the generated files")
    parser.add_argument(
        "--config", type=Path, default=PRODUCTION_CONFIG, help="the production Prometheus file"
    )
    parser.add_argument("--rules-path", default="/etc/prometheus", help="where rules-shard/ is mounted")
    args = parser.parse_args(argv)
    if args.shards < 1:
        parser.error("--shards must be at least 1")
    for path in write(args.out, args.shards, args.config, rules_path=args.rules_path):
        print(path)
    print(
        f"{args.out}/rules-fleet: for Thanos Ruler: "
        f"thanos rule --query=<thanos query> --rule-file={args.out}/rules-fleet/*.yml"
    )


if __name__ == "__main__":
    main()
