"""The sizing table of docs/scaling.md, computed from the figures bench/fleet_scale.py measured
(docs/images/fleet_scale.json), so that every number says where it comes from.

  nodes            GPUs / 8
  series           least squares of measured series on nodes (exporters, `up` and scrape
                   metadata, recording rules' outputs), extrapolated
  shards           series / the most series one replica holds within REPLICA_RSS_BUDGET, from the
                   measured RSS slope (per series) and intercept
  RSS, CPU         measured slopes per series x series per shard + intercept (extrapolated beyond
                   the largest measured point)
  disk 30 d raw    samples/s x 30 d x measured chunk bytes per sample (an upper bound: minutes of head
                   hold partly filled chunks) + one measured index per 2-hour block
  90 d at 5 min,   Thanos downsampling keeps 5 aggregates (count, sum, min, max, counter) per series
  1 y at 1 h       per window: series x 5 x windows x the same bytes per sample
  anomaly / health CPU cores   the services' CPU seconds per cycle (least squares on nodes, when
                   2+ points measured them) / their cycle (30 s, 5 s)
  object storage   what the compactor keeps once the replicas are merged: raw 30 d + 5 m 90 d + 1 h 1 y
                   (steady state), and what one month adds

Usage: .venv/bin/python bench/fleet_sizing.py [--figures docs/images/fleet_scale.json]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
GPUS = (1024, 16_384, 100_000)
GPUS_PER_NODE = 8
REPLICA_RSS_BUDGET = 24 * 2**30  # a replica on a 64 GiB host: RSS within 24 GiB leaves room for queries
DAY = 86_400
AGGREGATES = 5


def linear(xs: list[float], ys: list[float]) -> tuple[float, float]:
    slope, intercept = np.polyfit(xs, ys, 1)
    return float(slope), float(intercept)


CONSUMER_INTERVALS = {"anomaly cycle CPU s": 30.0, "health cycle CPU s": 5.0}  # production's cycles


def consumer_fits(rows: list[dict[str, float]]) -> dict[str, tuple[float, float, float]]:
    """CPU cores of the anomaly and health services: CPU seconds per cycle, least squares on nodes
    over the points that measured them (2 at least), divided by the cycle's interval."""
    fits = {}
    for key, interval in CONSUMER_INTERVALS.items():
        have = [r for r in rows if r.get(key) is not None and r[key] == r[key]]
        if len(have) >= 2:
            slope, intercept = linear([r["nodes"] for r in have], [r[key] for r in have])
            fits[key.split()[0] + " CPU cores"] = (slope, intercept, interval)
    return fits


def sizing(rows: list[dict[str, float]], points: list[dict]) -> list[dict[str, float]]:
    nodes = [r["nodes"] for r in rows]
    series = [r["series"] for r in rows]
    s_per_node, s0 = linear(nodes, series)
    rss_per_series, rss0 = linear(series, [r["RSS GiB"] * 2**30 for r in rows])
    cpu_per_series, cpu0 = linear(series, [r["CPU cores"] for r in rows])
    sps_per_series, _ = linear(series, [r["samples/s"] for r in rows])
    # the least favourable measured point (a point run with --no-snapshot has none: NaN)
    per_sample = max(r["B/sample"] for r in rows if r["B/sample"] == r["B/sample"])
    index_per_series = float(
        np.nanmean([p["per_shard"][0]["index_bytes"] / p["per_shard"][0]["series"] for p in points])
    )
    consumers = consumer_fits(rows)
    # Rule-group durations are wall time, inflated by the shared machine's load: they are reported by
    # the bench, not used here; memory and CPU time are.
    max_series = (REPLICA_RSS_BUDGET - rss0) / rss_per_series
    out = []
    for gpus in GPUS:
        n = gpus / GPUS_PER_NODE
        total_series = s0 + s_per_node * n
        shards = max(1, math.ceil(total_series / max_series))
        per_shard = total_series / shards
        samples = sps_per_series * total_series
        raw = samples * 30 * DAY * per_sample + total_series * index_per_series * 30 * 12
        five = total_series * AGGREGATES * (90 * DAY / 300) * per_sample
        hour = total_series * AGGREGATES * (365 * DAY / 3600) * per_sample
        out.append({
            "GPUs": gpus, "nodes": n, "series": total_series, "shards": shards,
            "RSS GiB / replica": (rss0 + rss_per_series * per_shard) / 2**30,
            "CPU cores / replica": cpu0 + cpu_per_series * per_shard,
            "samples/s": samples,
            "raw 30 d TiB": raw / 2**40, "5 m 90 d TiB": five / 2**40, "1 h 1 y TiB": hour / 2**40,
            "bucket TiB": (raw + five + hour) / 2**40,
            "bucket TiB added / month": (raw + five / 3 + hour / 12) / 2**40,
            **{name: max(0.0, a + b * n) / interval for name, (b, a, interval) in consumers.items()},
        })  # fmt: skip
    print(f"from the bench: {s_per_node:.0f} series per node, {rss_per_series:.0f} B RSS per series "
          f"(+{rss0 / 2**30:.2f} GiB), {cpu_per_series * 1e6:.2f} cores per million series, "
          f"{per_sample:.2f} B per sample, {index_per_series:.0f} B index per series and block; "
          f"a replica holds {max_series / 1e6:.2f} M series "
          f"within {REPLICA_RSS_BUDGET / 2**30:.0f} GiB")  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--figures", type=Path, default=REPO / "docs" / "images" / "fleet_scale.json")
    args = parser.parse_args()
    figures = json.loads(args.figures.read_text())
    if len(figures["rows"]) < 2:
        parser.error(f"{args.figures}: {len(figures['rows'])} measured point(s); the slopes need 2 or more")
    table = sizing(figures["rows"], figures["points"])
    keys = list(table[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in table:
        print("| " + " | ".join(f"{row[k]:,.0f}" if row[k] >= 100 else f"{row[k]:.2f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
