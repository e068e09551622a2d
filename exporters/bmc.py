"""BMC power and power supplies: the BMC's credentials and the node agent's ``bmc`` collector, which
reads through either client: Redfish (:mod:`.redfish`) or, for BMCs without it, ``ipmitool``
(:mod:`.ipmi`); both fill the model of :mod:`.bmc_model`. A BMC is slow (hundreds of ms per request),
so a reading is kept for ``interval_s`` and scrapes in between reuse it.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any, Protocol

import httpx
from prometheus_client.core import Metric

from .bmc_model import BmcReading
from .core import Problems, Source, register_collector
from .exposition import Families
from .ipmi import IpmiClient
from .redfish import RedfishClient


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


class BmcClient(Protocol):
    """What the collector needs of a BMC client (RedfishClient, IpmiClient)."""

    protocol: str  # "redfish" or "ipmitool": how failures are labelled

    def read(self, problems: Problems) -> BmcReading: ...

    def close(self) -> None: ...


class BmcSource(Source):
    name = "bmc"

    def __init__(self, client: BmcClient, interval_s: float = 30.0) -> None:
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
        protocol = self.client.protocol
        try:
            return self.client.read(problems)
        except (httpx.HTTPError, ValueError, RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            problems.add(protocol, str(exc) or repr(exc))
            return None

    def _families(self, reading: BmcReading | None) -> list[Metric]:
        f = Families()
        protocol = "redfish" if self.client.protocol == "redfish" else "ipmi"  # the metric label
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


@register_collector("bmc", position=40)
def bmc_collector(opts: Any, _gpu_map: Any) -> Source | None:
    """Redfish when a URL is given, else ipmitool when configured, else no BMC collector on this host."""
    if not (opts.redfish_url or opts.ipmitool):
        return None
    credentials = load_credentials(opts.bmc_credentials_file)
    client: BmcClient
    if opts.redfish_url:
        verify: bool | str = opts.bmc_ca_file or opts.bmc_verify_tls
        client = RedfishClient(opts.redfish_url, credentials, opts.bmc_timeout_s, verify, opts.bmc_transport)
    else:
        client = IpmiClient(opts.ipmitool, opts.ipmi_host, credentials, opts.bmc_timeout_s * 3)
    return BmcSource(client, opts.bmc_interval_s)
