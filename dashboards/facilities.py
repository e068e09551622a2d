"""The facilities' dashboard: are we within power and cooling limits, and which racks or GPUs are near
them?

One module per persona, so that a change to what one persona sees touches only that persona's file.
"""

from __future__ import annotations

from .common_queries import POWER_BRAKE, RUNBOOKS, THERMAL
from .model import CLUSTER, Dashboard, Panel, Row, Variable, q

POWER_AND_COOLING = Dashboard(
    uid="fleetsight-power",
    title="FleetSight: power and cooling",
    persona="facilities",
    question="Are we within power and cooling limits, and which racks or GPUs are near them?",
    variables=(
        CLUSTER,
        Variable("node_capacity_watts", "Power capacity per node (W)", "10200", constant=True),
    ),
    rows=(
        Row(
            "Power",
            (
                Panel(
                    "Cluster power against capacity",
                    "timeseries",
                    (
                        q("sum(fleetsight_bmc_power_consumed_watts)", "drawn (BMC)"),
                        q("sum(DCGM_FI_DEV_POWER_USAGE)", "GPUs"),
                        q("count(fleetsight_bmc_power_consumed_watts) * $node_capacity_watts", "capacity"),
                    ),
                    unit="watt",
                    width=24,
                ),
                Panel(
                    "GPU power per rack",
                    "timeseries",
                    (q("sum by (rack) (DCGM_FI_DEV_POWER_USAGE)", "{{rack}}"),),
                    unit="watt",
                ),
                Panel(
                    "PSUs not healthy",
                    "table",
                    (q("fleetsight_bmc_psu_healthy == 0", instant=True),),
                    link=f"{RUNBOOKS}/PSUFailed.md",
                ),
            ),
        ),
        Row(
            "Cooling",
            (
                Panel(
                    "GPUs throttling for power (power brake)",
                    "timeseries",
                    (q(f"count by (rack) ({POWER_BRAKE})", "{{rack}}"),),
                ),
                Panel(
                    "GPUs throttling for heat", "timeseries", (q(f"count by (rack) ({THERMAL})", "{{rack}}"),)
                ),
                Panel(
                    "Hottest GPU per rack",
                    "timeseries",
                    (q("max by (rack) (DCGM_FI_DEV_GPU_TEMP)", "{{rack}}"),),
                    unit="celsius",
                    width=24,
                ),
            ),
        ),
    ),
)
