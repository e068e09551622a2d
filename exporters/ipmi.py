"""IPMI through ``ipmitool``, for BMCs without Redfish: ``sdr elist`` (PSU presence/failure sensors,
entity 10.x; power sensors in Watts), ``dcmi power reading`` (chassis draw) and ``sel list`` (event log
entries by sensor type), each run with a timeout, and their parsers."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass, field

from .bmc_model import BmcReading, Psu, PsuRedundancy
from .core import Problems

_READING = re.compile(r"^\s*(-?[0-9]+(?:\.[0-9]+)?)\s+(\S.*?)\s*$")
_DCMI = re.compile(r"Instantaneous power reading:\s*([0-9]+(?:\.[0-9]+)?)\s*Watts", re.IGNORECASE)
PSU_FAULTS = ("failure detected", "ac lost", "predictive failure", "configuration error", "input lost")
PRESENT_STATES = ("presence detected", "device present", "entity present")
ABSENT_STATES = ("device absent", "entity absent")
REDUNDANCY_WORDS = ("redundan",)  # Fully Redundant, Redundancy Lost/Degraded, Non-Redundant: ...
CHASSIS_POWER_NAMES = (
    "pwr consumption",
    "total power",
    "system power",
    "system pwr",
    "chassis pwr",
    "sys power",
    "system level",
    "power meter",
    "power_usage",
)
# Entity ids (IPMI spec table 43-13) whose redundancy sensors speak for the power supplies: power
# supply, power unit, power module, power management.
POWER_ENTITIES = {"10", "19", "20", "21"}
# Processor, memory module, drive bay, fan, cooling unit, memory device: their redundancy is not power's.
OTHER_ENTITIES = {"3", "8", "26", "29", "30", "32"}
_POWER_NAME = re.compile(r"(?<![a-z])(ps|psu|pwr|power|supply|supplies)", re.IGNORECASE)
_OTHER_REDUNDANCY = re.compile(r"fan|cool|mem|dimm|cpu|proc|nic|lan|raid|disk|drive", re.IGNORECASE)
SENSOR_UNREADABLE = "ns"
ELECTRIC_UNITS = ("watts", "volts", "amps")


@dataclass
class _PsuSensors:
    """What the entity-10 sensors of one power supply said, before deciding presence and health."""

    present: bool = False  # a presence state was asserted
    absent: bool = False  # an absence state was asserted, or its presence sensor asserted nothing
    read: bool = False  # some sensor of it returned a reading
    faults: list[str] = field(default_factory=list)
    input_watts: float | None = None
    output_watts: float | None = None
    input_volts: float | None = None


@dataclass
class SdrElist:
    psus: list[Psu] = field(default_factory=list)
    chassis_watts: float | None = None
    redundancy: list[PsuRedundancy] = field(default_factory=list)


def split_sdr_value(value: str) -> tuple[tuple[float, str] | None, list[str]]:
    """``(reading, unit)`` and the discrete states of an ``sdr elist`` value column. Some BMCs put
    both on one line: ``"95 Watts, Presence detected"`` -> ``((95.0, "Watts"), ["Presence detected"])``."""
    parts = [p.strip() for p in value.split(",") if p.strip()]
    reading = None
    if parts:
        match = _READING.match(parts[0])
        if match:
            reading = (float(match.group(1)), match.group(2))
            parts = parts[1:]
    return reading, parts


def _is_psu_redundancy(name: str, entity_type: str, states: list[str]) -> bool:
    """A redundancy sensor of the power supplies: on a power entity, or named for power, or on the
    system board (Dell's ``PS Redundancy``, 7.1) - never a fan's, memory's or other device's."""
    if not any(word in s.lower() for s in states for word in REDUNDANCY_WORDS):
        return False
    if _OTHER_REDUNDANCY.search(name) or entity_type in OTHER_ENTITIES:
        return False
    return entity_type in POWER_ENTITIES or entity_type == "7" or bool(_POWER_NAME.search(name))


def _is_chassis_power(name: str, status: str, reading: tuple[float, str] | None) -> bool:
    if reading is None or reading[1].lower() != "watts" or status == SENSOR_UNREADABLE:
        return False
    return any(n in name.lower() for n in CHASSIS_POWER_NAMES)


def parse_sdr_elist(text: str) -> SdrElist:
    """PSUs (entity 10.x), their redundancy sensor and the chassis draw from ``ipmitool sdr elist``.

    Columns: name | sensor number | status (ok, ns, nc, cr, nr) | entity id.instance | value, where
    the value is a reading (``1520 Watts``), discrete states (``Presence detected, Failure
    detected``), both (``95 Watts, Presence detected``), or nothing (no state asserted)."""
    sensors: dict[str, _PsuSensors] = {}
    result = SdrElist()
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) != 5:
            continue
        name, _, status, entity, value = cells
        status = status.lower()
        entity_type, _, instance = entity.partition(".")
        reading, states = split_sdr_value(value)
        if _is_psu_redundancy(name, entity_type, states):
            if status != SENSOR_UNREADABLE:
                result.redundancy.append(PsuRedundancy("ipmi", name, ", ".join(states)))
            continue
        if entity_type == "10" and instance:
            _psu_line(sensors.setdefault(instance, _PsuSensors()), name, status, reading, states)
        elif _is_chassis_power(name, status, reading):
            result.chassis_watts = reading[0]  # type: ignore[index]
    result.psus = [
        _decide_psu(i, s) for i, s in sensors.items() if s.present or s.absent or s.read or s.faults
    ]
    return result


def _psu_line(
    psu: _PsuSensors, name: str, status: str, reading: tuple[float, str] | None, states: list[str]
) -> None:
    if status == SENSOR_UNREADABLE:  # "No Reading", "Disabled": says nothing either way
        return
    lowered = [s.lower() for s in states]
    if any(p in s for s in lowered for p in PRESENT_STATES):
        psu.present = True
    if any(a in s for s in lowered for a in ABSENT_STATES):
        psu.absent = True
    if reading is None and not states and "status" in name.lower():
        psu.absent = True  # a presence/status sensor with no state asserted: nothing in the bay
    psu.faults += [s for s in states if any(f in s.lower() for f in PSU_FAULTS)]
    if status in ("cr", "nr"):
        psu.faults.append(f"{name}: {status}")
    if reading is None:
        return
    number, unit = reading[0], reading[1].lower()
    if unit not in ELECTRIC_UNITS:
        return  # a temperature on entity 10 (HPE) says nothing about the supply being there
    psu.read = True
    output = "out" in name.lower()
    if unit == "watts":
        if output:
            psu.output_watts = number
        else:
            psu.input_watts = number
    elif unit == "volts" and not output:
        psu.input_volts = number


def _decide_psu(instance: str, s: _PsuSensors) -> Psu:
    # An asserted presence wins; else an absence; else a supply whose sensors read is there.
    present = s.present or (not s.absent and s.read)
    # "nc" (a reading past a non-critical threshold) leaves the supply healthy, as the BMC rates it.
    health = "Critical" if s.faults else "OK"
    return Psu(
        "ipmi",
        instance,
        present=present,
        state="Enabled" if present else "Absent",
        health=health,
        input_watts=s.input_watts,
        output_watts=s.output_watts,
        input_volts=s.input_volts,
    )


def parse_dcmi_power(text: str) -> float | None:
    match = _DCMI.search(text)
    return float(match.group(1)) if match else None


def parse_sel_list(text: str) -> dict[str, int]:
    """Entries of ``ipmitool sel list`` by sensor type (``Power Supply #0xc9`` -> ``Power Supply``)."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) < 5:
            continue
        sensor_type = cells[3].split(" #", 1)[0].strip() or "unknown"
        counts[sensor_type] = counts.get(sensor_type, 0) + 1
    return counts


class IpmiClient:
    protocol = "ipmitool"

    def __init__(
        self, ipmitool: str, host: str | None, credentials: tuple[str, str] | None, timeout_s: float
    ):
        self.base = shlex.split(ipmitool)
        self.env = dict(os.environ)
        if host:
            self.base += ["-I", "lanplus", "-H", host]
            if credentials:
                # -E takes the password from IPMI_PASSWORD: it never shows in the process list.
                self.base += ["-U", credentials[0], "-E"]
                self.env["IPMI_PASSWORD"] = credentials[1]
        self.timeout_s = timeout_s

    def run(self, *args: str) -> str:
        result = subprocess.run(
            [*self.base, *args],
            capture_output=True,
            text=True,
            timeout=self.timeout_s,
            env=self.env,
            stdin=subprocess.DEVNULL,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"ipmitool {' '.join(args)} exited {result.returncode}: {result.stderr.strip()[:200]}"
            )
        return result.stdout

    def read(self, problems: Problems) -> BmcReading:
        reading = BmcReading("ipmi")
        sdr = parse_sdr_elist(self.run("sdr", "elist"))
        reading.psus, reading.redundancy = sdr.psus, sdr.redundancy
        try:
            watts = parse_dcmi_power(self.run("dcmi", "power", "reading"))
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            problems.add("ipmitool", f"dcmi power reading: {exc}")
            watts = None
        if watts is None:
            watts = sdr.chassis_watts
        if watts is not None:
            reading.chassis_watts["ipmi"] = watts
        try:
            reading.sel_entries = parse_sel_list(self.run("sel", "list"))
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            problems.add("ipmitool", f"sel list: {exc}")
        return reading

    def close(self) -> None:
        pass
