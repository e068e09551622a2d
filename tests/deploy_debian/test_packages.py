"""`make deb`'s packages, built once per session (deploy/debian/build.py; the dependencies' venv comes
from the cache under .cache/deb/ after the first build) and checked as far as this machine allows.

No systemd as PID 1 and a shared host, so the packages are not installed into the real root: they are
unpacked (`dpkg-deb -x`) into a throwaway root (a host with the full runtime, fleetsight-python, and
both the node and the central package; the node runtime alone: test_node_runtime.py), where the file
layout, the conffiles, the maintainer scripts (`sh -n`; dh_installsystemd's snippets present) and the
installed units (`systemd-analyze verify`) are checked, and the installed node agent is started from
its installed location and serves /metrics. What only a real install shows (adduser, deb-systemd-helper
starting the units) is not run. The node agent's web configuration, which the node package's postinst
makes, is made by the installed generator under a throwaway root, and the installed agent started
with it."""

from __future__ import annotations

import grp
import os
import shutil
import ssl
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import httpx
import pytest
import yaml
from baremetal_helpers import REPO, built_debs, tool, unpack

from exporters.node_web_files import NodeFiles
from support import Process, free_port, served

sys.path.insert(0, str(REPO / "deploy" / "slurm"))
import healthcheck

PACKAGES = ("fleetsight-python", "fleetsight-python-node", "fleetsight-node", "fleetsight-central")
NODE_CONFFILES = {
    "/etc/fleetsight/node.env",
    "/etc/fleetsight/healthcheck.env",
    "/etc/fleetsight/checks-light.env",
    "/etc/fleetsight/checks-tools.yml",
    "/etc/fleetsight/rsyslog-fleetsight.conf",
    "/etc/fleetsight/dcgm/counters.csv",
}
CENTRAL_SERVICES = ("fabric", "anomaly", "health", "chatbot", "checks", "fleet")
CENTRAL_CONFFILES = {
    "/etc/fleetsight/fabric.env",
    "/etc/fleetsight/anomaly.env",
    "/etc/fleetsight/health.env",
    "/etc/fleetsight/chatbot.env",
    "/etc/fleetsight/checks.env",
    "/etc/fleetsight/cluster.env",
    "/etc/fleetsight/fleet.env",
    "/etc/fleetsight/fleet/clusters.yml.example",
    "/etc/fleetsight/health-policy.yml",
    "/etc/fleetsight/prometheus/prometheus.yml",
    "/etc/fleetsight/alertmanager/alertmanager.yml",
    "/etc/fleetsight/thanos/objstore.yml",
}


@pytest.fixture(scope="session")
def debs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return built_debs(tmp_path_factory)


@pytest.fixture(scope="session")
def root(debs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A host with the full runtime and both packages (the node runtime would install over it)."""
    host = [deb for package, deb in debs.items() if package != "fleetsight-python-node"]
    return unpack(host, tmp_path_factory.mktemp("root"))


def control_file(deb: Path, name: str, tmp: Path) -> str:
    folder = tmp / deb.name
    if not folder.exists():
        subprocess.run([tool("dpkg-deb"), "-e", str(deb), str(folder)], check=True, timeout=60)
    path = folder / name
    return path.read_text() if path.exists() else ""


def test_make_deb_builds_the_four_packages(debs: dict[str, Path]) -> None:
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
    for runtime in ("fleetsight-python", "fleetsight-python-node"):
        assert "adduser --system" in control_file(debs[runtime], "postinst", tmp_path), runtime
    for package, units in (
        ("fleetsight-node", ["fleetsight-node.service", "fleetsight-checks-light.timer"]),
        (
            "fleetsight-central",
            [f"fleetsight-{n}.service" for n in CENTRAL_SERVICES],
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
    with served(process, url):
        yield url


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


# -- secure by default: the node agent's web configuration, made at install -----------------------------

INSTALLED = NodeFiles(Path("/"))
KERNLOG = REPO / "tests" / "exporters" / "fixtures" / "kernlog" / "xid_generations.log"


def make_web_config(root: Path, target: Path) -> subprocess.CompletedProcess[str]:
    """The installed make-exporter-web-config (what the postinst runs), pointed at the unpacked venv
    instead of /opt/fleetsight/venv, writing under target instead of /."""
    script = target.parent / f"{target.name}-make-exporter-web-config"
    installed = (root / "usr/lib/fleetsight/make-exporter-web-config").read_text()
    script.write_text(installed.replace("/opt/fleetsight/venv", str(root / "opt/fleetsight/venv")))
    script.chmod(0o755)
    group = grp.getgrgid(os.getgid()).gr_name  # the tests may run as root: it then chowns to this group
    command = [str(script), "--root", str(target), "--group", group]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False, cwd="/")


def snapshot(files: NodeFiles) -> dict[Path, tuple[bytes, int, int]]:
    paths = [*files.etc.iterdir(), files.record]
    return {p: (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_mode) for p in paths if p.is_file()}


@pytest.fixture(scope="session")
def generated(root: Path, tmp_path_factory: pytest.TempPathFactory) -> NodeFiles:
    files = NodeFiles(tmp_path_factory.mktemp("web") / "node")
    result = make_web_config(root, files.root)
    assert result.returncode == 0, result.stdout + result.stderr
    print(f"\nmake-exporter-web-config:\n{result.stdout.strip()}")
    return files


def test_node_package_turns_the_web_configuration_on(
    debs: dict[str, Path], root: Path, tmp_path: Path
) -> None:
    args = (root / "etc/fleetsight/node.env").read_text()
    assert f"--web.config.file={INSTALLED.config}" in args
    env = healthcheck.read_env_file(root / "etc/fleetsight/healthcheck.env")
    assert env["FLEETSIGHT_AGENT_URL"] == "https://127.0.0.1:9401/metrics"
    assert env["FLEETSIGHT_AGENT_PASSWORD_FILE"] == str(INSTALLED.password)
    assert env["FLEETSIGHT_AGENT_CA_FILE"] == str(INSTALLED.ca)
    assert env["FLEETSIGHT_AGENT_SERVER_NAME"] == "fleetsight-exporter"
    # made on the node, so not conffiles: dpkg never replaces them, nor asks about them
    conffiles = control_file(debs["fleetsight-node"], "conffiles", tmp_path).split()
    assert not any("exporter-" in path for path in conffiles), conffiles
    postinst = control_file(debs["fleetsight-node"], "postinst", tmp_path)
    made = postinst.index("/usr/lib/fleetsight/make-exporter-web-config")
    assert made < postinst.index("deb-systemd-invoke"), "the agent would start before its configuration"
    depends = subprocess.run(
        [tool("dpkg-deb"), "-f", str(debs["fleetsight-node"]), "Depends"], capture_output=True, text=True
    ).stdout
    assert "openssl" in depends


def test_generated_web_config_puts_the_installed_agent_behind_tls_and_basic_auth(
    root: Path, generated: NodeFiles, tmp_path: Path
) -> None:
    for path, mode in ((generated.key, 0o640), (generated.password, 0o640), (generated.config, 0o640)):
        assert stat.S_IMODE(path.stat().st_mode) == mode, path
    for path in (generated.cert, generated.ca):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path
    recorded = generated.record.read_text().split()
    assert sorted(recorded) == sorted(f"/etc/fleetsight/{p.name}" for p in generated.etc.iterdir())
    check = subprocess.run(
        [tool("promtool"), "check", "web-config", str(generated.config)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    command = [str(root / "opt/fleetsight/venv/bin/fleetsight"), "exporter", "node", "--node", "n0001"]
    command += ["--no-state", "--collector", "xid", "--kmsg-file", str(KERNLOG), f"--listen=127.0.0.1:{port}"]
    command += [f"--web.config.file={generated.config}"]
    agent = Process(
        "installed node agent, TLS", command, tmp_path / "agent.log", env={"PATH": "/usr/bin:/bin"}
    )
    url, verify = f"https://127.0.0.1:{port}/metrics", ssl.create_default_context(cafile=str(generated.ca))
    password = generated.password.read_text().strip()

    def status(auth: tuple[str, str] | None = None) -> int:
        try:
            return httpx.get(url, verify=verify, auth=auth, timeout=5).status_code
        except httpx.TransportError:
            return 0

    try:
        agent.wait_for(lambda: status() == 401, what="the agent asking for credentials")
        assert status(("prometheus", password + "x")) == 401
        answer = httpx.get(url, verify=verify, auth=("prometheus", password), timeout=10)
        assert answer.status_code == 200 and "fleetsight_gpu_xid_errors" in answer.text
        with pytest.raises(httpx.TransportError):  # plain http on the TLS port: no answer at all
            httpx.get(f"http://127.0.0.1:{port}/metrics", auth=("prometheus", password), timeout=5)
    finally:
        agent.stop()


def test_a_second_run_leaves_every_file_as_it_is(root: Path, generated: NodeFiles) -> None:
    before = snapshot(generated)
    result = make_web_config(root, generated.root)
    assert result.returncode == 0, result.stderr
    assert "nothing changed" in result.stdout
    assert snapshot(generated) == before


def test_the_fleets_certificate_and_shared_password_are_used_and_kept(
    root: Path, generated: NodeFiles, tmp_path: Path
) -> None:
    """Config management put the fleet's certificate, key, CA and shared password in place before the
    install: the generator writes only the web configuration, with the hash of that password, and the
    purge removes only that."""
    node = NodeFiles(tmp_path / "node")
    node.etc.mkdir(parents=True)
    for name in ("cert", "key", "ca"):  # stand-ins for the fleet's: another node's set
        shutil.copy(getattr(generated, name), getattr(node, name))
    node.password.write_text("shared-fleet-scrape-password\n")
    before = snapshot(node)
    result = make_web_config(root, node.root)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["wrote", str(node.config)]
    assert {p: v for p, v in snapshot(node).items() if p in before} == before
    config = yaml.safe_load(node.config.read_text())
    assert config["tls_server_config"] == {"cert_file": str(node.cert), "key_file": str(node.key)}
    assert bcrypt.checkpw(b"shared-fleet-scrape-password", config["basic_auth_users"]["prometheus"].encode())
    assert node.record.read_text().split() == [str(INSTALLED.config)]
    purge(node)
    assert not node.config.exists() and not node.record.exists()
    assert sorted(p.name for p in node.etc.iterdir()) == sorted(
        p.name for p in before if p.parent == node.etc
    )


def test_purge_removes_the_generated_files(root: Path, tmp_path: Path) -> None:
    node = NodeFiles(tmp_path / "node")
    assert make_web_config(root, node.root).returncode == 0
    (node.etc / "node.env").write_text("kept\n")  # not the generator's: stays
    purge(node)
    assert [p.name for p in node.etc.iterdir()] == ["node.env"]


def test_half_a_certificate_is_refused_and_nothing_written(
    root: Path, generated: NodeFiles, tmp_path: Path
) -> None:
    node = NodeFiles(tmp_path / "node")
    node.etc.mkdir(parents=True)
    shutil.copy(generated.cert, node.cert)
    result = make_web_config(root, node.root)
    assert result.returncode != 0
    assert str(node.key) in result.stderr, result.stderr
    assert [p.name for p in node.etc.iterdir()] == [node.cert.name]


def purge(node: NodeFiles) -> None:
    """fleetsight-node's postrm purge (the source, before debhelper adds its snippets), its paths moved
    under node.root as if that were /."""
    text = (REPO / "deploy/debian/debian/fleetsight-node.postrm").read_text()
    for folder in ("/var/lib/fleetsight", "/etc/fleetsight", "/var/log"):
        text = text.replace(folder, f"{node.root}{folder}")
    if node.record.exists():  # the record holds installed paths: under node.root here as well
        lines = node.record.read_text().splitlines()
        node.record.write_text("".join(f"{node.root}{line}\n" for line in lines))
    result = subprocess.run(
        ["sh", "-c", text, "postrm", "purge"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


# -- the health service's events token, made by the central package's postinst -----------------------------


def env_value(path: Path, name: str) -> str:
    (line,) = [x for x in path.read_text().splitlines() if x.startswith(f"{name}=")]
    return line.split("=", 1)[1].strip('"')


def unit_lines(path: Path, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in path.read_text().splitlines() if line.startswith(f"{key}=")]


RESULTS_TOKEN = "/etc/fleetsight/checks-results-token"


def test_the_units_read_the_root_only_checks_token_as_credentials(root: Path) -> None:
    """Issue 41: the checks token is a root-only file; the light-check timer's unit, the checks service
    and the health service's validation gate get it through LoadCredential= and name the copy in their
    environment (FLEETSIGHT_CHECKS_TOKEN_FILE; the service: FLEETSIGHT_CHECKS_RESULTS_TOKEN_FILE). No
    environment file names the on-disk path: EnvironmentFile= would override the unit's Environment=."""
    units = root / "lib/systemd/system"
    for unit, credential, variable in (
        ("fleetsight-checks-light.service", "checks-token", "FLEETSIGHT_CHECKS_TOKEN_FILE"),
        ("fleetsight-health.service", "checks-token", "FLEETSIGHT_CHECKS_TOKEN_FILE"),
        ("fleetsight-checks.service", "results-token", "FLEETSIGHT_CHECKS_RESULTS_TOKEN_FILE"),
    ):
        assert unit_lines(units / unit, "LoadCredential") == [f"{credential}:{RESULTS_TOKEN}"], unit
        assert f"{variable}=%d/{credential}" in unit_lines(units / unit, "Environment"), unit
        assert unit_lines(units / unit, "User") == ["fleetsight"], unit  # hence a credential, not the file
    for env in ("checks-light.env", "checks.env", "health.env"):
        lines = (root / "etc/fleetsight" / env).read_text().splitlines()
        active = [x for x in lines if not x.startswith("#")]
        assert not [x for x in active if RESULTS_TOKEN in x or "TOKEN_FILE" in x], env


def test_the_central_postinst_makes_the_events_token_the_services_read_once(
    debs: dict[str, Path], root: Path, tmp_path: Path
) -> None:
    token = "/etc/fleetsight/health-events-token"
    # health checks the token the anomaly service sends, and both name the file the postinst makes
    assert f"--events-token-file={token}" in env_value(root / "etc/fleetsight/health.env", "FLEETSIGHT_ARGS")
    assert env_value(root / "etc/fleetsight/anomaly.env", "FLEETSIGHT_ANOMALY_HEALTH_TOKEN_FILE") == token
    script = control_file(debs["fleetsight-central"], "postinst", tmp_path)
    assert f"TOKEN={token}" in script
    # the installed script, run as dpkg would (configure) with the path and group moved to this test
    target = tmp_path / "health-events-token"
    group = grp.getgrgid(os.getgid()).gr_name
    runnable = script.replace(f"TOKEN={token}", f"TOKEN={target}")
    # the checks service's results token (issue 36), made the same way but root-only (issue 41)
    assert f"RESULTS_TOKEN={RESULTS_TOKEN}" in script
    results_target = tmp_path / "checks-results-token"
    runnable = runnable.replace(f"RESULTS_TOKEN={RESULTS_TOKEN}", f"RESULTS_TOKEN={results_target}")
    runnable = runnable.replace("chgrp fleetsight", f"chgrp {group}")
    # only the package's own part: the debhelper snippets (deb-systemd-helper) act on this host's systemd
    runnable = runnable.split("# Automatically added by")[0].split("#DEBHELPER#")[0]
    assert "deb-systemd-helper" not in runnable
    subprocess.run(["sh", "-e", "-c", runnable, "postinst", "configure"], check=True, timeout=30)
    made = target.read_text()
    assert len(made) == 64 and int(made, 16) >= 0
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert len(results_target.read_text()) == 64 and results_target.read_text() != made
    assert stat.S_IMODE(results_target.stat().st_mode) == 0o600
    target.write_text("the operator's own\n")
    results_target.write_text("the fleet's token\n")
    results_target.chmod(0o644)  # as an older package or a hand copy left it: tightened, content kept
    subprocess.run(["sh", "-e", "-c", runnable, "postinst", "configure"], check=True, timeout=30)
    assert target.read_text() == "the operator's own\n"
    assert results_target.read_text() == "the fleet's token\n"
    assert stat.S_IMODE(results_target.stat().st_mode) == 0o600
    # the node package's empty placeholder (a host with both packages) is filled with a token
    results_target.write_text("")
    subprocess.run(["sh", "-e", "-c", runnable, "postinst", "configure"], check=True, timeout=30)
    assert len(results_target.read_text()) == 64


def test_the_node_postinst_leaves_a_root_only_placeholder_and_purge_removes_only_that(tmp_path: Path) -> None:
    """The node package cannot know the central host's token: it makes an empty root-only file when none
    is there (the light checks then say which file is empty, exit 3) and keeps one already installed;
    purge removes the placeholder, never a token the operator put there."""
    etc = tmp_path / "etc/fleetsight"
    etc.mkdir(parents=True)
    (etc / "exporter-web.yml").write_text("made before\n")  # the web configuration step is not this test's
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "getent").write_text("#!/bin/sh\nexit 0\n")  # the group exists: no addgroup on this host
    (bin_dir / "getent").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    env.pop("DPKG_ROOT", None)

    def run(script: str, *args: str) -> None:
        text = (REPO / "deploy/debian/debian" / script).read_text().replace("/etc/fleetsight", str(etc))
        for folder in ("/var/lib/fleetsight", "/var/log"):  # purge's other paths: under this test's root
            text = text.replace(folder, f"{tmp_path}{folder}")
        text = text.replace("command -v udevadm", "false")
        text = text.split("#DEBHELPER#")[0]
        subprocess.run(["sh", "-e", "-c", text, script, *args], check=True, timeout=30, env=env)

    token = etc / "checks-results-token"
    run("fleetsight-node.postinst", "configure")
    assert token.read_text() == "" and stat.S_IMODE(token.stat().st_mode) == 0o600
    run("fleetsight-node.postrm", "purge")
    assert not token.exists()
    token.write_text("the fleet's token\n")
    run("fleetsight-node.postinst", "configure")
    assert token.read_text() == "the fleet's token\n"
    run("fleetsight-node.postrm", "purge")
    assert token.read_text() == "the fleet's token\n"


def test_the_cluster_name_is_set_once_for_the_central_services(root: Path) -> None:
    # one file names the cluster; both services that label their answers and metrics read it (optional:
    # a host without it still starts), and neither's own arguments name another
    assert env_value(root / "etc/fleetsight/cluster.env", "FLEETSIGHT_CLUSTER") == "default"
    units = root / "lib/systemd/system"
    for name in ("health", "checks"):
        files = unit_lines(units / f"fleetsight-{name}.service", "EnvironmentFile")
        assert files == ["-/etc/fleetsight/cluster.env", f"/etc/fleetsight/{name}.env"], files
        assert "--cluster" not in env_value(root / f"etc/fleetsight/{name}.env", "FLEETSIGHT_ARGS")
