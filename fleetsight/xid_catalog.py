"""NVIDIA Xid codes: what each means for operations (category) and what to do (action).

Condensed from NVIDIA's public Xid catalogue (docs.nvidia.com/deploy/xid-errors) and the Fire-Flyer
taxonomy (software-triggered 13/31/43/45; NVLink 74; memory ECC 48/63/64/92/94/95; uncorrectable
44/61/62/69/79; GSP 119/120). Categories are a small closed set so dashboards can group by them.

Actions:
  ``none``              informational, or a consequence of another Xid
  ``restart_app``       the application faulted (or was killed); the GPU is fine
  ``reset_gpu``         the GPU needs a reset (drain the node, reset when idle)
  ``reboot_node``       only a node reboot (or power cycle) clears it
  ``check_hardware``    likely hardware: run diagnostics, check cabling/power/thermals, consider RMA
"""

from __future__ import annotations

from typing import NamedTuple


class XidInfo(NamedTuple):
    category: str
    action: str
    summary: str


CATALOG: dict[int, XidInfo] = {
    8: XidInfo("driver", "reset_gpu", "GPU stopped processing"),
    13: XidInfo("application", "restart_app", "Graphics engine exception"),
    31: XidInfo("application", "restart_app", "GPU memory page fault"),
    32: XidInfo("application", "restart_app", "Invalid or corrupted push buffer stream"),
    38: XidInfo("driver", "reset_gpu", "Driver firmware error"),
    43: XidInfo("application", "restart_app", "GPU stopped processing (application reset the channel)"),
    44: XidInfo("uncorrectable", "reset_gpu", "Graphics engine fault during context switch"),
    45: XidInfo("application", "none", "Preemptive cleanup after a previous error"),
    48: XidInfo("memory_ecc", "reset_gpu", "Double-bit ECC error"),
    54: XidInfo("power", "check_hardware", "Auxiliary power not connected"),
    56: XidInfo("driver", "reset_gpu", "Display engine error"),
    57: XidInfo("memory_ecc", "check_hardware", "Error programming video memory interface"),
    61: XidInfo("uncorrectable", "reset_gpu", "Internal micro-controller breakpoint/warning"),
    62: XidInfo("uncorrectable", "reset_gpu", "Internal micro-controller halt"),
    63: XidInfo("memory_ecc", "reset_gpu", "ECC page retirement or row remap recorded"),
    64: XidInfo("memory_ecc", "check_hardware", "ECC page retirement or row remap failed"),
    68: XidInfo("uncorrectable", "reset_gpu", "Video decoder exception"),
    69: XidInfo("uncorrectable", "reset_gpu", "Graphics engine class error"),
    74: XidInfo("nvlink", "reset_gpu", "NVLink error"),
    79: XidInfo("fallen_off_bus", "reboot_node", "GPU has fallen off the bus"),
    92: XidInfo("memory_ecc", "check_hardware", "High single-bit ECC error rate"),
    93: XidInfo("other", "none", "Non-fatal violation of provisioned InfoROM wear limit"),
    94: XidInfo("memory_ecc", "restart_app", "Contained ECC error"),
    95: XidInfo("memory_ecc", "reset_gpu", "Uncontained ECC error"),
    109: XidInfo("application", "restart_app", "Context switch timeout"),
    110: XidInfo("uncorrectable", "reset_gpu", "Security fault"),
    119: XidInfo("gsp", "reset_gpu", "GSP RPC timeout"),
    120: XidInfo("gsp", "reset_gpu", "GSP error"),
    121: XidInfo("nvlink", "reset_gpu", "C2C link error"),
    122: XidInfo("power", "check_hardware", "SPI PMU RPC read failure"),
    123: XidInfo("power", "check_hardware", "SPI PMU RPC write failure"),
    136: XidInfo("uncorrectable", "reset_gpu", "Reset required after an error"),
    140: XidInfo("memory_ecc", "reset_gpu", "Unrecovered ECC error"),
    143: XidInfo("driver", "reboot_node", "GPU initialization failure"),
    144: XidInfo("nvlink", "reset_gpu", "NVLink SAW error"),
    145: XidInfo("nvlink", "reset_gpu", "NVLink RLW error"),
    146: XidInfo("nvlink", "reset_gpu", "NVLink TLW error"),
    147: XidInfo("nvlink", "reset_gpu", "NVLink TREX error"),
    148: XidInfo("nvlink", "reset_gpu", "NVLink NVLPW control error"),
    149: XidInfo("nvlink", "reset_gpu", "NVLink NETIR error"),
    150: XidInfo("nvlink", "reset_gpu", "NVLink MSE error"),
    154: XidInfo("other", "none", "GPU recovery action changed"),
}

UNKNOWN = XidInfo("unknown", "check_hardware", "Not in FleetSight's catalogue")


def lookup(code: int) -> XidInfo:
    return CATALOG.get(code, UNKNOWN)
