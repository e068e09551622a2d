# ruff: noqa: E501  (PromQL reads best on one line; the queries are the point of this file)
"""The sysadmin's dashboards: what is broken right now and where (fleet health), everything about one
node, whether the monitoring itself works (stack health), and the fleet's clusters side by side.

One module per persona, so that a change to what one persona sees touches only that persona's file.
``$node`` is Grafana's variable of the node drill-down.
"""

from __future__ import annotations

from fleetsight.dcgm import promql_selector_any

from .common_queries import FIRING, FIRING_BY_CLUSTER, GPUS_BY_CLUSTER, POWER_BRAKE, RUNBOOKS, THERMAL
from .model import CLUSTER, Dashboard, Panel, Row, Variable, by_cluster, q

FLEET_HEALTH = Dashboard(
    uid="fleetsight-fleet-health",
    title="FleetSight: fleet health",
    persona="sysadmin",
    question="What is broken right now, where, and what do I do about it?",
    variables=(CLUSTER,),
    rows=(
        Row(
            "Now",
            (
                Panel(
                    "Nodes by health state",
                    "bargauge",
                    (q("count by (state) (fleetsight_node_health_state == 1)", "{{state}}", instant=True),),
                    width=8,
                    needs="health service",
                ),
                Panel(
                    "Firing alerts by severity",
                    "bargauge",
                    (q('count by (severity) (ALERTS{alertstate="firing"})', "{{severity}}", instant=True),),
                    width=8,
                ),
                Panel(
                    "Exporters up",
                    "stat",
                    (q("sum by (job) (up)", "{{job}}", instant=True),),
                    width=8,
                ),
                Panel(
                    "Firing alerts (click for the runbook)",
                    "table",
                    (q('ALERTS{alertstate="firing"}', instant=True),),
                    width=24,
                    link=RUNBOOKS + "/${__data.fields.alertname}.md",
                ),
            ),
        ),
        Row(
            "GPUs",
            (
                Panel(
                    "Xids by category",
                    "timeseries",
                    (
                        q(
                            "sum by (category) (increase(fleetsight_gpu_xid_errors_total[$__rate_interval]))",
                            "{{category}}",
                        ),
                    ),
                    needs="an Xid",
                ),
                Panel(
                    "GPUs slowed by heat or a power brake, and failed PSUs",
                    "timeseries",
                    (
                        q(f"count by (node) ({THERMAL})", "{{node}} heat"),
                        q(f"count by (node) ({POWER_BRAKE})", "{{node}} power brake"),
                        q("count by (node) (fleetsight_bmc_psu_healthy == 0)", "{{node}} PSU failed"),
                    ),
                    description="Throttling shows at the next scrape, before its alert's 2 minutes are up.",
                ),
                Panel(
                    "HBM rows waiting for a remap (reset the GPU when idle)",
                    "table",
                    (q("DCGM_FI_DEV_ROW_REMAP_PENDING > 0", instant=True),),
                    link=f"{RUNBOOKS}/GPURowRemapPending.md",
                ),
            ),
        ),
        Row(
            "InfiniBand and PCIe",
            (
                Panel(
                    "IB ports down (host side and fabric side)",
                    "stat",
                    (
                        q("count(fleetsight_infiniband_port_up == 0) or vector(0)", "host", instant=True),
                        q("count(fleetsight_fabric_port_up == 0) or vector(0)", "fabric", instant=True),
                    ),
                    width=8,
                ),
                Panel(
                    "IB links that flapped in the last hour",
                    "table",
                    (
                        q(
                            "sum by (node, device, port) (increase(fleetsight_infiniband_port_link_downed_total[1h])) > 0",
                            instant=True,
                        ),
                    ),
                    width=8,
                    link=f"{RUNBOOKS}/InfiniBandLinkFlapping.md",
                ),
                Panel(
                    "IB symbol errors per second (host side)",
                    "timeseries",
                    (
                        q(
                            "sum by (node, device, port) (rate(fleetsight_infiniband_port_symbol_error_total[$__rate_interval])) > 0",
                            "{{node}} {{device}}/{{port}}",
                        ),
                    ),
                    width=8,
                ),
                Panel(
                    "PCIe links below their maximum speed or width",
                    "table",
                    (q("fleetsight_pcie_link_downgraded == 1", instant=True),),
                    link=f"{RUNBOOKS}/PCIeLinkDowngraded.md",
                ),
                Panel(
                    "Host-to-device bandwidth, 12-hour average",
                    "timeseries",
                    (
                        q(
                            "avg by (node, gpu) (avg_over_time(fleetsight_pcie_host_to_device_bandwidth_bytes_per_second[12h]))",
                            "{{node}} GPU {{gpu}}",
                        ),
                    ),
                    unit="Bps",
                ),
            ),
        ),
        Row(
            "Storage",
            (
                Panel(
                    "Lustre RPC wait per request, by target",
                    "timeseries",
                    (
                        q(
                            "sum by (target) (rate(fleetsight_lustre_client_rpc_wait_seconds_total[$__rate_interval])) "
                            "/ sum by (target) (rate(fleetsight_lustre_client_rpc_requests_total[$__rate_interval]))",
                            "{{target}}",
                        ),
                    ),
                    unit="s",
                    width=24,
                ),
            ),
        ),
    ),
)

NODE = 'node="$node"'

NODE_DRILLDOWN = Dashboard(
    uid="fleetsight-node",
    title="FleetSight: one node",
    persona="sysadmin",
    question="Everything about this one node.",
    variables=(
        CLUSTER,
        Variable("node", "Node", by_cluster("label_values(DCGM_FI_DEV_POWER_USAGE, node)")),  # GPU nodes
    ),
    rows=(
        Row(
            "GPUs",
            (
                Panel(
                    "GPU power",
                    "timeseries",
                    (q(f"DCGM_FI_DEV_POWER_USAGE{{{NODE}}}", "GPU {{gpu}}"),),
                    unit="watt",
                    width=8,
                ),
                Panel(
                    "GPU temperature",
                    "timeseries",
                    (q(f"DCGM_FI_DEV_GPU_TEMP{{{NODE}}}", "GPU {{gpu}}"),),
                    unit="celsius",
                    width=8,
                ),
                Panel(
                    "Tensor-core activity",
                    "timeseries",
                    (q(f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{NODE}}}", "GPU {{gpu}}"),),
                    unit="percentunit",
                    width=8,
                ),
                Panel(
                    "Clock event (throttle) reasons (bitmask)",
                    "statushistory",
                    (
                        q(
                            f"max without (__name__) ({promql_selector_any('DCGM_FI_DEV_CLOCKS_EVENT_REASONS', NODE)})",
                            "GPU {{gpu}}",
                        ),
                    ),
                ),
                Panel(
                    "Xids",
                    "table",
                    (q(f"fleetsight_gpu_xid_errors_total{{{NODE}}}", instant=True),),
                    needs="an Xid",
                ),
            ),
        ),
        Row(
            "Links, power, storage",
            (
                Panel(
                    "IB ports up",
                    "statushistory",
                    (q(f"fleetsight_infiniband_port_up{{{NODE}}}", "{{device}}/{{port}}"),),
                ),
                Panel(
                    "PCIe link speed",
                    "timeseries",
                    (q(f"fleetsight_pcie_link_speed_transfers_per_second{{{NODE}}}", "{{pci_bdf}}"),),
                ),
                Panel(
                    "PSUs healthy", "statushistory", (q(f"fleetsight_bmc_psu_healthy{{{NODE}}}", "{{psu}}"),)
                ),
                Panel(
                    "BMC power",
                    "timeseries",
                    (q(f"fleetsight_bmc_power_consumed_watts{{{NODE}}}", "chassis"),),
                    unit="watt",
                ),
                Panel(
                    "Lustre read",
                    "timeseries",
                    (
                        q(
                            f"sum by (fs) (rate(fleetsight_lustre_client_read_bytes_total{{{NODE}}}[$__rate_interval]))",
                            "{{fs}}",
                        ),
                    ),
                    unit="Bps",
                ),
            ),
        ),
        Row(
            "Failure forecast",
            (
                Panel(
                    "Failure forecast: risk and the error trends behind it",
                    "timeseries",
                    (
                        q(
                            f"component:precursor_risk:score{{{NODE}}}",
                            "risk {{component}} {{gpu}}{{device}}",
                        ),
                        q(
                            f"precursor:errors:rate_now{{{NODE}}} > 0",
                            "{{component}} {{gpu}}{{device}} {{counter}} /h",
                        ),
                        q(
                            f"precursor:failure:forecast_hours{{{NODE}}} <= 168",
                            "{{component}} {{gpu}}{{device}} {{counter}} hours to failure",
                        ),
                    ),
                    description=(
                        "rules/precursors.yml: per part (NVLink, HBM, PCIe, IB port) the risk score (0..1, "
                        "1 - forecast hours / 168, where the errors climb), the errors per hour now (median "
                        "of the last 6 hours' hourly counts) and the hours until that rate, growing as it "
                        "did against the day before, reaches the part's failure rate. ComponentFailureForecast "
                        "warns at 72 hours; drain at the job's next checkpoint (runbook)."
                    ),
                    width=24,
                    needs="precursor rules (errors on some part)",
                ),
            ),
        ),
    ),
)

STACK_HEALTH = Dashboard(
    uid="fleetsight-stack-health",
    title="FleetSight: monitoring stack health",
    persona="sysadmin",
    question="Is the monitoring itself working?",
    tags=("fleetsight", "stack"),
    variables=(CLUSTER,),
    rows=(
        Row(
            "Scrapes",
            (
                Panel(
                    "Scrape targets down", "stat", (q("count(up == 0) or vector(0)", instant=True),), width=6
                ),
                Panel("Targets up per job", "timeseries", (q("sum by (job) (up)", "{{job}}"),), width=18),
                Panel(
                    "Collectors failing (node agent and fabric exporter)",
                    "table",
                    (q("fleetsight_collector_success == 0", instant=True),),
                    width=24,
                ),
            ),
        ),
    ),
)

FLEET = Dashboard(
    uid="fleetsight-fleet",
    title="FleetSight: the fleet's clusters",
    persona="sysadmin",
    question="Which clusters answer, and what is firing where?",
    variables=(CLUSTER,),
    rows=(
        Row(
            "Clusters",
            (
                Panel(
                    "Health service answers the global layer (1 yes, 0 no)",
                    "bargauge",
                    (q("max by (cluster) (fleetsight_fleet_cluster_up)", "{{cluster}}", instant=True),),
                    description="As the global layer (fleetsight fleet serve) saw it on its last request or "
                    "poll: a 0 is a cluster it could not read (FleetClusterMissing).",
                    width=8,
                    needs="global layer",
                ),
                Panel(
                    "Metrics answer the global Thanos Query (1 yes, 0 no)",
                    "bargauge",
                    (
                        q(
                            "max by (cluster) (fleetsight_fleet_cluster_metrics_up)",
                            "{{cluster}}",
                            instant=True,
                        ),
                    ),
                    description="Thanos Query leaves a store that is down out of its answers without a "
                    "warning: a 0 here is a cluster missing from every fleet-wide sum.",
                    width=8,
                    needs="global layer with --thanos-url",
                ),
                Panel(
                    "GPUs reporting, by cluster",
                    "bargauge",
                    (q(GPUS_BY_CLUSTER, "{{cluster}}", instant=True),),
                    width=8,
                ),
                Panel(
                    "Firing alerts, by cluster",
                    "bargauge",
                    (q(FIRING_BY_CLUSTER, "{{cluster}}", instant=True),),
                    width=8,
                ),
                Panel(
                    "Nodes by health state, by cluster",
                    "bargauge",
                    (
                        q(
                            "count by (cluster, state) (fleetsight_node_health_state == 1)",
                            "{{cluster}} {{state}}",
                            instant=True,
                        ),
                    ),
                    width=16,
                    needs="health service",
                ),
                Panel(
                    "Firing alerts with their cluster (click for the runbook)",
                    "table",
                    (q(FIRING, instant=True),),
                    width=24,
                    link=RUNBOOKS + "/${__data.fields.alertname}.md",
                ),
            ),
        ),
    ),
)
