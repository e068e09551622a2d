"""Redfish, the BMC's REST API: the (deprecated but universal) ``Chassis/<id>/Power`` resource
(``PowerControl``, ``PowerSupplies``) and the newer ``Chassis/<id>/PowerSubsystem/PowerSupplies/<psu>``
with its ``Metrics`` (``PowerSupplyMetrics``: ``InputPowerWatts.Reading``...), plus ``EnvironmentMetrics``
``PowerWatts`` for the chassis draw where ``Power`` is absent."""

from __future__ import annotations

from urllib.parse import urljoin, urlsplit

import httpx

from .bmc_model import BmcReading, Psu, PsuRedundancy
from .core import Problems, tls_verify


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
    is redundant while it is in service and healthy (the state then reads "Fully Redundant")."""
    found = []
    for index, group in enumerate(groups if isinstance(groups, list) else []):
        if not isinstance(group, dict):
            continue
        state, health = _status(group)
        if not health:
            continue
        name = str(group.get("Name") or group.get("MemberId") or group.get("RedundancyType") or index)
        found.append(PsuRedundancy(chassis_id, name, _redundancy_state(state, health)))
    return found


def _redundancy_state(state: str, health: str) -> str:
    # Health alone is not enough: DMTF's public-rackmount1 mockup has a group with one bay empty that
    # reads Health "OK" but State "UnavailableOffline" (redundancy out of service). Only an "Enabled"
    # group (or one that does not say) protects the node from the next failure.
    if state and state.lower() != "enabled":
        return f"Redundancy {state}"
    return "Fully Redundant" if health.upper() == "OK" else f"Redundancy {health}"


class RedfishClient:
    protocol = "redfish"

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
