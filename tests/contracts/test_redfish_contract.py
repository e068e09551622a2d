"""Redfish contract: FleetSight's BMC collector against DMTF's own mockup, and the twin's Redfish
resources against DMTF's own JSON schemas (../shared/PRODUCERS.md: "Redfish").

Vendored (tests/fixtures/redfish/PROVENANCE.md):
- ``public-rackmount1/``: DMTF/Redfish-Mockup-Server, ``public-rackmount1/``, commit 9a86585f5e93: a
  chassis with both the legacy ``Power`` and ``PowerSubsystem`` (one supply in Health Warning, an empty
  bay, a redundancy group out of service), served here as the Mockup Server does (``<path>/index.json``).
- ``schemas/``: DMTF/Redfish-Publications, ``json-schema/``, commit 26c949654e3e: the versions the twin
  claims in its ``@odata.type``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from exporter_helpers import JsonServer, bmc_agent, value
from jsonschema import Draft7Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from twin import render
from twin.scenario import from_dict
from twin.sim import Simulation

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "redfish"
MOCKUP = FIXTURES / "public-rackmount1"
SCHEMAS = FIXTURES / "schemas"
DMTF = "http://redfish.dmtf.org/schemas/v1/"


def mockup_routes(root: Path) -> dict[str, object]:
    """DMTF's mockup tree as JsonServer routes: GET /redfish/v1/X (with or without a final slash)
    answers X/index.json."""
    routes: dict[str, object] = {}
    for file in root.rglob("index.json"):
        path = "/" + file.parent.relative_to(root).as_posix()
        routes[path] = routes[path + "/"] = file.read_text()
    return routes


@pytest.fixture(scope="module")
def mockup_scrape(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = JsonServer(mockup_routes(MOCKUP))
    agent = bmc_agent(tmp_path_factory.mktemp("node"), redfish_url=server.url)
    try:
        yield agent.scrape().decode()
    finally:
        agent.close()
        server.close()


def test_dmtf_mockup_chassis_power(mockup_scrape: str) -> None:
    assert value(mockup_scrape, "fleetsight_bmc_up", protocol="redfish") == 1
    assert value(mockup_scrape, "fleetsight_collector_success", collector="bmc") == 1
    # Power.PowerControl[0].PowerConsumedWatts (344), not EnvironmentMetrics.PowerWatts (374).
    assert value(mockup_scrape, "fleetsight_bmc_power_consumed_watts", chassis="1U") == 344
    assert value(mockup_scrape, "fleetsight_bmc_chassis_power_on", chassis="1U") == 1


def test_dmtf_mockup_power_supplies(mockup_scrape: str) -> None:
    bay1 = {"chassis": "1U", "psu": "Bay1"}
    assert value(mockup_scrape, "fleetsight_bmc_psu_present", **bay1) == 1
    assert value(mockup_scrape, "fleetsight_bmc_psu_healthy", **bay1) == 0  # Health "Warning"
    assert value(mockup_scrape, "fleetsight_bmc_psu_info", state="Enabled", health="Warning", **bay1) == 1
    # PowerSupplyMetrics: InputPowerWatts / OutputPowerWatts / InputVoltage .Reading
    assert value(mockup_scrape, "fleetsight_bmc_psu_input_power_watts", **bay1) == 937.4
    assert value(mockup_scrape, "fleetsight_bmc_psu_output_power_watts", **bay1) == 937.4
    assert value(mockup_scrape, "fleetsight_bmc_psu_input_voltage_volts", **bay1) == 230.2
    # Bay2 is an empty bay (State "Absent", no Health): not present, not a failure, no readings.
    assert value(mockup_scrape, "fleetsight_bmc_psu_present", chassis="1U", psu="Bay2") == 0
    assert value(mockup_scrape, "fleetsight_bmc_psu_input_power_watts", psu="Bay2") is None
    # PowerSubsystem is preferred: the legacy Power.PowerSupplies member "0" is not counted twice.
    assert value(mockup_scrape, "fleetsight_bmc_psu_present", psu="0") is None


def test_dmtf_mockup_redundancy_out_of_service_is_not_redundant(mockup_scrape: str) -> None:
    # The group reads Health "OK" but State "UnavailableOffline" (its second bay is empty).
    group = {"chassis": "1U", "sensor": "Failover"}
    assert value(mockup_scrape, "fleetsight_bmc_psu_redundancy_ok", **group) == 0
    info = "fleetsight_bmc_psu_redundancy_info"
    assert value(mockup_scrape, info, state="Redundancy UnavailableOffline", **group) == 1


# ------------------------------------------------------------------ the twin against DMTF's schemas
class _Open(dict):
    """A schema that accepts anything, down to every JSON pointer into it."""

    def __missing__(self, key: str) -> _Open:
        return _Open()


def _registry() -> Registry:
    """The vendored schemas by their DMTF URL; any other DMTF schema (Resource, Sensor, odata...) is
    accepted as is: this checks the properties and required fields of the resources the twin serves."""
    known = {DMTF + p.name: json.loads(p.read_text()) for p in SCHEMAS.glob("*.json")}

    def retrieve(uri: str) -> Resource:
        return DRAFT7.create_resource(known.get(uri, _Open()))

    return Registry(retrieve=retrieve)  # type: ignore[call-arg]


def validate(body: dict[str, Any]) -> list[str]:
    """Errors of ``body`` against the schema its ``@odata.type`` names (#PowerSupply.v1_5_0.PowerSupply)."""
    namespace, _, definition = body["@odata.type"].lstrip("#").rpartition(".")
    schema = {"$ref": f"{DMTF}{namespace}.json#/definitions/{definition}"}
    validator = Draft7Validator(schema, registry=_registry())
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(body)]


def twin_after_psu_failure() -> Simulation:
    scenario = from_dict(
        {
            "name": "redfish-contract",
            "seed": 3,
            "start": "2026-11-21T10:00:00Z",
            "duration": "10m",
            "tick": "5s",
            "cluster": {"name": "c", "nodes": 2},
            "jobs": [{"id": "1", "name": "j", "nodes": 2, "profile": "llm-20b"}],
            "faults": [{"kind": "psu_failure", "target": {"node": "n0001", "psu": 1}, "onset": "1m"}],
            "realism": "off",
        }
    )
    sim = Simulation(scenario, scenario.start)
    for _ in range(int(120 / scenario.tick)):
        sim.advance()
    assert not sim.psu_ok[0].all(), "the fault must be on for the failed supply's shape to be checked"
    return sim


def test_the_validator_rejects_what_the_schema_forbids() -> None:
    # The same check that passes the twin fails a group without its members and a supply with a typo.
    body = json.loads((MOCKUP / "redfish/v1/Chassis/1U/PowerSubsystem/index.json").read_text())
    assert validate(body) == []
    del body["PowerSupplyRedundancy"][0]["RedundancyGroup"]
    assert [e.split(":")[0] for e in validate(body)] == ["PowerSupplyRedundancy/0"]
    bay = json.loads(
        (MOCKUP / "redfish/v1/Chassis/1U/PowerSubsystem/PowerSupplies/Bay1/index.json").read_text()
    )
    assert validate(bay) == []
    bay["PowerCapacityWats"] = 1
    assert validate(bay)


def test_twin_redfish_resources_match_dmtf_schemas() -> None:
    sim = twin_after_psu_failure()
    bodies = [
        render.power(sim, 0),
        render.power_subsystem(sim, 0),
        *(render.psu(sim, 0, i) for i in range(render.psu_count(sim))),
        *(render.psu_metrics(sim, 0, i) for i in range(render.psu_count(sim))),
    ]
    errors = {body["@odata.id"]: validate(body) for body in bodies}
    assert {path: e for path, e in errors.items() if e} == {}
