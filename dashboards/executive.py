# ruff: noqa: E501  (PromQL reads best on one line; the queries are the point of this file)
"""The executive's dashboard: are we getting the training we pay for (availability, utilization,
effective training time, energy cost, failures, MTBF and MTTR)?

One module per persona, so that a change to what one persona sees touches only that persona's file.
"""

from __future__ import annotations

from .model import CLUSTER, Dashboard, Panel, Row, Variable, q

FLEET_KPIS = Dashboard(
    uid="fleetsight-kpis",
    title="FleetSight: fleet KPIs",
    persona="executive",
    question="Are we getting the training we pay for?",
    variables=(
        CLUSTER,
        Variable("price_per_kwh", "Energy price per kWh", "0.12", constant=True),
    ),
    rows=(
        Row(
            "This period",
            (
                Panel(
                    "Availability (share of node-hours fit for work)",
                    "stat",
                    # Sampled every $__interval, Grafana's resolution for the range: a fixed 5 m step
                    # left a fresh stack's panel empty for up to 5 minutes and a 15-minute range with
                    # three samples.
                    (
                        q(
                            'avg_over_time((count(fleetsight_node_health_state{state=~"healthy|degraded"} == 1) '
                            "/ count(count by (node) (fleetsight_node_health_state)))[$__range:$__interval])",
                            instant=True,
                        ),
                    ),
                    unit="percentunit",
                    width=6,
                    needs="health service",
                ),
                Panel(
                    "GPU utilization",
                    "stat",
                    (q("avg(avg_over_time(DCGM_FI_DEV_GPU_UTIL[$__range])) / 100", instant=True),),
                    unit="percentunit",
                    width=6,
                ),
                Panel(
                    "Effective training time (tensor-busy share of the jobs' GPU time)",
                    "stat",
                    (
                        q(
                            'avg(avg_over_time(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{hpc_job!=""}[$__range])) '
                            '/ avg(max_over_time(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{hpc_job!=""}[$__range]))',
                            instant=True,
                        ),
                    ),
                    unit="percentunit",
                    width=6,
                ),
                Panel(
                    "Energy cost",
                    "stat",
                    (
                        q(
                            "sum(avg_over_time(DCGM_FI_DEV_POWER_USAGE[$__range])) * $__range_s / 3600 / 1000 * $price_per_kwh",
                            instant=True,
                        ),
                    ),
                    unit="currencyUSD",
                    width=6,
                ),
            ),
        ),
        Row(
            "Failures",
            (
                Panel(
                    "Failures by category (Fire-Flyer taxonomy)",
                    "timeseries",
                    (
                        q(
                            "sum by (category) (increase(fleetsight_gpu_xid_errors_total[1h]))",
                            "GPU {{category}}",
                        ),
                        q("sum(changes(fleetsight_infiniband_port_up[1h])) / 2", "network"),
                        q("count(fleetsight_bmc_psu_healthy == 0) or vector(0)", "power"),
                        q(
                            'count(ALERTS{alertname=~"Lustre.*", alertstate="firing"}) or vector(0)',
                            "storage",
                        ),
                        q('count(ALERTS{alertname="NodeDown", alertstate="firing"}) or vector(0)', "host"),
                    ),
                    width=24,
                ),
                Panel(
                    "Mean time between failures (node-hours per critical alert)",
                    "stat",
                    (
                        q(
                            'count(count by (node) (up{job="fleetsight-node"})) * ($__range_s / 3600) '
                            '/ clamp_min(count(count by (node, alertname) (count_over_time(ALERTS{severity="critical"}[$__range]))), 1)',
                            instant=True,
                        ),
                    ),
                    unit="h",
                ),
                Panel(
                    "Mean time to repair (hours a critical alert fires)",
                    "stat",
                    (
                        q(
                            'avg(count_over_time(ALERTS{severity="critical", alertstate="firing"}[$__range:1m])) / 60',
                            instant=True,
                        ),
                    ),
                    unit="h",
                ),
            ),
        ),
    ),
)
