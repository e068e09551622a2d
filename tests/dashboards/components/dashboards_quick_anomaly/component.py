"""Test-only component (joined through FLEETSIGHT_COMPONENT_PATH by tests/dashboards/test_dashboards.py):
the stack's own anomaly service exactly as anomaly/component.py declares it (same command, port,
environment, readiness and scrape job "anomaly"), with one change: a cycle every QUICK_CYCLE_S seconds
instead of the production 30 s.

Why: the straggler-score panel has data only once the service has scored the twin's first job, which
needs two cycles after the job's 90 s start-up ends (the first busy window only sets the job's level).
At 30 s a cycle that costs up to a minute of waiting; the window, the step and so the recorded mode the
service reads (rules/anomaly.yml) stay the production ones. Not started by a plain `fleetsight up`.
"""

from __future__ import annotations

import dataclasses

from anomaly.component import COMPONENTS as ANOMALY_COMPONENTS
from fleetsight.settings import Settings

QUICK_CYCLE_S = 5
NAME = "anomaly-quick-cycle"  # its scrape job is the stock one's: Prometheus scrapes it as job "anomaly"
STOCK = next(c for c in ANOMALY_COMPONENTS if c.name == "anomaly")


def command(settings: Settings) -> list[str]:
    return [*STOCK.command(settings), "--interval", str(QUICK_CYCLE_S)]


COMPONENTS = [
    dataclasses.replace(
        STOCK,
        name=NAME,
        description=f"the anomaly service with a {QUICK_CYCLE_S} s cycle (tests/dashboards)",
        command=command,
        default=False,
    )
]
