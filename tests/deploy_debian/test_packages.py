"""`make deb`'s packages, built once per session (deploy/debian/build.py; the dependencies' venv comes
from the cache under .cache/deb/ after the first build) and checked as far as this machine allows.

No systemd as PID 1 and a shared host, so the packages are not installed into the real root: they are
unpacked (`dpkg-deb -x`) into a throwaway root, where the file layout, the conffiles, the maintainer
scripts (`sh -n`; dh_installsystemd's snippets present) and the installed units (`systemd-analyze
verify`) are checked, and the installed node agent is started from its installed location and serves
/metrics. What only a real install shows (adduser, deb-systemd-helper starting the units) is not run."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from baremetal_helpers import REPO
from health_helpers import Process

from support import free_port

PACKAGES = ("fleetsight-python", "fleetsight-node", "fleetsight-central")
NODE_CONFFILES = {
    "/etc/fleetsight/node.env",
    "/etc/fleetsight/healthcheck.env",
    "/etc/fleetsight/rsyslog-fleetsight.conf",
}
CENTRAL_CONFFILES = {
    "/etc/fleetsight/fabric.env",
    "/etc/fleetsight/anomaly.env",
    "/etc/fleetsight/health.env",
    "/etc/fleetsight/chatbot.env",
    "/etc/fleetsight/health-policy.yml",
    "/etc/fleetsight/prometheus/prometheus.yml",
    "/etc/fleetsight/alertmanager/alertmanager.yml",
    "/etc/fleetsight/thanos/objstore.yml",
}


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: run `fleetsight setup`")
    return found


@pytest.fixture(scope="session")
def debs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    for name in ("dpkg-buildpackage", "dh", "lintian"):
        tool(name)
    out = tmp_path_factory.mktemp("deb")
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "deploy.debian.build", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    print(f"\nmake deb: {time.monotonic() - started:.0f} s")
    print("\n".join(line for line in result.stdout.splitlines() if line.startswith("deb:")))
    return {p.name.split("_")[0]: p for p in out.glob("*.deb")}


@pytest.fixture(scope="session")
def root(debs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("root")
    for deb in debs.values():
        subprocess.run([tool("dpkg-deb"), "-x", str(deb), str(folder)], check=True, timeout=300)
    return folder


def control_file(deb: Path, name: str, tmp: Path) -> str:
    folder = tmp / deb.name
    if not folder.exists():
        subprocess.run([tool("dpkg-deb"), "-e", str(deb), str(folder)], check=True, timeout=60)
    path = folder / name
    return path.read_text() if path.exists() else ""


def test_make_deb_builds_the_three_packages(debs: dict[str, Path]) -> None:
    assert sorted(debs) == sorted(PACKAGES)


def test_lintian_reports_no_error_and_no_unexplained_warning(debs: dict[str, Path]) -> None:
    result = subprocess.run(
        [tool("lintian"), "--fail-on", "none", *map(str, debs.values())],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    tags = [line for line in result.stdout.splitlines() if line[:2] in ("E:", "W:")]
    print(f"\nlintian: {len(tags)} error(s)/warning(s) left", *tags, sep="\n")
    assert not tags, "lintian (errors and warnings not overridden in deploy/debian/overrides):\n" + "\n".join(
        tags
    )


def test_conffiles_are_the_etc_files(debs: dict[str, Path], tmp_path: Path) -> None:
    node = set(control_file(debs["fleetsight-node"], "conffiles", tmp_path).split())
    central = set(control_file(debs["fleetsight-central"], "conffiles", tmp_path).split())
    assert node >= NODE_CONFFILES
    assert central >= CENTRAL_CONFFILES
    assert all(path.startswith("/etc/") for path in node | central)


def test_maintainer_scripts_parse_and_carry_the_unit_snippets(debs: dict[str, Path], tmp_path: Path) -> None:
    for package, deb in debs.items():
        for script in ("preinst", "postinst", "prerm", "postrm"):
            text = control_file(deb, script, tmp_path)
            if text:
                check = subprocess.run(["sh", "-n", "-c", text], capture_output=True, text=True, check=False)
                assert check.returncode == 0, f"{package} {script}: {check.stderr}"
    postinst = control_file(debs["fleetsight-python"], "postinst", tmp_path)
    assert "adduser --system" in postinst
    for package, units in (
        ("fleetsight-node", ["fleetsight-node.service"]),
        (
            "fleetsight-central",
            [f"fleetsight-{n}.service" for n in ("fabric", "anomaly", "health", "chatbot")],
        ),
    ):
        postinst = control_file(debs[package], "postinst", tmp_path)
        prerm = control_file(debs[package], "prerm", tmp_path)
        postrm = control_file(debs[package], "postrm", tmp_path)
        for unit in units:
            assert f"deb-systemd-helper unmask '{unit}'" in postinst, f"{package}: {unit} not enabled"
            assert unit in prerm, f"{package}: {unit} not stopped on remove"
            assert "purge" in postrm


def test_file_layout(root: Path) -> None:
    for path in (
        "opt/fleetsight/venv/bin/fleetsight",
        "opt/fleetsight/venv/bin/python",
        "lib/systemd/system/fleetsight-node.service",
        "lib/systemd/system/fleetsight-health.service",
        "lib/udev/rules.d/60-fleetsight-ipmi.rules",
        "usr/lib/fleetsight/slurm/healthcheck",
        "usr/lib/fleetsight/slurm/prolog",
        "usr/share/fleetsight/docs/runbooks",
        "etc/fleetsight/prometheus/rules",
    ):
        assert (root / path).exists(), path
    for hook in ("healthcheck", "prolog", "preflight"):
        assert (root / "usr/lib/fleetsight/slurm" / hook).stat().st_mode & 0o111, hook
    prolog = root / "usr/lib/fleetsight/slurm/prolog"
    assert subprocess.run(["sh", "-n", str(prolog)], check=False).returncode == 0
    assert (root / "opt/fleetsight/venv/bin/python").resolve() == Path("/usr/bin/python3.11").resolve()


def test_installed_units_verify_against_the_installed_binary(root: Path, tmp_path: Path) -> None:
    binary = str(root / "opt/fleetsight/venv/bin/fleetsight")
    for unit in sorted((root / "lib/systemd/system").glob("*.service")):
        copy = tmp_path / unit.name
        copy.write_text(unit.read_text().replace("/opt/fleetsight/venv/bin/fleetsight", binary))
        result = subprocess.run(
            [tool("systemd-analyze"), "verify", str(copy)], capture_output=True, text=True, check=False
        )
        assert result.returncode == 0 and not result.stderr.strip(), f"{unit.name}: {result.stderr}"


@pytest.fixture
def installed_agent(root: Path, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    kernlog = REPO / "tests" / "exporters" / "fixtures" / "kernlog" / "xid_generations.log"
    command = [str(root / "opt/fleetsight/venv/bin/fleetsight"), "exporter", "node", "--node", "n0001"]
    command += ["--no-state", "--collector", "xid", "--kmsg-file", str(kernlog), f"--listen=127.0.0.1:{port}"]
    process = Process("installed node agent", command, tmp_path / "agent.log", env={"PATH": "/usr/bin:/bin"})
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        process.wait_ready(url)
        yield url
    finally:
        process.stop()


def test_installed_node_agent_starts_from_its_location_and_serves_metrics(
    installed_agent: str, root: Path
) -> None:
    body = httpx.get(installed_agent, timeout=10).text
    assert "fleetsight_gpu_xid_errors" in body
    where = subprocess.run(
        [str(root / "opt/fleetsight/venv/bin/python"), "-c", "import fleetsight; print(fleetsight.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    ).stdout
    assert where.startswith(str(root / "opt/fleetsight/venv/lib/python3.11/site-packages/")), where


def test_every_installed_unit_command_runs_from_the_installed_venv(root: Path) -> None:
    """Each unit's ExecStart command (with its packaged FLEETSIGHT_ARGS) parses with the installed
    CLI, which imports the service's modules and their libraries from the venv (scipy, scikit-learn...)."""
    binary = root / "opt/fleetsight/venv/bin/fleetsight"
    for unit in sorted((root / "lib/systemd/system").glob("fleetsight-*.service")):
        text = unit.read_text()
        command = text.split("ExecStart=/opt/fleetsight/venv/bin/fleetsight ", 1)[1].split(" ", 2)[:2]
        result = subprocess.run(
            [str(binary), *command, "--help"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd="/",
        )
        assert result.returncode == 0 and "Usage:" in result.stdout, f"{unit.name}: {result.stderr[-2000:]}"
    probe = "import fleetsight_anomaly.service, fleetsight_chatbot.service, fleetsight_health.service"
    subprocess.run(
        [str(root / "opt/fleetsight/venv/bin/python"), "-c", probe], check=True, cwd="/", timeout=120
    )
