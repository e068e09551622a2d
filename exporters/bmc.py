"""BMC power and power supplies, over Redfish or, for BMCs without it, ``ipmitool``.

Redfish: both the (deprecated but universal) ``Chassis/<id>/Power`` resource (``PowerControl``,
``PowerSupplies``) and the newer ``Chassis/<id>/PowerSubsystem/PowerSupplies/<psu>`` with its
``Metrics`` (``PowerSupplyMetrics``: ``InputPowerWatts.Reading``...), plus ``EnvironmentMetrics``
``PowerWatts`` for the chassis draw where ``Power`` is absent. A BMC is slow (hundreds of ms per
request), so a walk's result is kept for ``interval_s`` and scrapes in between reuse it.

IPMI: ``sdr elist`` (PSU presence/failure sensors, entity 10.x; power sensors in Watts), ``dcmi power
reading`` (chassis draw) and ``sel list`` (event log entries by sensor type), run with a timeout.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

import httpx
from prometheus_client.core import Metric

from .core import Families, Problems, Source, tls_verify


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


def load_credentials(secret_file: str | None) -> tuple[str, str] | None:
    """``FLEETSIGHT_BMC_USERNAME``/``FLEETSIGHT_BMC_PASSWORD``, or a secret file holding
    ``user:password`` (or the user and the password on two lines). Never logged."""
    if secret_file:
        with open(secret_file) as f:
            lines = [line.strip() for line in f.read().splitlines() if line.strip()]
        if len(lines) >= 2:
            return lines[0], lines[1]
        if lines and ":" in lines[0]:
            user, password = lines[0].split(":", 1)
            return user, password
        raise ValueError(f"{secret_file}: expected 'user:password' or two lines")
    user = os.environ.get("FLEETSIGHT_BMC_USERNAME")
    if user:
        return user, os.environ.get("FLEETSIGHT_BMC_PASSWORD", "")
    return None


# -- Redfish ---------------------------------------------------------------------------------------


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _reading(container: object, key: str) -> float | None:
    """``{"InputPowerWatts": {"Reading": 720}}`` -> 720.0; tolerant of nulls and missing keys."""
    if not isinstance(container, dict):
        return None
    value = container.get(key)
    return _number(value.get("Reading")) if isinstance(value, dict) else None


def _link(resource: object, key: str) -> str | None:
    if isinstance(resource, dict):
        target = resource.get(key)
        if isinstance(target, dict) and isinstance(target.get("@odata.id"), str):
            return target["@odata.id"]
    return None


def _members(collection: object) -> list[str]:
    if not isinstance(collection, dict) or not isinstance(collection.get("Members"), list):
        return []
    return [m["@odata.id"] for m in collection["Members"] if isinstance(m, dict) and "@odata.id" in m]


def _status(resource: dict) -> tuple[str, str]:
    status = resource.get("Status") if isinstance(resource.get("Status"), dict) else {}
    return str(status.get("State") or ""), str(status.get("Health") or "")


def _redundancy(chassis_id: str, groups: object) -> list[PsuRedundancy]:
    """Redundancy groups of ``Power.Redundancy`` or ``PowerSubsystem.PowerSupplyRedundancy``: a group
    is redundant while its ``Status.Health`` is OK (the state then reads "Fully Redundant")."""
    found = []
    for index, group in enumerate(groups if isinstance(groups, list) else []):
        if not isinstance(group, dict):
            continue
        _, health = _status(group)
        if not health:
            continue
        name = str(group.get("Name") or group.get("MemberId") or group.get("RedundancyType") or index)
        state = "Fully Redundant" if health.upper() == "OK" else f"Redundancy {health}"
        found.append(PsuRedundancy(chassis_id, name, state))
    return found


class RedfishClient:
    def __init__(
        self,
        base_url: str,
        credentials: tuple[str, str] | None,
        timeout_s: float,
        verify: bool | str,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        origin = urlsplit(self.base_url)
        self.origin = f"{origin.scheme}://{origin.netloc}"
        self.client = httpx.Client(
            auth=httpx.BasicAuth(*credentials) if credentials else None,
            timeout=httpx.Timeout(timeout_s),
            verify=tls_verify(verify),
            headers={"Accept": "application/json", "OData-Version": "4.0"},
            follow_redirects=False,
            transport=transport,  # None: the network; the twin's backfill hands its BMCs in-process
        )

    def url(self, path: str) -> str:
        # Real BMCs answer with absolute paths ("/redfish/v1/Chassis/1"); a BMC behind a path prefix
        # (the twin's /bmc/<node>) may or may not include it. Both resolve against the base URL.
        if path.startswith("/redfish/"):
            return self.base_url + path
        return urljoin(self.origin + "/", path)

    def get(self, path: str) -> dict:
        response = self.client.get(self.url(path))
        response.raise_for_status()
        body = response.json()
        if not isinstance(body, dict):
            raise ValueError(f"{path}: expected a JSON object")
        return body

    def read(self, problems: Problems) -> BmcReading:
        reading = BmcReading("redfish")
        root = self.get("/redfish/v1/")
        chassis_collection = self.get(_link(root, "Chassis") or "/redfish/v1/Chassis")
        for chassis_path in _members(chassis_collection):
            try:
                self._chassis(chassis_path, reading, problems)
            except (httpx.HTTPError, ValueError) as exc:
                problems.add("redfish", f"{chassis_path}: {exc}")
        return reading

    def _chassis(self, path: str, reading: BmcReading, problems: Problems) -> None:
        chassis = self.get(path)
        chassis_id = str(chassis.get("Id") or path.rstrip("/").rsplit("/", 1)[-1])
        if isinstance(chassis.get("PowerState"), str):
            # A host that crashed and is being power-cycled shows Off / PoweringOn here first.
            reading.chassis_power_on[chassis_id] = chassis["PowerState"] == "On"
        power_path = _link(chassis, "Power")
        subsystem_path = _link(chassis, "PowerSubsystem")
        legacy_psus: list[Psu] = []
        legacy_redundancy: list[PsuRedundancy] = []
        if power_path:
            power = self.get(power_path)
            for control in power.get("PowerControl") or []:
                watts = _number(control.get("PowerConsumedWatts")) if isinstance(control, dict) else None
                if watts is not None:
                    reading.chassis_watts[chassis_id] = watts
                    break
            legacy_psus = [self._legacy_psu(chassis_id, p) for p in power.get("PowerSupplies") or []]
            legacy_redundancy = _redundancy(chassis_id, power.get("Redundancy"))
        if chassis_id not in reading.chassis_watts and _link(chassis, "EnvironmentMetrics"):
            env = self.get(_link(chassis, "EnvironmentMetrics") or "")
            watts = _reading(env, "PowerWatts")
            if watts is not None:
                reading.chassis_watts[chassis_id] = watts
        new_psus: list[Psu] = []
        new_redundancy: list[PsuRedundancy] = []
        if subsystem_path:
            new_psus, new_redundancy = self._subsystem_psus(chassis_id, subsystem_path, problems)
        # Both schemas describe the same supplies: prefer the newer one when the BMC has it.
        reading.psus.extend(new_psus or [p for p in legacy_psus if p is not None])
        reading.redundancy.extend(new_redundancy or legacy_redundancy)

    @staticmethod
    def _legacy_psu(chassis_id: str, psu: object) -> Psu | None:
        if not isinstance(psu, dict):
            return None
        state, health = _status(psu)
        name = str(psu.get("MemberId") or psu.get("Name") or "")
        output = _number(psu.get("LastPowerOutputWatts"))
        if output is None:
            output = _number(psu.get("PowerOutputWatts"))
        return Psu(
            chassis_id,
            name,
            present=state.lower() != "absent",
            state=state,
            health=health,
            input_watts=_number(psu.get("PowerInputWatts")),
            output_watts=output,
            input_volts=_number(psu.get("LineInputVoltage")),
        )

    def _subsystem_psus(
        self, chassis_id: str, subsystem_path: str, problems: Problems
    ) -> tuple[list[Psu], list[PsuRedundancy]]:
        subsystem = self.get(subsystem_path)
        redundancy = _redundancy(chassis_id, subsystem.get("PowerSupplyRedundancy"))
        collection_path = _link(subsystem, "PowerSupplies")
        if not collection_path:
            return [], redundancy
        psus = []
        for psu_path in _members(self.get(collection_path)):
            try:
                psu = self.get(psu_path)
                state, health = _status(psu)
                item = Psu(
                    chassis_id,
                    str(psu.get("Id") or psu_path.rstrip("/").rsplit("/", 1)[-1]),
                    present=state.lower() != "absent",
                    state=state,
                    health=health,
                )
                metrics_path = _link(psu, "Metrics")
                if metrics_path and item.present:
                    metrics = self.get(metrics_path)
                    item.input_watts = _reading(metrics, "InputPowerWatts")
                    item.output_watts = _reading(metrics, "OutputPowerWatts")
                    item.input_volts = _reading(metrics, "InputVoltage")
                psus.append(item)
            except (httpx.HTTPError, ValueError) as exc:
                problems.add("redfish", f"{psu_path}: {exc}")
        return psus, redundancy

    def close(self) -> None:
        self.client.close()


# -- IPMI ------------------------------------------------------------------------------------------

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


class BmcSource(Source):
    name = "bmc"

    def __init__(self, client: RedfishClient | IpmiClient, interval_s: float = 30.0) -> None:
        self.client = client
        self.interval_s = interval_s
        self.last: BmcReading | None = None
        self.last_at = -1e18
        self.last_problems: Problems = Problems()

    def gather(self, problems: Problems) -> list[Metric]:
        if time.monotonic() - self.last_at >= self.interval_s:
            fresh = Problems()
            self.last = self._read(fresh)
            self.last_at = time.monotonic()
            self.last_problems = fresh
            problems.merge(fresh)
        elif self.last_problems:
            # A cached failed reading stays a failure until the next attempt, counted once.
            problems.merge(self.last_problems, count=False)
        return self._families(self.last)

    def _read(self, problems: Problems) -> BmcReading | None:
        protocol = "redfish" if isinstance(self.client, RedfishClient) else "ipmitool"
        try:
            return self.client.read(problems)
        except (httpx.HTTPError, ValueError, RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            problems.add(protocol, str(exc) or repr(exc))
            return None

    def _families(self, reading: BmcReading | None) -> list[Metric]:
        f = Families()
        protocol = "redfish" if isinstance(self.client, RedfishClient) else "ipmi"
        f.gauge("fleetsight_bmc_up", "1 when the BMC answered its last poll.", ["protocol"]).add_metric(
            [protocol], float(reading is not None)
        )
        if reading is None:
            return f.all()
        power = f.gauge(
            "fleetsight_bmc_power_consumed_watts", "Chassis power draw reported by the BMC.", ["chassis"]
        )
        for chassis, watts in sorted(reading.chassis_watts.items()):
            power.add_metric([chassis], watts)
        power_on = f.gauge(
            "fleetsight_bmc_chassis_power_on", "1 when the chassis PowerState is On.", ["chassis"]
        )
        for chassis, on in sorted(reading.chassis_power_on.items()):
            power_on.add_metric([chassis], float(on))
        labels = ["chassis", "psu"]
        present = f.gauge("fleetsight_bmc_psu_present", "1 when the power supply is present.", labels)
        healthy = f.gauge(
            "fleetsight_bmc_psu_healthy",
            "1 only when the power supply is present, enabled and healthy.",
            labels,
        )
        info = f.gauge(
            "fleetsight_bmc_psu_info",
            "Power supply state and health as the BMC words them (value 1).",
            [*labels, "state", "health"],
        )
        watts_in = f.gauge("fleetsight_bmc_psu_input_power_watts", "Power supply input power.", labels)
        watts_out = f.gauge("fleetsight_bmc_psu_output_power_watts", "Power supply output power.", labels)
        volts_in = f.gauge(
            "fleetsight_bmc_psu_input_voltage_volts", "Power supply input (line) voltage.", labels
        )
        for psu in reading.psus:
            values = [psu.chassis, psu.psu]
            present.add_metric(values, float(psu.present))
            healthy.add_metric(values, float(psu.healthy))
            info.add_metric([*values, psu.state, psu.health], 1.0)
            for family, value in (
                (watts_in, psu.input_watts),
                (watts_out, psu.output_watts),
                (volts_in, psu.input_volts),
            ):
                if value is not None:
                    family.add_metric(values, value)
        redundant = f.gauge(
            "fleetsight_bmc_psu_redundancy_ok",
            "1 when the power supplies' redundancy sensor reads Fully Redundant, 0 when redundancy is"
            " lost or degraded (the node may still have enough power).",
            ["chassis", "sensor"],
        )
        redundancy_info = f.gauge(
            "fleetsight_bmc_psu_redundancy_info",
            "The power supplies' redundancy state as the BMC words it (value 1).",
            ["chassis", "sensor", "state"],
        )
        for group in reading.redundancy:
            redundant.add_metric([group.chassis, group.sensor], float(group.ok))
            redundancy_info.add_metric([group.chassis, group.sensor, group.state], 1.0)
        if reading.sel_entries:
            sel = f.gauge(
                "fleetsight_bmc_sel_entries",
                "Entries in the BMC's event log by sensor type.",
                ["sensor_type"],
            )
            for sensor_type, count in sorted(reading.sel_entries.items()):
                sel.add_metric([sensor_type], count)
        return f.all()

    def close(self) -> None:
        self.client.close()
