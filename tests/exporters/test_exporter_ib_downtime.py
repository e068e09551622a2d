"""Each IB port's cuts and cumulative down-time from the kernel's own mlx5 "Link down"/"Link up" lines
(exporters/ib_downtime.py through the Xid collector's reader and state file): a cut of milliseconds
between two scrapes is counted with its length, whatever the port's state at scrape time.

The lines are the twin's (twin/faults.py ``ib_link_lines``, the mlx5 driver's wording) in rsyslog's file
format with microsecond stamps (twin/log_files.py), read from a real file by the real reader.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from exporters.core import Problems
from exporters.gpus import GpuMap
from exporters.ib_downtime import parse_link_change
from exporters.xid import XidSource
from twin import faults as fc
from twin import hardware as hw
from twin.log_files import syslog_time

T0 = dt.datetime(2026, 11, 21, 11, 0, tzinfo=dt.UTC).timestamp()
PORT = 3  # mlx5_3
BDF = hw.HCA_BDFS[PORT]


def lines(at: float, up: bool) -> list[str]:
    """The kernel's lines of one port change at unix time ``at``, as rsyslog writes them."""
    texts = fc.ib_link_lines(BDF, hw.netdev_name(BDF), hw.IB_DEVICES[PORT], up=up)
    return [f"{syslog_time(at)} n0001 kernel: [ 1234.567890] {text}\n" for text in texts]


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Path]:
    """A sysfs whose mlx5_3 points at its PCI function, an empty kernel log, a state folder."""
    sysfs = tmp_path / "sys"
    (sysfs / "bus/pci/devices" / BDF).mkdir(parents=True)
    device = sysfs / "class/infiniband" / hw.IB_DEVICES[PORT]
    device.mkdir(parents=True)
    (device / "device").symlink_to(f"../../../bus/pci/devices/{BDF}")
    log = tmp_path / "kern.log"
    log.write_text("")
    return {"sysfs": sysfs, "log": log, "state": tmp_path / "xid-n0001.json"}


def source(host: dict[str, Path]) -> XidSource:
    return XidSource("file", str(host["log"]), GpuMap([]), str(host["state"]), sysfs_root=str(host["sysfs"]))


def samples(src: XidSource) -> dict[str, dict[tuple, float]]:
    """{sample name: {label items: value}} of one scrape."""
    out: dict[str, dict[tuple, float]] = {}
    for metric in src.gather(Problems()):
        for sample in metric.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def port_value(scrape: dict[str, dict[tuple, float]], name: str) -> float | None:
    """The port's value; other labels (the agent's `node`, set where the environment names one) aside."""
    wanted = {("device", hw.IB_DEVICES[PORT]), ("pci_bdf", BDF), ("port", "1")}
    found = [value for labels, value in scrape.get(name, {}).items() if wanted <= set(labels)]
    assert len(found) <= 1, (name, scrape.get(name))
    return found[0] if found else None


def append(host: dict[str, Path], text: list[str]) -> None:
    with open(host["log"], "a") as handle:
        handle.writelines(text)


def test_the_real_mlx5_lines_parse_to_their_port_and_direction() -> None:
    [down, *_] = fc.ib_link_lines(BDF, hw.netdev_name(BDF), hw.IB_DEVICES[PORT], up=False)
    [up, *_] = fc.ib_link_lines(BDF, hw.netdev_name(BDF), hw.IB_DEVICES[PORT], up=True)
    assert parse_link_change(down) == (BDF, False)
    assert parse_link_change(up) == (BDF, True)
    # the netdev's and mlx5_ib's own lines name no PCI function: one change is counted once
    assert parse_link_change(f"{hw.netdev_name(BDF)}: Link down") is None
    assert parse_link_change("NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.") is None


def test_cuts_between_scrapes_add_their_lengths_and_survive_a_restart(host: dict[str, Path]) -> None:
    # a lone "Link up" (its down was before the agent started) adds nothing
    append(host, lines(T0 - 5.0, up=True))
    append(host, lines(T0, up=False) + lines(T0 + 0.25, up=True))
    append(host, lines(T0 + 40.0, up=False) + lines(T0 + 40.003, up=True))
    first = samples(src := source(host))
    assert port_value(first, "fleetsight_infiniband_port_cuts_total") == 2
    assert port_value(first, "fleetsight_infiniband_port_down_seconds_total") == pytest.approx(
        0.253, abs=1e-6
    )
    assert port_value(first, "fleetsight_infiniband_port_longest_cut_seconds") == pytest.approx(
        0.25, abs=1e-6
    )
    assert port_value(first, "fleetsight_infiniband_port_down_since_timestamp_seconds") is None
    # a cut still open at scrape time is shown by when it began, and counted once it closes
    append(host, lines(T0 + 90.0, up=False))
    assert port_value(
        samples(src), "fleetsight_infiniband_port_down_since_timestamp_seconds"
    ) == pytest.approx(T0 + 90.0)
    src.close()
    # a restarted agent continues from the saved state: the totals neither reset nor double
    append(host, lines(T0 + 90.5, up=True))
    restarted = samples(again := source(host))
    again.close()
    assert port_value(restarted, "fleetsight_infiniband_port_cuts_total") == 3
    assert port_value(restarted, "fleetsight_infiniband_port_down_seconds_total") == pytest.approx(
        0.753, abs=1e-6
    )
    assert port_value(restarted, "fleetsight_infiniband_port_longest_cut_seconds") == pytest.approx(
        0.5, abs=1e-6
    )


def test_every_hca_is_exported_at_zero_before_its_first_cut(host: dict[str, Path]) -> None:
    # A counter that first appeared with its first cut in it would hide that cut from increase().
    append(host, ["2026-11-21T11:00:00.000000+00:00 n0001 kernel: [ 1.0] eth0: link becomes ready\n"])
    scrape = samples(src := source(host))
    src.close()
    assert port_value(scrape, "fleetsight_infiniband_port_cuts_total") == 0
    assert port_value(scrape, "fleetsight_infiniband_port_down_seconds_total") == 0


def test_a_host_without_ib_devices_exports_no_port_series(host: dict[str, Path]) -> None:
    for link in (host["sysfs"] / "class/infiniband").glob("*/device"):
        link.unlink()
    scrape = samples(src := source(host))
    src.close()
    assert not [name for name in scrape if name.startswith("fleetsight_infiniband_port_")]
