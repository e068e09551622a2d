"""Pieces of panels that several personas' dashboards share: the runbooks' base URL and the
clock-event (throttle reason) expressions.

Its own module so that the power brake means the same expression on the sysadmin's and the facilities'
dashboards and in the fleet-scale bench (bench/fleet_scale.py).
"""

from __future__ import annotations

from fleetsight.dcgm import promql_selector_any

RUNBOOKS = "https://github.com/fleetsight/fleetsight/blob/main/docs/runbooks"
# The clock-event reasons (field 112) under its current or legacy name, whichever the counters file
# publishes; `max without (__name__)` makes a GPU seen under both one series (counted once).
CLOCK_EVENTS = f"max without (__name__) ({promql_selector_any('DCGM_FI_DEV_CLOCKS_EVENT_REASONS')})"
# PromQL has no bitwise operators: bit b of the clock-event reasons is floor(x / b) % 2.
POWER_BRAKE = f"floor({CLOCK_EVENTS} / 128) % 2 == 1"
THERMAL = f"(floor({CLOCK_EVENTS} / 32) % 2 + floor({CLOCK_EVENTS} / 64) % 2) > 0"
# Per-cluster figures of the fleet page (dashboards/viewer/fleet.py) and the fleet dashboard (sysadmin.py);
# unfiltered here: the dashboard's queries get the cluster variable's matcher (model.q), the page's do not.
FIRING_BY_CLUSTER = 'count by (cluster) (ALERTS{alertstate="firing"})'
GPUS_BY_CLUSTER = "count by (cluster) (DCGM_FI_DEV_GPU_TEMP)"
FIRING = 'ALERTS{alertstate="firing"}'
