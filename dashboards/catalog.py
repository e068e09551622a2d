# ruff: noqa: E501  (PromQL reads best on one line; the queries are the point of this file)
"""What each persona's dashboard shows: the question it answers, its panels and their queries.

Plain data, so that one test can run every query against a real Prometheus and another can rebuild
the JSON (dashboards/build.py) and compare it with the committed files. Queries use the names that
dcgm-exporter, the node agent, the fabric exporter, the rules (``ALERTS``) and the anomaly and health
services publish; ``$node``, ``$hpc_job`` and ``$__range``-style variables are Grafana's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetsight.dcgm import promql_selector_any

PROMETHEUS = "thanos"  # datasource uid (dashboards/provisioning/datasources/thanos.yml)
LOGS = "logs"  # datasource uid (dashboards/provisioning/datasources/logs.yml)
RUNBOOKS = "https://github.com/fleetsight/fleetsight/blob/main/docs/runbooks"
# The clock-event reasons (field 112) under its current or legacy name, whichever the counters file
# publishes; `max without (__name__)` makes a GPU seen under both one series (counted once).
CLOCK_EVENTS = f"max without (__name__) ({promql_selector_any('DCGM_FI_DEV_CLOCKS_EVENT_REASONS')})"
# PromQL has no bitwise operators: bit b of the clock-event reasons is floor(x / b) % 2.
POWER_BRAKE = f"floor({CLOCK_EVENTS} / 128) % 2 == 1"
THERMAL = f"(floor({CLOCK_EVENTS} / 32) % 2 + floor({CLOCK_EVENTS} / 64) % 2) > 0"


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


JOB = 'hpc_job="$hpc_job"'
# The job's nodes from the one job identity: node:hpc_job:current (rules/recording.yml) is the anomaly
# service's fleetsight_job_node_info (Slurm, hpc_job or Kubernetes pod labels), and dcgm-exporter's hpc_job
# label where that service publishes nothing (a Slurm fleet without it, a backfilled history).
JOB_NODES = f"max by (node) (node:hpc_job:current{{{JOB}}})"
# ... and every node the job held during the dashboard's range: a node the job lost to a fault still counts.
JOB_NODES_IN_RANGE = f"max by (node) (max_over_time(node:hpc_job:current{{{JOB}}}[$__range]))"
NODE = 'node="$node"'

MY_JOB = Dashboard(
    uid="fleetsight-my-job",
    title="FleetSight: my job",
    persona="researcher",
    question="Is my job healthy, and if it is slow, which node slows it and why?",
    variables=(Variable("hpc_job", "Job", "label_values(node:hpc_job:current, hpc_job)"),),
    rows=(
        Row(
            "Who sets the pace",
            (
                Panel(
                    "GPU power per node (a straggler is the one that stays high)",
                    "heatmap",
                    (q(f"avg by (node) (DCGM_FI_DEV_POWER_USAGE and on (node) {JOB_NODES})", "{{node}}"),),
                    unit="watt",
                    description="Each row is a node of the job. In a synchronous job the slow node keeps "
                    "working while its peers wait, so its power stays up while theirs falls.",
                ),
                Panel(
                    "Tensor-core activity per node",
                    "heatmap",
                    (
                        q(
                            f"avg by (node) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE and on (node) {JOB_NODES})",
                            "{{node}}",
                        ),
                    ),
                    unit="percentunit",
                ),
                Panel(
                    "Phases: checkpoint or stall (every node of the job idles at once)",
                    "statushistory",
                    (
                        q(
                            f"avg(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE and on (node) {JOB_NODES}) < bool 0.3 * "
                            f"avg(avg_over_time(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE[30m]) and on (node) {JOB_NODES})",
                            "idle",
                        ),
                    ),
                    description="1 while the whole job idles together: a checkpoint write or a data-loader stall, "
                    "not a straggler. (A panel, not an annotation: Grafana 12's schema types annotation "
                    "queries for its own datasource only.)",
                    width=24,
                    height=4,
                ),
                Panel(
                    "Straggler flags and their cause",
                    "table",
                    (q(f"max by (node, cause) (fleetsight_straggler{{{JOB}}}) == 1", instant=True),),
                    link=f"{RUNBOOKS}/StragglerNode.md",
                    needs="anomaly service",
                ),
                Panel(
                    "Straggler score per node",
                    "timeseries",
                    (q(f"max by (node) (fleetsight_straggler_score{{{JOB}}})", "{{node}}"),),
                    needs="anomaly service",
                ),
            ),
        ),
        Row(
            "Progress (from the job's logs)",
            (
                Panel(
                    "Step time",
                    "timeseries",
                    (
                        Query(
                            "fleetsight.hpc_job:$hpc_job AND event.action:training_progress",
                            "step time",
                            datasource=LOGS,
                            metric="training.step_time_ms",
                        ),
                    ),
                    unit="ms",
                    needs="logs",
                ),
                Panel(
                    "Loss",
                    "timeseries",
                    (
                        Query(
                            "fleetsight.hpc_job:$hpc_job AND event.action:training_progress",
                            "loss",
                            datasource=LOGS,
                            metric="training.loss",
                        ),
                    ),
                    needs="logs",
                ),
            ),
        ),
        Row(
            "Trouble on the job's nodes",
            (
                Panel(
                    "Firing alerts on the job's nodes",
                    "table",
                    (q(f'ALERTS{{alertstate="firing"}} and on (node) {JOB_NODES}', instant=True),),
                    link=RUNBOOKS + "/${__data.fields.alertname}.md",
                ),
                Panel(
                    "The job's faults over the range (firing and resolved)",
                    "table",
                    (
                        q(
                            "max by (alertname, severity, node, gpu, device, port, switch, switch_port) "
                            '(max_over_time(ALERTS{alertstate="firing"}[$__range])) '
                            f"and on (node) {JOB_NODES_IN_RANGE}",
                            instant=True,
                        ),
                    ),
                    description="Every alert that fired on a node of the job during the dashboard's range, "
                    "resolved ones included: GPU, node and InfiniBand (a leaf-switch port names the host "
                    "behind it). The same list with first/last seen and evidence: the health API's "
                    "GET /v1/jobs/<job>/faults.",
                    link=RUNBOOKS + "/${__data.fields.alertname}.md",
                    width=24,
                ),
                Panel(
                    "Xids on the job's nodes",
                    "timeseries",
                    (
                        q(
                            f"sum by (node, xid) (increase(fleetsight_gpu_xid_errors_total[$__rate_interval])) "
                            f"and on (node) {JOB_NODES}",
                            "{{node}} Xid {{xid}}",
                        ),
                    ),
                    needs="an Xid",
                ),
                Panel(
                    "Job's Lustre read and write (jobstats)",
                    "timeseries",
                    (
                        q(
                            f"sum(rate(fleetsight_lustre_job_read_bytes_total{{{JOB}}}[$__rate_interval]))",
                            "read",
                        ),
                        q(
                            f"sum(rate(fleetsight_lustre_job_write_bytes_total{{{JOB}}}[$__rate_interval]))",
                            "write",
                        ),
                    ),
                    unit="Bps",
                    needs="Lustre server jobstats",
                ),
                Panel(
                    "GPU-hours lost to failures (nodes with a critical alert)",
                    "stat",
                    (
                        q(
                            f'8 * sum(sum_over_time((count by (node) (ALERTS{{alertstate="firing", severity="critical"}}) '
                            f"and on (node) {JOB_NODES})[$__range:1m])) / 60",
                            instant=True,
                        ),
                    ),
                    unit="h",
                ),
            ),
        ),
    ),
)

FLEET_HEALTH = Dashboard(
    uid="fleetsight-fleet-health",
    title="FleetSight: fleet health",
    persona="sysadmin",
    question="What is broken right now, where, and what do I do about it?",
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
                    "GPUs with a power brake or a failed PSU",
                    "timeseries",
                    (
                        q(f"count by (node) ({POWER_BRAKE})", "{{node}} power brake"),
                        q("count by (node) (fleetsight_bmc_psu_healthy == 0)", "{{node}} PSU failed"),
                    ),
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

NODE_DRILLDOWN = Dashboard(
    uid="fleetsight-node",
    title="FleetSight: one node",
    persona="sysadmin",
    question="Everything about this one node.",
    variables=(Variable("node", "Node", "label_values(DCGM_FI_DEV_POWER_USAGE, node)"),),  # GPU nodes
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
    ),
)

POWER_AND_COOLING = Dashboard(
    uid="fleetsight-power",
    title="FleetSight: power and cooling",
    persona="facilities",
    question="Are we within power and cooling limits, and which racks or GPUs are near them?",
    variables=(Variable("node_capacity_watts", "Power capacity per node (W)", "10200", constant=True),),
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

FLEET_KPIS = Dashboard(
    uid="fleetsight-kpis",
    title="FleetSight: fleet KPIs",
    persona="executive",
    question="Are we getting the training we pay for?",
    variables=(Variable("price_per_kwh", "Energy price per kWh", "0.12", constant=True),),
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

STACK_HEALTH = Dashboard(
    uid="fleetsight-stack-health",
    title="FleetSight: monitoring stack health",
    persona="sysadmin",
    question="Is the monitoring itself working?",
    tags=("fleetsight", "stack"),
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

DASHBOARDS: tuple[Dashboard, ...] = (
    MY_JOB,
    FLEET_HEALTH,
    NODE_DRILLDOWN,
    POWER_AND_COOLING,
    FLEET_KPIS,
    STACK_HEALTH,
)
