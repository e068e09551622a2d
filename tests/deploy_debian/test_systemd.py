"""The systemd units of deploy/systemd: `systemd-analyze verify` accepts each, and `systemd-analyze
security --offline=true` scores each at or under its documented exposure (docs/deployment.md, "Bare
metal"). No systemd runs as PID 1 here, so nothing is started: verify loads the unit as systemd would
(directives, dependencies, the ExecStart binary), security scores its sandbox settings. `verify` needs
the ExecStart binary to exist: the check points it at this checkout's `fleetsight` (the same entry
point the package installs as /opt/fleetsight/venv/bin/fleetsight); test_packages.py verifies the
installed units against the installed one."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from baremetal_helpers import REPO

UNITS = REPO / "deploy" / "systemd"
INSTALLED_BINARY = "/opt/fleetsight/venv/bin/fleetsight"
# Exposure ceilings (0 = fully sandboxed, 10 = none): the central services reach the network and their
# state directory only; the node agent also reads the kernel log (CAP_SYSLOG) and the BMC and GPU devices.
CEILINGS = {
    "fleetsight-node.service": 2.0,
    "fleetsight-fabric.service": 1.2,
    "fleetsight-anomaly.service": 1.2,
    "fleetsight-health.service": 1.2,
    "fleetsight-chatbot.service": 1.2,
    "fleetsight-checks.service": 1.2,
    "fleetsight-fleet.service": 1.2,  # the global layer: reads its clusters file, writes nothing
    "fleetsight-checks-light.service": 1.2,  # oneshot, started by fleetsight-checks-light.timer
}
GOOD = ("SAFE", "OK")


def systemd_analyze() -> str:
    binary = shutil.which("systemd-analyze")
    if binary is None:
        pytest.fail("systemd-analyze is not installed: run `fleetsight setup`")
    return binary


def verify(unit: Path, binary: str, folder: Path) -> subprocess.CompletedProcess[str]:
    copy = folder / unit.name
    copy.write_text(unit.read_text().replace(INSTALLED_BINARY, binary))
    return subprocess.run(
        [systemd_analyze(), "verify", str(copy)], capture_output=True, text=True, timeout=60, check=False
    )


def exposure(unit: Path) -> tuple[float, str]:
    result = subprocess.run(
        [systemd_analyze(), "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    match = re.search(r"Overall exposure level for \S+: ([\d.]+) (\w+)", result.stdout)
    assert match, f"{unit.name}: no score in\n{result.stdout}\n{result.stderr}"
    return float(match.group(1)), match.group(2)


def test_every_long_running_component_has_a_unit() -> None:
    assert sorted(p.name for p in UNITS.glob("*.service")) == sorted(CEILINGS)


def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    binary = str(Path(sys.executable).with_name("fleetsight"))
    for unit in sorted(UNITS.glob("*.service")):
        result = verify(unit, binary, tmp_path)
        assert result.returncode == 0 and not result.stderr.strip(), f"{unit.name}: {result.stderr}"


def test_verify_can_fail(tmp_path: Path) -> None:
    """The check is not blind: a typo in a directive and a missing binary are both reported."""
    broken = tmp_path / "src" / "fleetsight-health.service"
    broken.parent.mkdir()
    broken.write_text((UNITS / "fleetsight-health.service").read_text().replace("PrivateTmp", "PrivateTpm"))
    result = verify(broken, str(Path(sys.executable).with_name("fleetsight")), tmp_path)
    assert "PrivateTpm" in result.stderr
    assert verify(UNITS / "fleetsight-node.service", "/nonexistent/fleetsight", tmp_path).returncode != 0


def test_security_exposure_per_unit() -> None:
    table = {unit.name: exposure(unit) for unit in sorted(UNITS.glob("*.service"))}
    print("\nsystemd-analyze security --offline=true:")
    for name, (score, label) in table.items():
        print(f"  {name:30} {score:4.1f} {label}")
    for name, (score, label) in table.items():
        assert label in GOOD and score <= CEILINGS[name], f"{name}: {score} {label} > {CEILINGS[name]}"


def test_services_run_unprivileged_with_the_core_sandbox() -> None:
    for unit in UNITS.glob("*.service"):
        text = unit.read_text()
        for line in (
            "User=fleetsight",
            "NoNewPrivileges=yes",
            "ProtectSystem=strict",
            "PrivateTmp=yes",
            "SystemCallFilter=@system-service",
            "DevicePolicy=closed",
        ):
            assert f"\n{line}\n" in text, f"{unit.name}: {line} missing"
