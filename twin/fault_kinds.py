"""The catalogue of what a scenario may inject: every fault kind, grouped by what it is (a hardware
fault, a benign disturbance, a silent fault, a switch's, not the hardware), and per kind what its
magnitude means, the range physics allows and the target keys it understands.

Its own module because three readers share it and none owns it: the scenario loader checks faults
against it (twin/scenario_faults.py), the simulator acts on the kinds (twin/injection.py and the
handlers it composes), and the truth marks kinds that are not the hardware.
"""

from __future__ import annotations

FAULT_KINDS = (
    "psu_failure",
    "thermal_throttle",
    "pcie_downgrade",
    "ib_link_flap",
    "ib_port_down",
    "xid",
    "hbm_row_remap",
    "host_crash",
    "nvswitch_fatal",
    "lustre_ost_slow",
    "gray_slow_node",
    "loss_spike",
)
# What training itself does to a whole job, by design or by the researcher's plan: benign too, and
# targeted at a job, not a node (twin/training_kinds.py). Never drawn at random: a scenario names them.
TRAINING_KINDS = (
    "checkpoint_stall",  # every rank idles while the checkpoint is written; ranks resume seconds apart
    "eval_pause",  # the job stops training for an evaluation pass: forward passes only, no steps
    "moe_imbalance",  # expert routing loads one node more than the rest; the busiest moves every few min
    "pipeline_bubble",  # pipeline stages idle by design; the first and last stage carry the most work
    "job_resize",  # the job stops and restarts on more or fewer nodes
)
# Disturbances a healthy cluster has: listed in the truth with "benign": true (false flags if flagged).
BENIGN_KINDS = ("dataloader_hiccup", "os_jitter", "slow_rank_logging", *TRAINING_KINDS)
# Faults no passive signal shows, found only by an intrusive check (twin/checks.py answers them); apart
# from FAULT_KINDS so that drawn scenarios (which draw from FAULT_KINDS) stay what they were.
SILENT_KINDS = ("hbm_silent_corruption",)
# Faults of a fabric switch, not of a node: their target is a leaf switch (twin/hardware.py Topology),
# and every host cabled to it sees them. Apart from FAULT_KINDS for the same reason as SILENT_KINDS.
SWITCH_KINDS = ("leaf_flap",)
# What goes wrong that is not the node's hardware: FleetSight's own sources going silent or blind, the
# operator's mistakes, an application's errors. Listed in the truth with "hardware": false, so that an
# evaluation counts a drain for one of them as a wrong drain. Apart from FAULT_KINDS for the same reason.
NOT_HARDWARE_KINDS = (
    "telemetry_dropout",  # a source stops answering on a node: dcgm-exporter, the node agent or the BMC
    "profiling_dropout",  # DCGM's profiling fields read 0 (the profiling module taken by another client)
    "xid_storm",  # one application Xid logged many times on one GPU
    "job_crash_xids",  # an application Xid on every GPU of every node of one job at once
    "check_tool_missing",  # an active check's tool is not installed on a node
    "fabric_manager_down",  # NVIDIA Fabric Manager stops on a node
)
# The fabric's gray failures (twin/fabric_gray_faults.py): a port cut for under a second between two
# scrapes, a link trained at fewer lanes or a lower speed, a link whose errors climb until it fails.
# Hardware faults, apart from FAULT_KINDS for the same reason as SILENT_KINDS.
FABRIC_GRAY_KINDS = ("ib_flash_cut", "ib_lane_downshift", "ib_degrading_link")
# Congestion on a leaf: ports wait for credits with no faulty link. Not the hardware ("hardware": false
# in the truth: nothing to replace, nobody to page).
FABRIC_NOT_HARDWARE_KINDS = ("ib_congestion",)
# Hardware that announces its failure: error counters that climb for hours to days until the part fails
# (twin/precursor_faults.py). Apart from FAULT_KINDS for the same reason as SILENT_KINDS.
PRECURSOR_KINDS = ("nvlink_degrading", "hbm_degrading")
# Silent data corruption in training (twin/sdc_faults.py): one data-parallel replica's updates are
# wrong without a NaN; only the job's own logs show it. Hardware, apart from FAULT_KINDS for the same
# reason as SILENT_KINDS.
SDC_KINDS = ("sdc_training",)
# Stragglers with no GPU signature (twin/pace_faults.py): a node's NIC that paces the job's all-reduce, a
# node's host whose data loader falls behind. Only the job's own pace shows them. Hardware, apart from
# FAULT_KINDS for the same reason as SILENT_KINDS.
PACE_KINDS = ("slow_nic", "slow_host")
ALL_KINDS = (
    FAULT_KINDS
    + BENIGN_KINDS
    + SILENT_KINDS
    + SWITCH_KINDS
    + NOT_HARDWARE_KINDS
    + FABRIC_GRAY_KINDS
    + FABRIC_NOT_HARDWARE_KINDS
    + PRECURSOR_KINDS
    + SDC_KINDS
    + PACE_KINDS
)
# telemetry_dropout's sources: the canonical name, and the other spellings a scenario may use.
TELEMETRY_SOURCES = {
    "dcgm-exporter": ("dcgm-exporter", "dcgm_exporter", "dcgm"),
    "node_agent": ("node_agent", "node agent", "node-agent", "fleetsight-node"),
    "bmc": ("bmc", "redfish"),
}
# check_tool_missing's tools: the checks catalogue's tool names (checks/tools.yml), and other spellings.
CHECK_TOOLS = {
    "dcgmi": ("dcgmi",),
    "gpu_probe": ("gpu_probe", "gpu-probe", "fleetsight-gpu-probe"),
    "ib_write_bw": ("ib_write_bw",),
}
# The Xids an application causes (Fire-Flyer's "software-triggered" codes: the GPU is fine, the process
# faulted or was killed): the only codes of xid_storm and job_crash_xids, whose truth says "not the
# hardware" (a hardware Xid is kind xid).
APPLICATION_XIDS = (13, 31, 43, 45)

# What "magnitude" means per kind, and its default.
DEFAULT_MAGNITUDE: dict[str, float] = {
    "psu_failure": 150.0,  # GPU power cap under the power brake, watts (IBM Vela: ~400 W -> ~150 W)
    "thermal_throttle": 0.6,  # SM clock ratio of the hot GPU
    "pcie_downgrade": 1.0,  # PCIe generation the link falls back to (1 = 2.5 GT/s)
    "ib_link_flap": 4.0,  # number of flaps during the fault
    "ib_port_down": 1.0,
    "xid": 0.0,  # the Xid code; 0 = drawn from Fire-Flyer's shares
    "hbm_row_remap": 1.0,  # rows marked for remapping
    "host_crash": 1.0,
    "nvswitch_fatal": 1.0,
    "lustre_ost_slow": 20.0,  # latency multiplier of the OST
    "gray_slow_node": 1.3,  # compute-time multiplier of the node
    "loss_spike": 4.0,  # loss multiplier
    "hbm_silent_corruption": 1.0,  # HBM cells that flip under a memory test (DCGM level 4 memtest)
    "sdc_training": 0.2,  # relative error of the corrupt replica's local gradient (0.2: its norm x1.2)
    "slow_nic": 1.6,  # all-reduce time multiplier: a 400 Gb/s NIC whose PCIe Gen5 link trained at x8
    "slow_host": 0.15,  # the node's data-loader shortfall per step, as a share of the healthy step
    "leaf_flap": 4.0,  # times every port of the leaf goes down and up during the fault
    "dataloader_hiccup": 10.0,  # seconds the node's data loader stalls
    "os_jitter": 1.04,  # compute-time multiplier of the node
    "slow_rank_logging": 1.02,  # compute-time multiplier of the node whose rank logs slowly
    "checkpoint_stall": 6.0,  # seconds between the first and the last node resuming after the write
    "eval_pause": 0.5,  # an evaluation pass's compute share of the time, against training's
    "moe_imbalance": 0.10,  # the busiest node's extra compute while expert routing favours it
    "pipeline_bubble": 0.06,  # the last stage's extra work (LM head and loss); the first stage half of it
    "job_resize": 1.0,
    "telemetry_dropout": 1.0,
    "profiling_dropout": 1.0,
    "xid_storm": 300.0,  # times the one Xid line is logged
    "job_crash_xids": 1.0,
    "check_tool_missing": 1.0,
    "fabric_manager_down": 1.0,
    "ib_flash_cut": 3.0,  # cuts over the fault, each 5 ms .. 0.8 s
    "ib_lane_downshift": 2.0,  # active lanes after the retrain (4X -> 2X); target speed: HDR for a speed fall
    "ib_degrading_link": 1e-9,  # post-FEC bit error rate the link reaches when it fails
    "ib_congestion": 1.25,  # communication-time multiplier of the jobs behind the congested leaf
    "nvlink_degrading": 300.0,  # NVLink recovery events over the fault ("hundreds" before the link died)
    "hbm_degrading": 1000.0,  # correctable (single-bit) ECC errors over the fault before the DBE
}

# The range of magnitudes physics allows, per kind (inclusive); outside it `validate` refuses.
MAGNITUDE_RANGE: dict[str, tuple[float, float, str]] = {
    "psu_failure": (50.0, 700.0, "a GPU power cap in W between 50 and the H100's 700 W TDP"),
    "thermal_throttle": (0.2, 0.99, "an SM clock ratio between 0.2 and 0.99"),
    "pcie_downgrade": (1.0, 4.0, "the PCIe generation the Gen5 link falls back to, 1..4"),
    "ib_link_flap": (1.0, 1000.0, "a number of flaps, 1..1000"),
    "ib_port_down": (1.0, 1.0, "1 (the port is down)"),
    "xid": (0.0, 200.0, "an Xid code 1..200, or 0 to draw one"),
    "hbm_row_remap": (1.0, 64.0, "rows marked for remapping, 1..64"),
    "host_crash": (1.0, 1.0, "1 (the host is down)"),
    "nvswitch_fatal": (1.0, 1.0, "1 (the NVSwitch is dead)"),
    "lustre_ost_slow": (1.0, 1000.0, "an OST latency multiplier, 1..1000"),
    "gray_slow_node": (1.001, 5.0, "a compute-time multiplier above 1 (slower), at most 5"),
    "loss_spike": (1.0, 1000.0, "a loss multiplier, 1..1000"),
    "hbm_silent_corruption": (1.0, 1.0, "1 (the GPU's HBM corrupts data silently)"),
    "sdc_training": (0.01, 5.0, "a relative gradient error of the corrupt replica, 0.01..5"),
    "slow_nic": (1.01, 10.0, "an all-reduce time multiplier 1.01..10"),
    "slow_host": (0.01, 2.0, "a data-loader shortfall of 0.01..2 healthy steps per step"),
    "leaf_flap": (1.0, 1000.0, "a number of flaps, 1..1000"),
    "dataloader_hiccup": (1.0, 120.0, "seconds of data-loader stall, 1..120"),
    "os_jitter": (1.0, 1.5, "a compute-time multiplier 1..1.5"),
    "slow_rank_logging": (1.0, 1.2, "a compute-time multiplier 1..1.2"),
    "checkpoint_stall": (0.0, 60.0, "seconds between the first and the last node resuming, 0..60"),
    "eval_pause": (0.05, 1.0, "the evaluation's compute share against training's, 0.05..1"),
    "moe_imbalance": (0.0, 0.25, "the busiest node's extra compute, 0..0.25 (capacity factor 1.25)"),
    "pipeline_bubble": (0.0, 0.5, "the last stage's extra work over a middle stage, 0..0.5"),
    "job_resize": (1.0, 1.0, "1 (the new node count is target.nodes)"),
    "telemetry_dropout": (1.0, 1.0, "1 (the source does not answer)"),
    "profiling_dropout": (1.0, 1.0, "1 (the profiling fields read 0)"),
    "xid_storm": (2.0, 10000.0, "the number of times the Xid line is logged, 2..10000"),
    "job_crash_xids": (1.0, 1.0, "1 (every GPU of the job logs the Xid once)"),
    "check_tool_missing": (1.0, 1.0, "1 (the tool is not installed)"),
    "fabric_manager_down": (1.0, 1.0, "1 (Fabric Manager is not running)"),
    "ib_flash_cut": (1.0, 100.0, "a number of sub-second cuts, 1..100"),
    "ib_lane_downshift": (1.0, 4.0, "the active lanes after the retrain, 1, 2 or 4 (4: speed only)"),
    "ib_degrading_link": (1e-12, 1e-6, "the post-FEC bit error rate at failure, 1e-12..1e-6"),
    "ib_congestion": (1.0, 3.0, "a communication-time multiplier 1..3"),
    "nvlink_degrading": (10.0, 100000.0, "NVLink recovery events before the link fails, 10..100000"),
    "hbm_degrading": (10.0, 1000000.0, "correctable ECC errors before the uncorrectable one, 10..1e6"),
}
# Target keys each kind understands (node is required unless noted in read_fault).
TARGET_KEYS: dict[str, set[str]] = {
    "psu_failure": {"node", "psu"},
    "thermal_throttle": {"node", "gpu"},
    "pcie_downgrade": {"node", "gpu", "gen", "width"},
    "ib_link_flap": {"node", "port", "width"},
    "ib_port_down": {"node", "port"},
    "xid": {"node", "gpu", "code"},
    "hbm_row_remap": {"node", "gpu"},
    "host_crash": {"node"},
    "nvswitch_fatal": {"node", "nvswitch"},
    "lustre_ost_slow": {"ost"},
    "gray_slow_node": {"node"},
    "loss_spike": {"job", "node"},
    "hbm_silent_corruption": {"node", "gpu"},
    "sdc_training": {"job", "node"},  # node: the corrupt GPU's node (its replica); job: default its job
    "slow_nic": {"node"},
    "slow_host": {"node"},
    "leaf_flap": {"switch"},
    "dataloader_hiccup": {"node"},
    "os_jitter": {"node"},
    "slow_rank_logging": {"node", "rank"},
    "checkpoint_stall": {"job"},
    "eval_pause": {"job"},
    "moe_imbalance": {"job", "every"},  # every: how long one node stays the busiest (default 3m)
    "pipeline_bubble": {"job", "micro_batches"},  # micro_batches: per step and replica (default 8)
    "job_resize": {"job", "nodes"},  # nodes: the count it restarts on
    "telemetry_dropout": {"node", "source"},
    "profiling_dropout": {"node", "gpu"},  # no gpu: every GPU of the node (the usual case)
    "xid_storm": {"node", "gpu", "code"},
    "job_crash_xids": {"job", "code"},
    "check_tool_missing": {"node", "tool"},
    "fabric_manager_down": {"node"},
    "ib_flash_cut": {"node", "port", "cut_s"},  # cut_s: the longest cut in seconds (default 0.8)
    "ib_lane_downshift": {"node", "port", "speed"},  # speed: NDR (default), HDR or EDR after the retrain
    "ib_degrading_link": {"node", "port"},
    "ib_congestion": {"node", "port"},  # the leaf this port is cabled to congests: all its hosts wait
    "nvlink_degrading": {"node", "gpu"},
    "hbm_degrading": {"node", "gpu"},
}
# Target keys a kind cannot do without (node aside: read_fault checks it), and what they mean.
REQUIRED_TARGET: dict[str, tuple[str, str]] = {
    "telemetry_dropout": ("source", "the source that stops answering: dcgm-exporter, node_agent or bmc"),
    "job_crash_xids": ("job", "the id of the job that crashes (one of jobs)"),
    "check_tool_missing": ("tool", "the missing tool: dcgmi, gpu_probe or ib_write_bw"),
    **{kind: ("job", "the id of the job it acts on (one of jobs)") for kind in TRAINING_KINDS},
}
# How long an event lasts when the scenario does not say, where the generic 10 minutes would not fit.
DEFAULT_DURATION: dict[str, str] = {
    "checkpoint_stall": "90s",  # NVIDIA Eos, a 340B Megatron-LM run: a checkpoint lasts ~90 s
    "eval_pause": "4m",  # Megatron-LM's 100 evaluation iterations, forward only, of a ~7 s step
    "job_resize": "60s",  # requeue to restart, as a job's restart_delay
    "ib_degrading_link": "36h",  # symbol errors climb for a day and a half before the link fails
    "nvlink_degrading": "72h",  # NVLink errors climb for days before the link fails (docs/twin.md)
    "hbm_degrading": "72h",  # correctable errors and remaps climb for days before the DBE
}
