"""Fault catalogue: Xid codes with Fire-Flyer's shares and the driver's message text per code, and
the kernel-log text of the other fault kinds.

Shares: Xid 74 (NVLink) 42.57 %, Xid 43 33.48 %, memory ECC (63/64/94/95) about 2 % together
(Fire-Flyer 2, Table V/VI); the rest is spread over the other codes of their table.
"""

from __future__ import annotations

import random

XID_SHARES: dict[int, float] = {
    74: 42.57,
    43: 33.48,
    13: 5.0,
    31: 6.0,
    45: 4.0,
    63: 0.9,
    64: 0.2,
    94: 0.6,
    95: 0.3,
    48: 1.0,
    61: 1.0,
    62: 1.0,
    69: 0.5,
    79: 2.0,
    119: 1.45,
}

# Codes after which the process using the GPU dies (the job fails).
XID_KILLS_JOB = {13, 31, 43, 45, 48, 61, 62, 69, 74, 79, 94, 95, 119}
# Codes that leave a row marked for remapping (pending until the GPU is reset).
XID_ROW_REMAP = {48, 63, 94, 95}
# Codes after which the GPU is unusable until reset/reboot.
XID_NEEDS_RESET = {79, 95, 119, 62}


def draw_xid(rng: random.Random) -> int:
    codes = list(XID_SHARES)
    return rng.choices(codes, weights=[XID_SHARES[c] for c in codes])[0]


def xid_message(code: int, pid: int, process: str, rng: random.Random, newer_driver: bool = True) -> str:
    """The text after "NVRM: Xid (PCI:dddd:bb:dd): " for this code.

    Drivers from R525 on print ``pid=N, name=PROC,``; older ones only ``pid=N,``."""
    who = f"pid={pid}, name={process}, " if newer_driver else f"pid={pid}, "
    channel = f"Ch {rng.randrange(8, 0x40):08x}"
    link = rng.randrange(18)
    texts = {
        13: f"{who}Graphics SM Warp Exception on (GPC {rng.randrange(8)}, TPC {rng.randrange(9)}, "
        f"SM {rng.randrange(2)}): Out Of Range Address",
        31: f"{who}{channel}, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC{rng.randrange(8)} "
        f"GPCCLIENT_T1_{rng.randrange(16)} faulted @ "
        f"0x7f{rng.randrange(16**2):02x}_{rng.randrange(16**8):08x}. "
        "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
        43: f"{who}{channel}",
        45: f"{who}{channel}",
        48: f"{who}An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
        f"at partition {rng.randrange(12)}, subpartition {rng.randrange(2)}.",
        61: f"{who}Internal micro-controller breakpoint/warning (GPU-internal)",
        62: f"{who}Internal micro-controller halt",
        63: (
            f"{who}Row Remapper: New row ({rng.randrange(16**4):#018x}) is marked for remapping, "
            "reset gpu to activate."
        ),
        64: f"{who}Row Remapper: Failed to remap row ({rng.randrange(16**4):#018x}).",
        69: (
            f"{who}Graphics Exception: ChID {rng.randrange(16**4):04x}, Class 0000c9c0, Offset "
            "00000000, Data 00000000"
        ),
        74: f"{who}NVLink: fatal error detected on link {link}(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
        79: f"{who}GPU has fallen off the bus.",
        94: f"{who}Contained: SM (0x1). RST: No, D-RST: No",
        95: f"{who}Uncontained: FBHUB. RST: Yes, D-RST: No",
        119: f"{who}Timeout after 6s of waiting for RPC response from GPU{rng.randrange(8)} GSP! "
        "Expected function 76 (GSP_RM_CONTROL) (0x20800a4c 0x4).",
    }
    return texts.get(code, f"{who}{channel}")


def xid_line(bus_id: str, code: int, message: str) -> str:
    return f"NVRM: Xid (PCI:{bus_id}): {code}, {message}"


def sxid_lines(switch_index: int, bdf: str, rng: random.Random) -> list[str]:
    """A fatal NVSwitch error as the driver prints it (two lines: the error, then its severity)."""
    link = rng.randrange(64)
    return [
        f"nvidia-nvswitch{switch_index}: SXid (PCI:{bdf}): 24007, Fatal, Link {link} sourcetrack TCEN0 "
        "crumbstore ECC DBE Error",
        f"nvidia-nvswitch{switch_index}: SXid (PCI:{bdf}): 24007, Severity 1 Engine instance {link} "
        "Sub-engine instance 00",
        f"nvidia-nvswitch{switch_index}: SXid (PCI:{bdf}): 24007, Data {{0x{rng.randrange(16**8):08x}, "
        "0x00000000, 0x00000000, 0x00000000}",
    ]


def ib_link_lines(bdf: str, netdev: str, device: str, up: bool) -> list[str]:
    if up:
        return [
            f"mlx5_core {bdf}: mlx5_port_change_event:307:(pid 0): Link up",
            f"{netdev}: Link up",
            f"mlx5_ib: {device}: port 1 state changed to ACTIVE",
        ]
    return [
        f"mlx5_core {bdf}: mlx5_port_change_event:307:(pid 0): Link down",
        f"{netdev}: Link down",
    ]


def lustre_slow_lines(fsname: str, ost: int, instance: str, now: int, rng: random.Random) -> list[str]:
    xid = rng.randrange(10**15, 10**16)
    nid = f"10.10.{ost // 4}.{10 + ost}@o2ib"
    target = f"{fsname}-OST{ost:04x}"
    return [
        f"Lustre: {rng.randrange(2000, 60000)}:0:(client.c:2295:ptlrpc_expire_one_request()) @@@ "
        "Request sent "
        f"has timed out for slow reply: [sent {now - 100}/real {now - 100}]  "
        f"req@ffff{rng.randrange(16**12):012x} "
        f"x{xid}/t0(0) o4->{target}-osc-{instance}@{nid}:6/4 lens 488/448 e 0 to 1 dl {now} ref 2 "
        "fl Rpc:XQr/0/ffffffff rc 0/-1 job:''",
        f"Lustre: {target}-osc-{instance}: Connection to {target} (at {nid}) was lost; in progress "
        "operations "
        "using this service will wait for recovery to complete",
        f"LustreError: 11-0: {target}-osc-{instance}: operation ost_write to node {nid} failed: rc = -107",
    ]


def lustre_recovered_line(fsname: str, ost: int, instance: str) -> str:
    target = f"{fsname}-OST{ost:04x}"
    nid = f"10.10.{ost // 4}.{10 + ost}@o2ib"
    return f"Lustre: {target}-osc-{instance}: Connection restored to {target} (at {nid})"


BOOT_LINES = (
    "Linux version 5.15.0-1053-nvidia (buildd@lcy02-amd64-017) (gcc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0, "
    "GNU ld (GNU Binutils for Ubuntu) 2.38) #54-Ubuntu SMP Fri Apr 26 16:09:54 UTC 2024 (Ubuntu "
    "5.15.0-1053.54-nvidia)",
    "Command line: BOOT_IMAGE=/boot/vmlinuz-5.15.0-1053-nvidia root=UUID=0d3c0f4e ro pci=realloc=off "
    "iommu=pt",
    "nvidia: loading out-of-tree module taints kernel.",
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.161.08  Tue Mar  5 22:42:15 UTC 2024",
    "Lustre: Lustre: Build Version: 2.15.4",
)


# NVIDIA Fabric Manager's own lines after its stamp (its log's layout, "[Mon DD YYYY HH:MM:SS] [LEVEL]
# [tid N] text", pipelines/ingest/fabricmanager.json): when the service stops, and when it runs again.
def fabric_manager_stopped_lines(tid: int) -> list[str]:
    """The service stops: the switches keep the routes they were given, but no GPU can register with the
    NVLink fabric until it runs again (a CUDA program that starts meanwhile gets "system not yet
    initialized")."""
    return [
        f"[INFO] [tid {tid}] Received signal 15, Fabric Manager is shutting down",
        f"[ERROR] [tid {tid}] Fabric Manager is not running: GPU fabric registration is unavailable",
    ]


def fabric_manager_started_lines(tid: int, driver: str) -> list[str]:
    return [
        f"[INFO] [tid {tid}] Fabric Manager version {driver} is running with the following configuration "
        "options",
        f"[INFO] [tid {tid}] Successfully configured all the available NVSwitches to route GPU NVLink "
        "traffic.",
    ]
