"""The shape of a dashboard as data: queries, panels, rows, variables and the dashboard itself, and the
uids of the datasources the queries go to.

Its own module because every persona's dashboards (dashboards/researcher.py, sysadmin.py,
facilities.py, executive.py), the JSON builder (dashboards/build.py) and the query checks
(dashboards/verify.py) read these types; a new panel changes a persona's module, not this one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from . import clusters

PROMETHEUS = "thanos"  # datasource uid (dashboards/provisioning/datasources/thanos.yml)
LOGS = "logs"  # datasource uid (dashboards/provisioning/datasources/logs.yml)


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    instant: bool = False
    datasource: str = PROMETHEUS
    """For the logs datasource, ``expr`` is a Lucene query and ``metric`` the field to average."""
    metric: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    kind: str  # timeseries | stat | table | heatmap | statushistory | bargauge
    queries: tuple[Query, ...]
    unit: str = ""
    description: str = ""
    width: int = 12
    height: int = 8
    link: str = ""
    """A data link on every value (tables): a runbook or a drill-down."""
    needs: str = ""
    """Which component's series the panel needs, when it is not always there (shown in `list`)."""


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Variable:
    name: str
    label: str
    query: str
    """A PromQL ``label_values(...)`` query, or the value of a constant."""
    constant: bool = False
    multi: bool = False
    include_all: bool = False
    all_value: str = ""
    """Grafana's Custom all value (sent unescaped when All is selected); "All" is then the default."""


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    persona: str
    question: str
    rows: tuple[Row, ...]
    variables: tuple[Variable, ...] = ()
    tags: tuple[str, ...] = field(default=("fleetsight",))

    def panels(self) -> list[Panel]:
        return [panel for row in self.rows for panel in row.panels]


# Every dashboard's first variable: the clusters (dashboards/clusters.py), "All" by default.
CLUSTER = Variable(
    clusters.NAME,
    clusters.LABEL,
    clusters.QUERY,
    multi=True,
    include_all=True,
    all_value=clusters.ALL_VALUE,
)


def by_cluster(query: str) -> str:
    """A ``label_values(selector, label)`` of a dashboard variable restricted to the chosen clusters."""
    match = re.fullmatch(r"label_values\((.+), *(\w+)\)", query)
    if match is None:
        raise ValueError(f"not a label_values(selector, label) query: {query!r}")
    return f"label_values({clusters.on_cluster(match.group(1))}, {match.group(2)})"


def q(expr: str, legend: str = "", instant: bool = False) -> Query:
    """A PromQL query, every selector filtered on the cluster variable (``cluster=~"$cluster"``)."""
    return Query(clusters.on_cluster(" ".join(expr.split())), legend, instant)


def logs(lucene: str, legend: str, metric: str) -> Query:
    """A logs (Lucene) query of the documents of the chosen clusters (``fleetsight.cluster``)."""
    return Query(f"{clusters.LUCENE} AND {lucene}", legend, datasource=LOGS, metric=metric)
