"""Every FleetSight dashboard, in the order they are built and listed. Each persona's module says what
its dashboards show: the question each answers, its panels and their queries (dashboards/researcher.py,
sysadmin.py, facilities.py, executive.py; the types are in dashboards/model.py).

Plain data, so that one test can run every query against a real Prometheus and another can rebuild
the JSON (dashboards/build.py) and compare it with the committed files.
"""

from __future__ import annotations

from .executive import FLEET_KPIS
from .facilities import POWER_AND_COOLING
from .model import Dashboard
from .researcher import MY_JOB
from .sysadmin import FLEET, FLEET_HEALTH, NODE_DRILLDOWN, STACK_HEALTH

DASHBOARDS: tuple[Dashboard, ...] = (
    MY_JOB,
    FLEET_HEALTH,
    NODE_DRILLDOWN,
    POWER_AND_COOLING,
    FLEET_KPIS,
    STACK_HEALTH,
    FLEET,
)
