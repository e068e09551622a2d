# ruff: noqa: E501  (PromQL reads best on one line; the queries are the point of this file)
"""The researcher's dashboard: is my job healthy, and if it is slow, which node slows it and why?

One module per persona, so that a change to what one persona sees touches only that persona's file.
Queries use the names that dcgm-exporter, the node agent, the rules (``ALERTS``) and the anomaly and
health services publish; ``$hpc_job`` and ``$__range``-style variables are Grafana's.
"""

from __future__ import annotations

from .common_queries import RUNBOOKS
from .model import CLUSTER, Dashboard, Panel, Row, Variable, by_cluster, logs, q

JOB = 'hpc_job="$hpc_job"'
# The job's nodes from the one job identity: node:hpc_job:current (rules/recording.yml) is the anomaly
# service's fleetsight_job_node_info (Slurm, hpc_job or Kubernetes pod labels), and dcgm-exporter's hpc_job
# label where that service publishes nothing (a Slurm fleet without it, a backfilled history).
JOB_NODES = f"max by (node) (node:hpc_job:current{{{JOB}}})"
# ... and every node the job held during the dashboard's range: a node the job lost to a fault still counts.
JOB_NODES_IN_RANGE = f"max by (node) (max_over_time(node:hpc_job:current{{{JOB}}}[$__range]))"

MY_JOB = Dashboard(
    uid="fleetsight-my-job",
    title="FleetSight: my job",
    persona="researcher",
    question="Is my job healthy, and if it is slow, which node slows it and why?",
    variables=(
        CLUSTER,
        Variable("hpc_job", "Job", by_cluster("label_values(node:hpc_job:current, hpc_job)")),
    ),
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
                        logs(
                            "fleetsight.hpc_job:$hpc_job AND event.action:training_progress",
                            "step time",
                            "training.step_time_ms",
                        ),
                    ),
                    unit="ms",
                    needs="logs",
                ),
                Panel(
                    "Loss",
                    "timeseries",
                    (
                        logs(
                            "fleetsight.hpc_job:$hpc_job AND event.action:training_progress",
                            "loss",
                            "training.loss",
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
                # Full width, after a full line of two: the builder places panels left to right and starts
                # a new line only once one is full, so a wide panel must start a line of its own.
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
