# ruff: noqa: E501  (real log lines are long; they stay whole)
"""Real-format log lines of every class and driver generation, with what the ingest pipeline must make
of each (a subset of the document, dotted keys). Where the twin writes the class, its lines are here in
the twin's format; Fabric Manager and BMC SEL lines follow the vendors' formats (the twin writes them on an
NVSwitch fatal error and a PSU failure, in those formats: twin/log_files.py)."""

from __future__ import annotations

from typing import Any, NamedTuple


class Sample(NamedTuple):
    log_class: str
    line: str
    expected: dict[str, Any]
    path: str = ""


RANK_LOG = "/var/log/jobs/4101/rank-13.log"

SAMPLES: list[Sample] = [
    # -- kernel: NVRM Xid, every driver generation ---------------------------------------------------
    Sample(  # R525 and later: pid and process name; ISO syslog time (the twin's kern.log)
        "kernel",
        "2026-11-21T10:08:00.000000+00:00 n0003 kernel: [1229615.939836] NVRM: Xid (PCI:0000:3a:00): 79, "
        "pid=57075, name=python3, GPU has fallen off the bus.",
        {
            "@timestamp": "2026-11-21T10:08:00.000Z",
            "event.action": "xid",
            "log.level": "error",
            "nvidia.xid.code": 79,
            "nvidia.xid.pci_bdf": "0000:3a:00",
            "nvidia.xid.pid": 57075,
            "nvidia.xid.process": "python3",
            "nvidia.xid.message": "GPU has fallen off the bus.",
            "nvidia.xid.category": "fallen_off_bus",
            "nvidia.xid.action": "reboot_node",
        },
    ),
    Sample(  # R450-R520: pid only; BSD syslog time
        "kernel",
        "Nov 21 10:08:00 n0003 kernel: [ 8123.456789] NVRM: Xid (PCI:0000:1b:00): 48, pid=1234, An uncorrectable "
        "double bit error (DBE) has been detected on GPU in the framebuffer at partition 3, subpartition 0.",
        {
            "nvidia.xid.code": 48,
            "nvidia.xid.pid": 1234,
            "nvidia.xid.pci_bdf": "0000:1b:00",
            "nvidia.xid.category": "memory_ecc",
            "nvidia.xid.action": "reset_gpu",
            "nvidia.xid.message": "An uncorrectable double bit error (DBE) has been detected on GPU in the "
            "framebuffer at partition 3, subpartition 0.",
        },
    ),
    Sample(  # older drivers: no pid at all
        "kernel",
        "Nov  1 10:08:00 n0003 kernel: NVRM: Xid (PCI:0000:b3:00): 63, Row Remapper: New row (0x000000000000abcd) "
        "is marked for remapping, reset gpu to activate.",
        {"nvidia.xid.code": 63, "nvidia.xid.pci_bdf": "0000:b3:00", "nvidia.xid.category": "memory_ecc"},
    ),
    Sample(  # very old drivers: no "PCI:" prefix; /dev/kmsg (dmesg) form
        "kernel",
        "[ 1234.567890] NVRM: Xid (0000:03:00): 13, 0004 00000000 0000a1c0 000013b4 00000000 00000000",
        {"nvidia.xid.code": 13, "nvidia.xid.pci_bdf": "0000:03:00", "nvidia.xid.action": "restart_app"},
    ),
    Sample(  # R535+ GSP era, unknown process
        "kernel",
        "[ 1234.567890] NVRM: Xid (PCI:0000:3a:00): 119, pid='<unknown>', name=<unknown>, Timeout after 6s of "
        "waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20800a4c 0x4).",
        {"nvidia.xid.code": 119, "nvidia.xid.category": "gsp", "nvidia.xid.action": "reset_gpu"},
    ),
    Sample(  # a code the catalogue does not know
        "kernel",
        "[ 1234.567890] NVRM: Xid (PCI:0000:3a:00): 999, pid=1, name=x, something new",
        {"nvidia.xid.code": 999, "nvidia.xid.category": "unknown", "nvidia.xid.action": "check_hardware"},
    ),
    # -- kernel: SXid / NVSwitch ------------------------------------------------------------------------
    Sample(
        "kernel",
        "2026-11-21T10:08:00.000000+00:00 n0001 kernel: [679631.862334] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): "
        "24007, Fatal, Link 28 sourcetrack TCEN0 crumbstore ECC DBE Error",
        {
            "event.action": "nvswitch_fatal",
            "log.level": "critical",
            "nvidia.sxid.code": 24007,
            "nvidia.sxid.switch": 2,
            "nvidia.sxid.pci_bdf": "0000:07:00.0",
            "nvidia.sxid.fatal": True,
        },
    ),
    Sample(
        "kernel",
        "2026-11-21T10:08:00.000000+00:00 n0001 kernel: [679631.862334] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): "
        "24007, Severity 1 Engine instance 28 Sub-engine instance 00",
        {"event.action": "sxid", "nvidia.sxid.fatal": False},
    ),
    # -- kernel: Lustre ------------------------------------------------------------------------------------
    Sample(
        "kernel",
        "2026-11-21T10:08:00.500000+00:00 n0001 kernel: [2922109.612490] LustreError: 11-0: "
        "lustre-OST0003-osc-ffff4d6ae7aa8576: operation ost_write to node 10.10.0.13@o2ib failed: rc = -107",
        {
            "event.action": "lustre_error",
            "lustre.device": "lustre-OST0003-osc-ffff4d6ae7aa8576",
            "lustre.operation": "ost_write",
            "lustre.nid": "10.10.0.13@o2ib",
            "lustre.rc": -107,
        },
    ),
    Sample(
        "kernel",
        "Nov 21 10:09:00 n0001 kernel: LustreError: 167-0: lustre-OST0002-osc-ffff8a0b3c4d5000: This client was "
        "evicted by lustre-OST0002; in progress operations using this service will fail.",
        {"event.action": "lustre_eviction", "lustre.target": "lustre-OST0002", "log.level": "error"},
    ),
    Sample(
        "kernel",
        "2026-11-21T10:08:00.500000+00:00 n0001 kernel: [2922109.612490] Lustre: 7513:0:(client.c:2295:"
        "ptlrpc_expire_one_request()) @@@ Request sent has timed out for slow reply: [sent 1795255580/real "
        "1795255580]  req@ffff57cb49acf07f x3971904174560960/t0(0) o4->lustre-OST0003-osc-ffff4d6ae7aa8576@"
        "10.10.0.13@o2ib:6/4 lens 488/448 e 0 to 1 dl 1795255680 ref 2 fl Rpc:XQr/0/ffffffff rc 0/-1 job:''",
        {"event.action": "lustre_timeout", "lustre.nid": "10.10.0.13@o2ib"},
    ),
    Sample(
        "kernel",
        "2026-11-21T10:08:00.500000+00:00 n0001 kernel: [2922109.612490] Lustre: lustre-OST0003-osc-ffff4d6ae7aa8576: "
        "Connection to lustre-OST0003 (at 10.10.0.13@o2ib) was lost; in progress operations using this service "
        "will wait for recovery to complete",
        {"event.action": "lustre_connection_lost", "lustre.target": "lustre-OST0003"},
    ),
    # -- kernel: IB link ------------------------------------------------------------------------------------
    Sample(
        "kernel",
        "2026-11-21T10:09:40.000000+00:00 n0004 kernel: [3134916.473307] mlx5_core 0000:3c:00.0: "
        "mlx5_port_change_event:307:(pid 0): Link down",
        {"event.action": "ib_link_down", "ib.pci_bdf": "0000:3c:00.0", "ib.state": "down"},
    ),
    Sample(
        "kernel",
        "2026-11-21T10:09:50.200000+00:00 n0004 kernel: [3134926.673307] ibp60s0: Link up",
        {"event.action": "ib_link_up", "ib.netdev": "ibp60s0"},
    ),
    Sample(
        "kernel",
        "2026-11-21T10:09:50.200000+00:00 n0004 kernel: [3134926.673307] mlx5_ib: mlx5_2: port 1 state changed to "
        "ACTIVE",
        {"event.action": "ib_port_state", "ib.device": "mlx5_2", "ib.port": 1, "ib.state": "active"},
    ),
    Sample(  # an ordinary kernel line: known envelope, no event of ours: kept, not a failure
        "kernel",
        "2026-11-21T10:16:02.000000+00:00 n0003 kernel: [    3.000000] nvidia: loading out-of-tree module taints "
        "kernel.",
        {"event.action": "kernel_message", "tags": None},
    ),
    # -- Fabric Manager ------------------------------------------------------------------------------------
    Sample(
        "fabricmanager",
        "[Mar 07 2024 11:52:28] [ERROR] [tid 1234] detected NVSwitch fatal error 24007 on fid 0 on NVSwitch pci "
        "bus id 00000000:07:00.0 physical id 2 port 28",
        {
            "@timestamp": "2024-03-07T11:52:28.000Z",
            "event.action": "nvswitch_fatal",
            "log.level": "critical",
            "nvidia.sxid.code": 24007,
            "nvidia.sxid.pci_bdf": "00000000:07:00.0",
            "nvidia.sxid.link": 28,
        },
    ),
    Sample(
        "fabricmanager",
        "[Mar 07 2024 11:52:28] [ERROR] [tid 1234] detected NVSwitch non-fatal error 12028 on fid 0 on NVSwitch "
        "pci bus id 00000000:86:00.0 physical id 3 port 61",
        {"event.action": "sxid", "nvidia.sxid.fatal": False, "nvidia.sxid.code": 12028},
    ),
    Sample(
        "fabricmanager",
        "[Mar 07 2024 11:52:29] [ERROR] [tid 1234] request to query NVSwitch device information from NVSwitch "
        "driver failed with error:WARNING Nothing to do",
        {"event.action": "fm_error", "log.level": "error"},
    ),
    Sample(
        "fabricmanager",
        "[Jun 12 2023 10:08:28] [INFO] [tid 2071] Successfully configured all the available NVSwitches to route "
        "GPU NVLink traffic.",
        {"event.action": "fm_message", "log.level": "info"},
    ),
    # -- application: progress, NaN, CUDA, NCCL -------------------------------------------------------------
    Sample(
        "application",
        "[2026-11-21 10:01:30] iteration      100/ 2000000 | consumed samples:        12800 | elapsed time per "
        "iteration (ms): 4098.4 | learning rate: 2.994E-04 | global batch size:   128 | lm loss: 2.531043E+00 | "
        "loss scale: 1.0 | grad norm: 0.753 | number of skipped iterations:   0 | number of nan iterations:   0 |",
        {
            "@timestamp": "2026-11-21T10:01:30.000Z",
            "event.action": "training_progress",
            "training.step": 100,
            "training.loss": 2.531043,
            "training.step_time_ms": 4098.4,
            "training.grad_norm": 0.753,
            "fleetsight.hpc_job": "4101",
            "fleetsight.rank": 13,
        },
        RANK_LOG,
    ),
    Sample(
        "application",
        "[2026-11-21 10:01:30] iteration      101/ 2000000 | consumed samples:        12928 | elapsed time per "
        "iteration (ms): 4101.0 | learning rate: 2.994E-04 | global batch size:   128 | lm loss: NAN | loss "
        "scale: 1.0 | grad norm: nan | number of skipped iterations:   0 | number of nan iterations:   1 |",
        {"event.action": "loss_nonfinite", "training.loss_finite": False, "training.loss_text": "NAN"},
        RANK_LOG,
    ),
    Sample(  # a data-parallel replica's own line (docs/anomaly.md, "Silent data corruption")
        "application",
        "[2026-11-21 10:01:30] fleetsight-train step=1200 replica=3 node=n0007 loss=2.412330 grad_norm=0.8123 "
        "step_time_ms=2503.1",
        {
            "event.action": "training_progress",
            "training.step": 1200,
            "training.replica": 3,
            "training.loss": 2.41233,
            "training.grad_norm": 0.8123,
            "training.step_time_ms": 2503.1,
            "fleetsight.rank": 13,
        },
        RANK_LOG,
    ),
    Sample(  # ... and where its step went (docs/anomaly.md, "The job's own pace")
        "application",
        "[2026-11-21 10:01:30] fleetsight-train step=1201 replica=3 node=n0007 loss=2.412330 grad_norm=0.8123 "
        "step_time_ms=2503.1 data_ms=24.0 compute_ms=2101.7 comm_ms=377.4",
        {
            "event.action": "training_progress",
            "training.step": 1201,
            "training.replica": 3,
            "training.step_time_ms": 2503.1,
            "training.data_ms": 24.0,
            "training.compute_ms": 2101.7,
            "training.comm_ms": 377.4,
        },
        RANK_LOG,
    ),
    Sample(
        "application",
        "Epoch 3: step=1200 loss=inf step_time_ms=512.5",
        {"event.action": "loss_nonfinite", "training.step": 1200, "training.step_time_ms": 512.5},
        RANK_LOG,
    ),
    Sample(
        "application",
        "[2026-11-21 10:08:02] RuntimeError: CUDA error: an illegal memory access was encountered",
        {
            "event.action": "cuda_error",
            "cuda.error": "an illegal memory access was encountered",
            "error.type": "RuntimeError",
            "fleetsight.rank": 13,
        },
        RANK_LOG,
    ),
    Sample(
        "application",
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        {"event.action": "cuda_error", "cuda.error": "CUDA out of memory. Tried to allocate 2.00 GiB"},
        RANK_LOG,
    ),
    Sample(
        "application",
        "[2026-11-21 10:08:05] n0003:4013:4113 [5] NCCL WARN Cuda failure 'uncorrectable NVLink error was detected "
        "during the execution'",
        {"event.action": "cuda_error", "nccl.local_rank": 5, "process.pid": 4013},
        RANK_LOG,
    ),
    Sample(
        "application",
        "[2026-11-21 10:08:02] [rank13]:[E ProcessGroupNCCL.cpp:616] [Rank 13] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=289, OpType=ALLREDUCE, NumelIn=67108864, NumelOut=67108864, Timeout(ms)=600000) "
        "ran for 600061 milliseconds before timing out.",
        {"event.action": "nccl_timeout", "nccl.op": "ALLREDUCE", "nccl.seq": 289, "nccl.timeout_ms": 600000},
        RANK_LOG,
    ),
    Sample(
        "application",
        "[2026-11-21 10:08:02] n0003:4013:4113 [5] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from "
        "peer 10.1.0.3<50013> with status=12 opcode=0 len=0 vendor err 129 (Recv)",
        {"event.action": "nccl_error", "nccl.source": "transport/net_ib.cc:1696"},
        RANK_LOG,
    ),
    # -- BMC SEL (ipmitool sel elist) ----------------------------------------------------------------------
    Sample(
        "bmc",
        "   1 | 11/23/2026 | 06:12:44 | Power Supply PSU1 | Failure detected () | Asserted",
        {
            "@timestamp": "2026-11-23T06:12:44.000Z",
            "event.action": "bmc_sel",
            "log.level": "error",
            "bmc.sel.sensor_type": "Power Supply",
            "bmc.sel.sensor": "PSU1",
            "bmc.sel.direction": "Asserted",
        },
    ),
    Sample(
        "bmc",
        "  1a | 11/23/2026 | 06:13:00 | Temperature GPU3_Temp | Upper Critical going high | Asserted | Reading 95 > "
        "Threshold 90 degrees C",
        {
            "bmc.sel.id": "1a",
            "bmc.sel.sensor_type": "Temperature",
            "bmc.sel.detail": "Reading 95 > Threshold 90 degrees C",
        },
    ),
    Sample(
        "bmc",
        "  1b | 11/23/2026 | 06:14:00 | Power Supply PSU1 | Failure detected () | Deasserted",
        {"log.level": "info", "bmc.sel.direction": "Deasserted"},
    ),
    # -- audit ----------------------------------------------------------------------------------------------
    Sample(
        "audit",
        "Nov 23 06:12:44 n0001 sshd[4321]: Failed password for invalid user bob from 10.0.0.6 port 51235 ssh2",
        {
            "event.action": "ssh_login_failed",
            "event.outcome": "failure",
            "user.name": "bob",
            "source.ip": "10.0.0.6",
        },
    ),
]

GARBAGE = [
    "complete garbage ### line",
    "",
    "\u00e9\u00e8 \u2603 non-ASCII only",
    '{"json": "but not ours"}',
    "x" * 5000,
]

# Application lines: every form the twin writes, their real variants (spacing, no grad norm, NaN/inf in
# any case, exponents), torchrun prefixes, NCCL with and without a source, the generic key=value
# progress in any case and separator, near misses (a loss that is no number, a time that does not
# exist, an unknown frame) and a continuation line.
APPLICATION_EDGE_CASES = [
    "[2026-11-21 10:01:30] iteration      100/ 2000000 | consumed samples:        12800 | elapsed time per "
    "iteration (ms): 4098.4 | learning rate: 2.994E-04 | global batch size:   128 | lm loss: 2.531043E+00 | "
    "loss scale: 1.0 | grad norm: 0.753 | number of skipped iterations:   0 | number of nan iterations:   0 |",
    "[2026-11-21 10:01:30] iteration 7/2000 | elapsed time per iteration (ms): 12 | lm loss: 1.5 |",
    "[2026-11-21 10:01:30] iteration 8/2000| elapsed time per iteration (ms): 12.25 | lm loss: -Inf | grad norm: NaN |",
    "[2026-11-21 10:01:30] iteration 9/ 2000 | elapsed time per iteration (ms): 12.5 | lm loss: 3.0e-2 | grad norm: x |",
    "[2026-11-21 10:01:30] iteration 10/ 2000 | elapsed time per iteration (ms): 12.5 | lm loss: abc | grad norm: 1 |",
    "[2026-11-21 10:01:30] iteration 11/ 2000 | elapsed time per iteration (ms): 12.5 | lm loss: 01.5 |",
    "[2026-11-21 10:01:30] iteration 12/ 2000 | elapsed time per iteration (ms): 12.5 | lm loss: infinity",
    "Epoch 3: step=1200 loss=inf step_time_ms=512.5",
    "[2026-11-21 10:01:31] Step: 1200, Loss: 2.5, step_time_ms: 99.5",
    "[2026-11-21 10:01:31] STEP 5 LOSS NaN",
    "step=1 loss=2.25",
    "[2026-11-21 10:01:31] timestep=4 lr=0.1 loss=0.5 step=9 loss=7",
    "[2026-11-21 10:01:31] step=4 loss=bad",
    "[2026-11-21 10:01:31] step=4, loss=1.0; grad=2",
    "[2026-11-21 10:01:31] fleetsight-train step=7 replica=0 node=n0001 loss=nan grad_norm=inf",
    "[2026-11-21 10:01:31] step=8 loss=1.5 grad_norm=0.7",
    "[2026-11-21 10:01:31] step=9 replica=x loss=1.5",
    "[2026-11-21 10:08:02] [rank13]:[E ProcessGroupNCCL.cpp:616] [Rank 13] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=289, OpType=ALLREDUCE, NumelIn=67108864, NumelOut=67108864, Timeout(ms)=600000) "
    "ran for 600061 milliseconds before timing out.",
    "[E ProcessGroupNCCL.cpp:616] [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, "
    "OpType=_ALLGATHER_BASE, Timeout(ms)=1800000)",
    "[2026-11-21 10:08:05] n0003:4013:4113 [5] NCCL WARN Cuda failure 'uncorrectable NVLink error'",
    "[2026-11-21 10:08:05] n0003:4013:4113 [5] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion",
    "[2026-11-21 10:08:05] n0003:4013:4113 [5] NCCL INFO transport/net.cc:1298 -> 6",
    "[2026-11-21 10:08:05] n0003:4013:4113 [5] init.cc:100 NCCL INFO comm 0x1 rank 5",
    "[2026-11-21 10:08:02] RuntimeError: CUDA error: an illegal memory access was encountered",
    "[2026-11-21 10:08:02] [rank3]: RuntimeError: CUDA error: unspecified launch failure",
    "[2026-11-21 10:08:02] [rank3]:CUDA error: out of resources",
    "CUDA error: device-side assert triggered",
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "[2026-11-21 10:08:02] [rank1]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1275, "
    "unhandled system error",
    "[2026-11-21 10:08:02] NCCL error",
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might "
    "be incorrect.",
    "[2026-11-21 10:08:02] Traceback (most recent call last):",
    "[2026-11-21 10:08:02] ValueError: bad value",
    "[2026-11-21 10:08:02] starting training (attempt 1) on 4 nodes, resuming from iteration 0",
    "2026-11-21T10:08:02.5+00:00 saving checkpoint at iteration 100 to /lustre/ckpt/x",
    "2026-11-21 10:08:02 plain frame",
    "[2026-02-30 10:08:02] a day that does not exist",
    "[2026-11-21 24:08:02] an hour that does not exist",
    "[2026-11-21 10:08:02,123] python logging's milliseconds",
    "[rank0]: nothing known",
]

# BMC SEL lines (`ipmitool sel elist`): every column count, odd spacing, empty and missing columns, a
# '|' in the detail, times that do not exist, other sensor types, near misses.
BMC_EDGE_CASES = [
    "   1 | 11/23/2026 | 06:12:44 | Power Supply PSU1 | Failure detected | Asserted",
    "   2 | 11/23/2026 | 06:12:44 | Power Supply PSU1 | Failure detected | Deasserted",
    "ff|11/23/2026|06:12:44|Power Supply PSU2|Presence detected|Asserted",
    "  10 |  11/23/2026  |  06:12:44  |  Temperature   GPU0_Temp  |  Upper Non-critical going high  |  Asserted  |  Reading 85 > Threshold 80 degrees C  ",
    "  11 | 11/23/2026 | 06:12:44 | Memory #0x01 | Uncorrectable ECC | Asserted | DIMM A1 | rank 2",
    "  12 | 11/23/2026 | 06:12:44 | Event Logging Disabled SEL | Log area reset/cleared | Asserted",
    "  13 | 11/23/2026 | 06:12:44 | Watchdog2 | Timer expired",
    "  14 | 11/23/2026 | 06:12:44 | Fan FAN3 | Lower Critical going low | Asserted",
    "  15 | 11/23/2026 | 06:12:44 | Power Unit | Power off/down | Asserted",
    "  16 | 11/23/2026 | 06:12:44 | Unknown Sensor #0x42 | Undetermined system hardware failure | Asserted",
    "  17 | 11/23/2026 | 06:12:44 PM | Power Supply PSU1 | AC lost | Asserted",
    "  18 | 02/30/2026 | 06:12:44 | Power Supply PSU1 | Failure detected | Asserted",
    "  19 | 11/23/2026 | 25:12:44 | Power Supply PSU1 | Failure detected | Asserted",
    "  1a | 1/2/2026 | 06:12:44 | Power Supply PSU1 | Failure detected | Asserted",
    "  1b | Pre-Init | 0000011234 | System Event | Timestamp Clock Sync | Asserted",
    "  1c |  | 06:12:44 | Power Supply PSU1 | Failure detected | Asserted",
    "  1d | 11/23/2026 | 06:12:44 | Power Supply PSU1 | Failure detected |",
    "  1e | 11/23/2026 | 06:12:44 | Power Supply PSU1 | Failure detected | | detail",
    "  1f | 11/23/2026 | 06:12:44 | Power Supply PSU1",
    "SEL has no entries",
    "  20 | 11/23/2026 | 06:12:44 | Processor CPU1 | IERR | Asserted",
    "\t21 | 11/23/2026 | 06:12:44 | Processor CPU1 | IERR | Asserted",
]

# Audit lines: sshd logins (password, key, invalid user, IPv4, IPv6), sudo with and without a pid, other
# programs, both syslog frames, and near misses.
AUDIT_EDGE_CASES = [
    "Nov 23 06:12:44 n0001 sshd[4321]: Accepted publickey for alice from 10.0.0.5 port 51234 ssh2: ED25519 SHA256:abc",
    "Nov  3 06:12:44 n0001 sshd[4321]: Accepted password for root from 192.168.1.255 port 22 ssh2",
    "2026-11-23T06:12:44.123456+00:00 n0001 sshd[4321]: Failed password for bob from 2001:db8::1 port 2222 ssh2",
    "2026-11-23T06:12:44+01:00 n0001 sshd[4321]: Failed publickey for invalid user eve from fe80::1 port 22 ssh2",
    "Nov 23 06:12:44 n0001 sshd[4321]: Failed password for bob from 10.0.0.256 port 22 ssh2",
    "Nov 23 06:12:44 n0001 sshd[4321]: Failed password for bob from host.example port 22 ssh2",
    "Nov 23 06:12:44 n0001 sshd[4321]: pam_unix(sshd:session): session opened for user alice(uid=1000) by (uid=0)",
    "Nov 23 06:12:44 n0001 sudo:    alice : TTY=pts/0 ; PWD=/home/alice ; USER=root ; COMMAND=/usr/bin/systemctl restart slurmd",
    "Nov 23 06:12:44 n0001 sudo[999]:  bob : 3 incorrect password attempts ; TTY=pts/1 ; PWD=/ ; USER=root ; COMMAND=/bin/sh",
    "Nov 23 06:12:44 n0001 sudo: pam_unix(sudo:session): session closed for user root",
    "Nov 23 06:12:44 n0001 CRON[1234]: (root) CMD (command -v debian-sa1 > /dev/null)",
    "Nov 23 06:12:44 n0001 systemd-logind: New session 5 of user alice.",
    "Nov 23 06:12:44 n0001 just text without a program",
    "Feb 30 06:12:44 n0001 sshd[1]: Accepted password for a from 10.0.0.1 port 1 ssh2",
    "2026-02-30T06:12:44Z n0001 sshd[1]: Accepted password for a from 10.0.0.1 port 1 ssh2",
    "sshd[4321]: Accepted password for root from 10.0.0.7 port 22 ssh2",
    "Nov 23 06:12:44 n0001 sshd[4321]: Accepted password for 100%root from 10.0.0.7 port 22 ssh2",
]

# Kernel lines the node agent parses and the ingest pipeline used to leave unparsed (dmesg -T time, a bare
# 'kernel:' prefix, an Xid further into the line), and near misses: times that do not exist, odd spacing,
# a '%' (liblognorm's escape), tabs. Both parsers must make the same document of each.
KERNEL_EDGE_CASES = [
    "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python3, Graphics Exception: ESR 0x50",
    "[Fri Aug  2 01:43:09 2024] NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception",
    "[Fri Feb 30 11:43:09 2024] NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception",
    "[Fri Aug 30 25:43:09 2024] NVRM: Xid (PCI:0000:3b:00): 13, x",
    "[Mon Foo 30 11:43:09 2024] NVRM: Xid (PCI:0000:3b:00): 13, x",
    "kernel: NVRM: Xid (PCI:0000:5d:00): 63, pid='<unknown>', name=<unknown>, Row Remapper",
    "kernel: [ 12.5] NVRM: Xid (PCI:0000:5d:00): 63, pid=<unknown>, x",
    "some prefix NVRM: Xid (PCI:0000:5d:00): 48, pid=12, name=x, DBE",
    "2026-11-21T10:08:00.000000+00:00 n0003 kernel: audit: NVRM: Xid (PCI:0000:3a:00): 79, pid=1, name=p, GPU has fallen off the bus.",
    "2026-02-30T10:08:00.000000+00:00 n0003 kernel: NVRM: Xid (PCI:0000:3a:00): 79, x",
    "2026-11-21T10:08:00.123456+05:30 n0003 kernel: NVRM: Xid (PCI:0000:3a:00): 79, x",
    "2026-11-21T23:58:00Z n0003 kernel: NVRM: Xid (PCI:0000:3a:00): 79, x",
    "2026-11-21T23:58:00.5-02:00 n0003 kernel: [12] NVRM: Xid (PCI:0000:3a:00): 79, x",
    "Nov  1 10:08:00 n0003 kernel: [   3.000000] nvidia-nvswitch0: SXid (0000:07:00.0): 12, Fatal, x",
    "Nov 1 10:08:00 n0003 kernel: hello",
    "Feb 30 10:08:00 n0003 kernel: hello",
    "[ 1234.567890] NVRM: GPU 0000:3a:00.0: GPU has fallen off the bus.",
    "[ 1234.567890] LustreError: something odd",
    "[ 1234.567890] Lustre: scratch-OST0002-osc-ffff8f0a1b2c3000: Connection restored to scratch-OST0002 (at 10.10.0.12@o2ib)",
    "[ 1234.567890] LustreError: 167-0: dev: This client was evicted by tgt; rest",
    "[ 1234.567890] eth0: Link up",
    "[ 1234.567890] ibs1: Link DOWN",
    "[ 1234.567890] mlx5_ib: mlx5_0: port 1 state changed to INIT",
    "NVRM: Xid (PCI:0000:18:00): not-a-number, malformed",
    "NVRM: Xid (PCI:0000:18:00): 13,",
    "NVRM: Xid (PCI:0000:18:00): 13, ",
    "[] empty",
    "[12.] x",
    "[ 12.5 ] x",
    "kernel:",
    "  leading spaces NVRM: Xid (PCI:0000:18:00): 13, x",
    "NVRM: Xid (PCI:0000:18:00): 13, pid=12, name=, x",
    "NVRM: Xid (PCI:0000:18:00): 13, pid=12, name=a,b, x",
    "NVRM: Xid (PCI:0000:18:00): 13, pid=-1, x",
    "[2922109.612490] LustreError: 11-0: d: operation ost_write to node n failed: rc = 107",
    "[2922109.612490] LustreError: 11-0: d: operation ost_write to node n failed: rc = -0",
    "100% done",
    "a % b %% c",
    "tab\tseparated\tNVRM: Xid (PCI:0000:18:00): 13, x",
]


def xid_generations(code: int) -> list[str]:
    """One line of an Xid code in each driver generation's form and each line frame."""
    return [
        f"2026-11-21T10:08:00.250000+00:00 n0003 kernel: [1229615.939836] NVRM: Xid (PCI:0000:3a:00): {code}, "
        "pid=57075, name=python3, text",  # R525+
        f"Nov 21 10:08:00 n0003 kernel: [ 8123.456789] NVRM: Xid (PCI:0000:1b:00): {code}, pid=1234, text",  # R450
        f"Nov  1 10:08:00 n0003 kernel: NVRM: Xid (PCI:0000:b3:00): {code}, text",  # older
        f"[ 1234.567890] NVRM: Xid (0000:03:00): {code}, 0004 00000000 0000a1c0",  # very old
        f"[ 1234.567890] NVRM: Xid (PCI:0000:3a:00): {code}, pid='<unknown>', name=<unknown>, text",  # GSP
        f"[Sat Nov 21 10:00:09 2026] NVRM: Xid (PCI:0000:5d:00): {code}, pid=1, name=python3, text",  # dmesg -T
        f"kernel: NVRM: Xid (PCI:0000:5d:00): {code}, pid=1, text",  # bare kernel:
    ]


# Fabric Manager near misses: its level words, a non-fatal and a fatal NVSwitch error, odd times.
FABRICMANAGER_EDGE_CASES = [
    "[Mar 07 2024 11:52:28] [WARN] [tid 1234] link training took longer than expected",
    "[Mar 7 2024 11:52:28] [FATAL] [tid 1] fabric manager exiting",
    "[Feb 30 2024 11:52:28] [INFO] [tid 1] impossible day",
    "[Mar 07 2024 25:52:28] [INFO] [tid 1] impossible hour",
    "[Mar  7 2024 11:52:28] [INFO] [tid 1] two spaces",
    "[Foo 07 2024 11:52:28] [INFO] [tid 1] no such month",
    "[Mar 07 2024 11:52:28] [ERROR] [tid 99] detected NVSwitch fatal error 12028 on fid 0 on NVSwitch pci bus "
    "id 00000000:86:00.0 physical id 3 port 61 and more",
    "[Mar 07 2024 11:52:28] [INFO] [tid 99] detected NVSwitch Fatal error 1 on fid 0 on NVSwitch pci bus id x "
    "physical id 1 port 1",
    "[Mar 07 2024 11:52:28] [INFO] [tid x] bad thread id",
    "[Mar 07 2024 11:52:28] [INFO] [tid 5] ",
    "detected NVSwitch non-fatal error 12028 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 61",
    "[Mar 07 2024 11:52:28] [Error] [tid 5] 100% done",
]
