"""Series accounting for the series budget: parse an exposition, count series per node, and find
labels whose values are unbounded (pids, job steps, timestamps, message text).

A series is a metric name plus its label set, as Prometheus stores it. Counting is per node because
the fleet's cost is (series per node) x (nodes); a label that takes a new value with every event or
every second multiplies that by time instead, which no budget can hold.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

BUDGET_FILE = Path(__file__).resolve().parent / "budget.yml"
# Values that only a clock, a counter of events or a free-text field produces.
TIMESTAMP_LIKE = re.compile(r"^\d{9,}(\.\d+)?$|^\d{4}-\d\d-\d\dT\d\d:\d\d")
MESSAGE_LIKE = re.compile(r"\s\S+\s")  # three or more words: a sentence, not an identifier


Series = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class Budget:
    per_node: dict[str, int]  # exporter -> series per node it may produce
    forbidden_labels: frozenset[str]  # label names that carry unbounded values
    max_label_values: int  # distinct values one label may take on one node's metric
    producer_labels: frozenset[tuple[str, str]] = frozenset()  # (metric, label) a producer bounds itself


def load_budget(path: Path = BUDGET_FILE) -> Budget:
    data = yaml.safe_load(path.read_text())
    return Budget(
        per_node={name: int(entry["budget"]) for name, entry in data["exporters"].items()},
        forbidden_labels=frozenset(data["forbidden_labels"]),
        max_label_values=int(data["max_label_values_per_node"]),
        producer_labels=frozenset(
            (metric, label)
            for metric, labels in (data.get("producer_labels") or {}).items()
            for label in labels
        ),
    )


def parse(text: str) -> set[Series]:
    """Every series of an exposition (histogram and summary samples count as Prometheus stores them)."""
    found: set[Series] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.add((sample.name, tuple(sorted(sample.labels.items()))))
    return found


def by_node(
    series: Iterable[Series], node_labels: tuple[str, ...] = ("node", "Hostname")
) -> dict[str, set[Series]]:
    """Series grouped by the node they describe (the first of node_labels present); '' for none."""
    grouped: dict[str, set[Series]] = defaultdict(set)
    for item in series:
        labels = dict(item[1])
        node = next((labels[name] for name in node_labels if labels.get(name)), "")
        grouped[node].add(item)
    return grouped


def unbounded_labels(series: Iterable[Series], budget: Budget) -> list[str]:
    """Problems, one line each: a forbidden label name, a timestamp-like or sentence-like value, or a
    label with more distinct values on one node's metric than the budget allows."""
    problems: set[str] = set()
    values: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    exempt = budget.producer_labels
    for name, labels in series:
        node = dict(labels).get("node") or dict(labels).get("Hostname", "")
        for label, value in labels:
            if label.lower() in budget.forbidden_labels:
                problems.add(f"{name}: label {label!r} has unbounded values (forbidden)")
            elif TIMESTAMP_LIKE.match(value):
                problems.add(f"{name}: label {label!r} looks like a timestamp ({value!r})")
            elif MESSAGE_LIKE.search(value) and len(value) > 40 and (name, label) not in exempt:
                problems.add(f"{name}: label {label!r} looks like message text ({value[:40]!r}...)")
            values[(name, label, node)].add(value)
    for (name, label, node), seen in values.items():
        if len(seen) > budget.max_label_values:
            problems.add(f"{name}: label {label!r} takes {len(seen)} values on node {node!r}")
    return sorted(problems)


def per_node_counts(series_by_node: dict[str, set[Series]]) -> Counter[str]:
    return Counter({node: len(items) for node, items in series_by_node.items() if node})
