"""What a BMC says about power, as both of its clients fill it in: power supplies, their redundancy
sensors and one whole reading.

Its own module because the Redfish client (exporters/redfish.py), the ipmitool client
(exporters/ipmi.py) and the ``bmc`` collector that turns a reading into metrics (exporters/bmc.py) all
use it, and the collector imports the clients: with the model here no two of them import each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Psu:
    chassis: str
    psu: str
    present: bool
    state: str = ""
    health: str = ""
    input_watts: float | None = None
    output_watts: float | None = None
    input_volts: float | None = None

    @property
    def healthy(self) -> bool:
        """1 only when present, enabled and healthy (the rule the brief and the runbooks use)."""
        return self.present and self.state.lower() == "enabled" and self.health.upper() == "OK"


@dataclass
class PsuRedundancy:
    """A redundancy sensor of the power supplies, as the BMC words its state."""

    chassis: str
    sensor: str
    state: str

    @property
    def ok(self) -> bool:
        """Only "Fully Redundant" is redundant: "Non-Redundant: Sufficient..." still powers the node,
        but one more failure will not."""
        return self.state.lower() == "fully redundant"


@dataclass
class BmcReading:
    protocol: str
    chassis_watts: dict[str, float] = field(default_factory=dict)
    chassis_power_on: dict[str, bool] = field(default_factory=dict)
    psus: list[Psu] = field(default_factory=list)
    redundancy: list[PsuRedundancy] = field(default_factory=list)
    sel_entries: dict[str, int] = field(default_factory=dict)
