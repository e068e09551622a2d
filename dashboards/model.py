"""The shape of a dashboard as data: queries, panels, rows, variables and the dashboard itself, and the
uids of the datasources the queries go to.

Its own module because every persona's dashboards (dashboards/researcher.py, sysadmin.py,
facilities.py, executive.py), the JSON builder (dashboards/build.py) and the query checks
(dashboards/verify.py) read these types; a new panel changes a persona's module, not this one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


def q(expr: str, legend: str = "", instant: bool = False) -> Query:
    return Query(" ".join(expr.split()), legend, instant)
