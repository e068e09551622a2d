"""The twin's network-facing views, each in its real protocol's format: a Redfish BMC's
Chassis/Power/PowerSubsystem resources, UFM's REST resources and events, a slurmrestd 23.11's v0.0.40
jobs and nodes lists and Prometheus http_sd targets. dcgm-exporter's page is twin/dcgm.py's, generated
from the counters file."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np

from . import dcgm
from . import hardware as hw
from . import sim as simmod
from .sim import Simulation, hostlist

# ---------------------------------------------------------------------------------------- Redfish
CHASSIS_ID = "1"


def _odata(path: str, kind: str, **body: Any) -> dict[str, Any]:
    return {"@odata.id": path, "@odata.type": kind, **body}


# The one chassis's resources, as @odata.id links rooted at /redfish/v1 (a client appends them to the
# BMC's base URL). Each function below is one resource's body; twin/api.py routes a path to it.
CHASSIS = f"/redfish/v1/Chassis/{CHASSIS_ID}"
SUPPLIES = f"{CHASSIS}/PowerSubsystem/PowerSupplies"


def psu_count(sim: Simulation) -> int:
    return int(sim.psu_ok.shape[1])


def service_root(sim: Simulation, node: int) -> dict[str, Any]:
    return _odata(
        "/redfish/v1",
        "#ServiceRoot.v1_15_0.ServiceRoot",
        Id="RootService",
        Name="Root Service",
        RedfishVersion="1.17.0",
        UUID=sim.gpu_uuids[node][0].removeprefix("GPU-"),
        Chassis={"@odata.id": "/redfish/v1/Chassis"},
        Systems={"@odata.id": "/redfish/v1/Systems"},
        Managers={"@odata.id": "/redfish/v1/Managers"},
    )


def chassis_collection(sim: Simulation, node: int) -> dict[str, Any]:
    return _odata(
        "/redfish/v1/Chassis",
        "#ChassisCollection.ChassisCollection",
        Name="Chassis Collection",
        Members=[{"@odata.id": CHASSIS}],
        **{"Members@odata.count": 1},
    )


def chassis(sim: Simulation, node: int) -> dict[str, Any]:
    return _odata(
        CHASSIS,
        "#Chassis.v1_21_0.Chassis",
        Id=CHASSIS_ID,
        Name="Computer System Chassis",
        ChassisType="RackMount",
        Manufacturer="NVIDIA",
        Model="DGXH100",
        SerialNumber=f"TWIN{node:06d}",
        PowerState="On" if sim.alive[node] else "Off",
        Status={
            "State": "Enabled",
            "Health": _chassis_health(sim, node),
            "HealthRollup": _chassis_health(sim, node),
        },
        Power={"@odata.id": f"{CHASSIS}/Power"},
        PowerSubsystem={"@odata.id": f"{CHASSIS}/PowerSubsystem"},
    )


def power_subsystem(sim: Simulation, node: int) -> dict[str, Any]:
    psus = psu_count(sim)
    return _odata(
        f"{CHASSIS}/PowerSubsystem",
        "#PowerSubsystem.v1_1_0.PowerSubsystem",
        Id="PowerSubsystem",
        Name="Power Subsystem",
        CapacityWatts=3300.0 * psus,
        Allocation={"AllocatedWatts": 10200.0, "RequestedWatts": 10200.0},
        Status={"State": "Enabled", "Health": _chassis_health(sim, node)},
        PowerSupplies={"@odata.id": SUPPLIES},
        PowerSupplyRedundancy=[
            {
                "RedundancyType": "NPlusM",
                "MaxSupportedInGroup": psus,
                "MinNeededInGroup": psus - 2,
                # Required by DMTF's Redundancy schema (RedundantGroup): the supplies in the group.
                "RedundancyGroup": [{"@odata.id": f"{SUPPLIES}/PSU{i}"} for i in range(psus)],
                "Status": {"State": "Enabled", "Health": _chassis_health(sim, node)},
            }
        ],
    )


def power_supplies(sim: Simulation, node: int) -> dict[str, Any]:
    psus = psu_count(sim)
    return _odata(
        SUPPLIES,
        "#PowerSupplyCollection.PowerSupplyCollection",
        Name="Power Supply Collection",
        Members=[{"@odata.id": f"{SUPPLIES}/PSU{i}"} for i in range(psus)],
        **{"Members@odata.count": psus},
    )


def _chassis_health(sim: Simulation, node: int) -> str:
    return "OK" if sim.psu_ok[node].all() else "Critical"


def _psu_output(sim: Simulation, node: int) -> np.ndarray:
    ok = sim.psu_ok[node]
    share = sim.node_input_w[node] / max(1, int(ok.sum()))
    return np.where(ok, share, 0.0)


def psu(sim: Simulation, node: int, i: int) -> dict[str, Any]:
    path = f"{SUPPLIES}/PSU{i}"
    ok = bool(sim.psu_ok[node, i])
    return _odata(
        path,
        "#PowerSupply.v1_5_0.PowerSupply",
        Id=f"PSU{i}",
        Name=f"Power Supply {i}",
        Manufacturer="Delta",
        Model="ECD16010092",
        SerialNumber=f"DTW{node:05d}{i}",
        PowerSupplyType="AC",
        PowerCapacityWatts=3300.0,
        LineInputStatus="Normal" if ok else "LossOfInput",
        Status={"State": "Enabled" if ok else "UnavailableOffline", "Health": "OK" if ok else "Critical"},
        Metrics={"@odata.id": f"{path}/Metrics"},
    )


def psu_metrics(sim: Simulation, node: int, i: int) -> dict[str, Any]:
    path = f"{SUPPLIES}/PSU{i}/Metrics"
    watts = float(_psu_output(sim, node)[i])
    volts = 230.0 + (node * 7 + i) % 5 * 0.4 if sim.psu_ok[node, i] else 0.0
    return _odata(
        path,
        "#PowerSupplyMetrics.v1_1_0.PowerSupplyMetrics",
        Id="Metrics",
        Name=f"Metrics for Power Supply {i}",
        InputVoltage={"Reading": round(volts, 1)},
        InputCurrentAmps={"Reading": round(watts / volts, 2) if volts else 0.0},
        InputPowerWatts={"Reading": round(watts, 1)},
        OutputPowerWatts={"Reading": round(watts * 0.94, 1)},
        TemperatureCelsius={"Reading": round(31.0 + watts / 200.0, 1)},
    )


def power(sim: Simulation, node: int) -> dict[str, Any]:
    outputs = _psu_output(sim, node)
    supplies = []
    for i in range(sim.psu_ok.shape[1]):
        ok = bool(sim.psu_ok[node, i])
        supplies.append(
            {
                "@odata.id": f"{CHASSIS}/Power#/PowerSupplies/{i}",
                "MemberId": str(i),
                "Name": f"PSU{i}",
                "PowerSupplyType": "AC",
                "LineInputVoltageType": "ACHighLine",
                "LineInputVoltage": 230.0 if ok else 0.0,
                "PowerCapacityWatts": 3300.0,
                "PowerInputWatts": round(float(outputs[i]), 1),
                "PowerOutputWatts": round(float(outputs[i]) * 0.94, 1),
                "LastPowerOutputWatts": round(float(outputs[i]) * 0.94, 1),
                "Status": {
                    "State": "Enabled" if ok else "UnavailableOffline",
                    "Health": "OK" if ok else "Critical",
                },
            }
        )
    consumed = round(float(sim.node_input_w[node]), 1)
    brake = not sim.psu_ok[node].all()
    return _odata(
        f"{CHASSIS}/Power",
        "#Power.v1_7_1.Power",
        Id="Power",
        Name="Power",
        PowerControl=[
            {
                "@odata.id": f"{CHASSIS}/Power#/PowerControl/0",
                "MemberId": "0",
                "Name": "Chassis Power Control",
                "PowerConsumedWatts": consumed,
                "PowerCapacityWatts": 3300.0 * len(supplies),
                "PowerLimit": {
                    "LimitInWatts": 3200.0 if brake else None,
                    "LimitException": "HardPowerOff" if brake else "NoAction",
                },
                "PowerMetrics": {"IntervalInMin": 1, "AverageConsumedWatts": consumed},
                "Status": {"State": "Enabled", "Health": _chassis_health(sim, node)},
            }
        ],
        PowerSupplies=supplies,
    )


# ---------------------------------------------------------------------------------------- UFM
SPEED_NAME = {100: "NDR", 50: "HDR", 25: "EDR"}  # Gb/s per lane -> UFM's active_speed


def ufm_ports(sim: Simulation) -> list[dict[str, Any]]:
    """UFM's /ufmRest/resources/ports: every HCA port and the leaf port it is cabled to."""
    seed = sim.scenario.seed
    ports: list[dict[str, Any]] = []
    for index, node in enumerate(sim.nodes):
        alive = bool(sim.alive[index])
        for p, device in enumerate(hw.IB_DEVICES):
            guid = hw.hca_guid(seed, node, p)
            leaf, leaf_port = sim.topology.leaf(index, p)
            leaf_guid = hw.switch_guid(seed, leaf)
            up = alive and bool(sim.ib_up[index, p])
            width = f"{int(sim.ib_width[index, p])}x"
            common = {
                "active_speed": SPEED_NAME.get(int(sim.ib_speed[index, p]), "NDR") if up else "",
                "active_width": width if up else "",
                "enabled_speed": ["SDR", "FDR", "EDR", "HDR", "NDR"],
                "supported_speed": ["SDR", "FDR", "EDR", "HDR", "NDR"],
                "enabled_width": ["1x", "2x", "4x"],
                "supported_width": ["1x", "2x", "4x"],
                "physical_state": "Link Up" if up else "Disabled",
                "logical_state": "Active" if up else "Down",
                "severity": "Info" if up else "Critical",
                "mtu": 4096,
            }
            ports.append(
                {
                    **common,
                    "name": f"{guid}_1",
                    "guid": guid,
                    "number": 1,
                    "external_number": 1,
                    "dname": f"{device}/1",
                    "description": "Computer IB Port",
                    "node_description": f"{node} {device}",
                    "system_name": node,
                    "systemID": guid,
                    "system_guid": guid,
                    "lid": index * 16 + p + 1,
                    "tier": 0,
                    "peer": f"{leaf_guid}_{leaf_port}",
                    "peer_guid": leaf_guid,
                    "peer_node_name": leaf,
                    "peer_node_description": leaf,
                    "peer_port_dname": str(leaf_port),
                    "peer_lid": 1000 + leaf_port,
                    "module": "N/A",
                    "capabilities": ["sm", "dr_notice", "cap_mask2"],
                }
            )
            ports.append(
                {
                    **common,
                    "name": f"{leaf_guid}_{leaf_port}",
                    "guid": leaf_guid,
                    "number": leaf_port,
                    "external_number": leaf_port,
                    "dname": str(leaf_port),
                    "description": "Switch IB Port",
                    "node_description": leaf,
                    "system_name": leaf,
                    "systemID": leaf_guid,
                    "system_guid": leaf_guid,
                    "lid": 1000 + leaf_port,
                    "tier": 1,
                    "peer": f"{guid}_1",
                    "peer_guid": guid,
                    "peer_node_name": node,
                    "peer_node_description": f"{node} {device}",
                    "peer_port_dname": f"{device}/1",
                    "peer_lid": index * 16 + p + 1,
                    "module": "N/A",
                    "capabilities": [],
                }
            )
    return ports


def ufm_systems(sim: Simulation) -> list[dict[str, Any]]:
    seed = sim.scenario.seed
    systems: list[dict[str, Any]] = []
    for index, node in enumerate(sim.nodes):
        guid = hw.hca_guid(seed, node, 0)
        systems.append(
            {
                "system_name": node,
                "system_guid": guid,
                "guid": guid,
                "type": "host",
                "model": "DGXH100",
                "vendor": "NVIDIA",
                "description": "Computer",
                "state": "active" if sim.alive[index] else "inactive",
                "severity": "Info" if sim.alive[index] else "Critical",
                "rack": sim.topology.rack(index),
                "ip": f"10.0.{index // 250}.{index % 250 + 1}",
                "ports": [f"{hw.hca_guid(seed, node, p)}_1" for p in range(len(hw.IB_DEVICES))],
            }
        )
    for leaf in sim.topology.leaves():
        guid = hw.switch_guid(seed, leaf)
        systems.append(
            {
                "system_name": leaf,
                "system_guid": guid,
                "guid": guid,
                "type": "switch",
                "model": "MQM9790",
                "vendor": "Mellanox",
                "description": "MQM9790 Mellanox Technologies",
                "state": "active",
                "severity": "Info",
                "rack": "network",
                "ip": "0.0.0.0",
                "ports": [],
            }
        )
    return systems


def ufm_telemetry_csv(sim: Simulation) -> str:
    """Port counters in UFM Telemetry's CSV layout (one row per HCA port)."""
    columns = (
        "timestamp,source_id,tag,Node_GUID,port_guid,Port_Number,Device_ID,node_description,"
        "PortXmitDataExtended,PortRcvDataExtended,PortXmitPktsExtended,PortRcvPktsExtended,"
        "SymbolErrorCounter,LinkDownedCounter,LinkErrorRecoveryCounter,PortRcvErrorsExtended,PortXmitWaitExtended"
    )
    rows = [columns]
    stamp = int(sim.unix() * 1e6)
    counters = sim.ib_counters
    for index, node in enumerate(sim.nodes):
        for p, device in enumerate(hw.IB_DEVICES):
            guid = hw.hca_guid(sim.scenario.seed, node, p)
            values = [
                int(counters[c][index, p])
                for c in (
                    "port_xmit_data",
                    "port_rcv_data",
                    "port_xmit_packets",
                    "port_rcv_packets",
                    "symbol_error",
                    "link_downed",
                    "link_error_recovery",
                    "port_rcv_errors",
                    "port_xmit_wait",
                )
            ]
            rows.append(
                f"{stamp},ufm,{node},0x{guid},0x{guid},1,4129,{node} {device}," + ",".join(map(str, values))
            )
    return "\n".join(rows) + "\n"


# ---------------------------------------------------------------------------------------- Slurm
def _number(value: float | None) -> dict[str, Any]:
    if value is None:
        return {"set": False, "infinite": False, "number": 0}
    return {"set": True, "infinite": False, "number": int(value)}


def slurm_jobs(sim: Simulation) -> dict[str, Any]:
    jobs = []
    # A job on Kubernetes (its own `scheduler` key, else the dcgm label mode) is no Slurm job.
    for job in (j for j in sim.jobs if dcgm.job_scheduler(sim.scenario.dcgm, j) != "kubernetes"):
        names = [sim.nodes[i] for i in job.nodes]
        count = job.resize_to or (job.spec.nodes if isinstance(job.spec.nodes, int) else len(job.spec.nodes))
        started = sim.unix(job.started_at) if job.started_at is not None else None
        ended = sim.unix(job.ended_at) if job.ended_at is not None and job.state != "PENDING" else None
        jobs.append(
            {
                "job_id": int(job.spec.id) if job.spec.id.isdigit() else job.spec.id,
                "name": job.spec.name,
                "user_name": job.spec.user,
                "partition": "batch",
                "account": "research",
                "job_state": [job.state] + (["REQUEUED"] if job.state == "PENDING" and job.attempt else []),
                "state_reason": "None" if job.state == "RUNNING" else (job.exit_reason or "Resources"),
                "nodes": hostlist(names) if job.state == "RUNNING" else "",
                "node_count": _number(count),
                "tasks": _number(count * simmod.G),
                "gres_detail": [f"gpu:h100:{simmod.G}(IDX:0-{simmod.G - 1})" for _ in names]
                if job.state == "RUNNING"
                else [],
                "restart_cnt": max(0, job.attempt - 1),
                "submit_time": _number(sim.unix(job.spec.start)),
                "start_time": _number(started),
                "end_time": _number(ended),
                "time_limit": _number((job.spec.end - job.spec.start) / 60.0),
                "requeue": job.spec.restart == "requeue",
                "comment": job.spec.slurm_comment,
            }
        )
    now = _number(sim.unix())
    return {"jobs": jobs, "last_backfill": now, "last_update": now, **_slurm_meta(sim)}


# slurmctld marks a node that stops answering its pings NOT_RESPONDING, and DOWN once SlurmdTimeout
# (300 s by default) has passed without an answer.
SLURMD_TIMEOUT_S = 300.0


def slurm_nodes(sim: Simulation) -> dict[str, Any]:
    """slurmrestd's ``GET /slurm/v0.0.40/nodes``: each node's state as slurmctld would see it."""
    running = {i: job for job in sim.jobs if job.state == "RUNNING" for i in job.nodes}
    silent_since = {
        fault.node: fault.spec.onset
        for fault in sim.active_faults
        if fault.spec.kind == "host_crash" and fault.node is not None
    }
    nodes = []
    for i, name in enumerate(sim.nodes):
        state = ["ALLOCATED"] if i in running else ["IDLE"]
        flags: list[str] = []
        reason = ""
        if not sim.alive[i]:
            flags = ["NOT_RESPONDING"]
            if sim.t - silent_since.get(i, sim.t) >= SLURMD_TIMEOUT_S:
                state, reason = ["DOWN"], "Not responding"
        nodes.append(
            {
                "name": name,
                "hostname": name,
                "address": name,
                "state": state + flags,
                "reason": reason,
                "reason_set_by_user": "slurm" if reason else "",
                "partitions": ["batch"],
                "gres": f"gpu:h100:{simmod.G}",
                "gres_used": f"gpu:h100:{simmod.G if i in running else 0}(IDX:"
                + (f"0-{simmod.G - 1})" if i in running else "N/A)"),
                "cpus": 224,
                "alloc_cpus": 224 if i in running else 0,
                "real_memory": 2_000_000,
            }
        )
    return {"nodes": nodes, "last_update": _number(sim.unix()), **_slurm_meta(sim)}


# data_parser/v0.0.40 first shipped with Slurm 23.11: the release the twin's shapes belong to.
SLURM_RELEASE = "23.11.10"


def _slurm_meta(sim: Simulation) -> dict[str, Any]:
    """slurmrestd 23.11's ``meta``: the openapi/slurmctld plugin, its data parser, slurm.conf's
    AccountingStorageType, and the version numbers as strings (22.05 and 23.02 gave integers)."""
    major, minor, micro = SLURM_RELEASE.split(".")
    return {
        "meta": {
            "plugin": {
                "type": "openapi/slurmctld",
                "name": "Slurm OpenAPI slurmctld",
                "data_parser": "data_parser/v0.0.40",
                "accounting_storage": "accounting_storage/slurmdbd",
            },
            "client": {"source": "fleetsight-twin", "user": "root", "group": "root"},
            "command": [],
            "slurm": {
                "version": {"major": major, "micro": micro, "minor": minor},
                "release": SLURM_RELEASE,
                "cluster": sim.scenario.cluster.name,
            },
        },
        "errors": [],
        "warnings": [],
    }


# ---------------------------------------------------------------------------------------- targets
def dcgm_targets(sim: Simulation, host: str) -> list[dict[str, Any]]:
    """Prometheus http_sd/file_sd: one target group per node, its metrics path as a label."""
    return [
        {
            "targets": [host],
            "labels": {
                "__metrics_path__": f"/dcgm/{node}/metrics",
                "node": node,
                "cluster": sim.scenario.cluster.name,
                "rack": sim.topology.rack(index),
            },
        }
        for index, node in enumerate(sim.nodes)
    ]


def iso_now(sim: Simulation) -> str:
    return dt.datetime.fromtimestamp(sim.unix(), dt.UTC).isoformat()
