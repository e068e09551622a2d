"""A real Grafana server for the local stack and the dashboard checks, built from the Go module proxy.

The proxy serves one Grafana module version, a 10.0.0-preview main commit of 2023-06-09. Its
dependency injection code (``pkg/server/wire_gen.go``) is generated, not committed, so the build runs
``wire`` (v0.7.0: v0.5.0 crashes under current Go) with the OSS tags first, then ``go build`` with cgo
(SQLite). Only the backend is built: the HTTP API is complete, the UI needs a frontend build that
cannot be had here. The server's home (``conf/`` defaults and ``public/``, where the core plugins'
``plugin.json`` live) is copied from the module beside the binary, so the 1.5 GB module copy is not
kept. Provisioning is the repository's own folder, the one docker-compose.yml mounts for Grafana 12.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from fleetsight.gobuild import GoModuleBuild
from fleetsight.procs import stop_process
from fleetsight.settings import REPO_ROOT, Settings
from fleetsight.setup import InstallError, go_env, remove_leftovers, run_logged

MODULE = "github.com/grafana/grafana"
MODULE_VERSION = "v1.9.2-0.20230609164553-81d85ce8028d"  # the pin: change it and setup rebuilds
WIRE = "github.com/google/wire/cmd/wire@v0.7.0"
TAGS = "oss"
STAMP = f"{MODULE}@{MODULE_VERSION} wire={WIRE} tags={TAGS} cgo=1"
PROVISIONING = REPO_ROOT / "dashboards" / "provisioning"
DASHBOARDS_DIR = REPO_ROOT / "dashboards"
READY_TIMEOUT_S = 60.0


class GrafanaBuild(GoModuleBuild):
    """Grafana's server: wire generates its dependency injection first, cgo builds it (SQLite), and its
    home (conf/ defaults, public/) is kept beside the binary. The stamp alone names the build: this
    preview binary reports no release of its own."""

    @property
    def stamp(self) -> str:
        return STAMP

    def reports_release(self, settings: Settings) -> bool:
        return True

    def present(self, settings: Settings) -> bool:
        return super().present(settings) and (home(settings) / "conf" / "defaults.ini").is_file()

    def check_toolchain(self) -> None:
        if shutil.which("go") is None or shutil.which("gcc") is None:
            raise InstallError("Grafana needs the Go toolchain and gcc (cgo, for SQLite) on PATH")

    def prepare(self, scratch: Path, log: Path) -> Path:
        tree, tools = super().prepare(scratch, log), scratch / "bin"
        # `go install pkg@version` refuses -mod=mod: the machine's own GOFLAGS only.
        plain = {**go_env(), "GOFLAGS": os.environ.get("GOFLAGS", ""), "GOBIN": str(tools)}
        run_logged(["go", "install", WIRE], log, cwd=tree, env=plain)
        wire = [str(tools / "wire"), "gen", "-tags", TAGS, "./pkg/server", "./pkg/cmd/grafana-cli/runner"]
        run_logged(wire, log, cwd=tree, env=go_env())
        return tree

    def build_in(self, tree: Path, settings: Settings, log: Path) -> None:
        partial = settings.bin_dir / f"grafana.partial-{os.getpid()}"
        remove_leftovers(settings.cache_dir, "grafana-home.partial-")
        try:
            # The tags select wire's providers only; the generated wire_gen.go builds untagged.
            build = ["go", "build", "-o", str(partial), "./pkg/cmd/grafana"]
            run_logged(build, log, cwd=tree, env={**go_env(), "CGO_ENABLED": "1"})
            new_home = settings.cache_dir / f"grafana-home.partial-{os.getpid()}"
            for part in ("conf", "public"):
                shutil.copytree(tree / part, new_home / part, symlinks=True)
            self.stamp_file(settings).unlink(missing_ok=True)
            shutil.rmtree(home(settings), ignore_errors=True)
            os.replace(new_home, home(settings))
            os.replace(partial, self.binary(settings))
        finally:
            partial.unlink(missing_ok=True)


GRAFANA_BUILD = GrafanaBuild("grafana", MODULE, MODULE_VERSION, "./pkg/cmd/grafana", TAGS, "", "")


def binary(settings: Settings) -> Path:
    return GRAFANA_BUILD.binary(settings)


def home(settings: Settings) -> Path:
    """Grafana's --homepath: conf/ and public/ of the pinned module."""
    return settings.cache_dir / "grafana-home"


def present(settings: Settings) -> bool:
    return GRAFANA_BUILD.present(settings)


INSTALL_STEP = GRAFANA_BUILD.install_step(
    name="grafana",
    description=f"Grafana server (10.0.0-preview, backend only) built from {MODULE}@{MODULE_VERSION}",
    needed_by="grafana (fleetsight up), dashboards verify --grafana",
    eta="~7 min on 2 cores (plus ~1.5 GB of Go modules when the module cache is cold)",
)


def missing(settings: Settings) -> str | None:
    if present(settings):
        return None
    return f"{binary(settings)} is missing or stale: run `fleetsight setup --only grafana`"


def environment(
    settings: Settings,
    port: int,
    data_dir: Path,
    prometheus_url: str,
    logs_url: str,
    dashboards_dir: Path = DASHBOARDS_DIR,
    provisioning: Path = PROVISIONING,
) -> dict[str, str]:
    """Grafana's configuration as GF_* variables, and the variables the provisioning files read
    (docker-compose.yml sets the same ones to the compose network's addresses)."""
    return {
        "GF_SERVER_HTTP_ADDR": settings.host,
        "GF_SERVER_HTTP_PORT": str(port),
        "GF_PATHS_DATA": str(data_dir),
        "GF_PATHS_LOGS": str(data_dir / "log"),
        "GF_PATHS_PLUGINS": str(data_dir / "plugins"),
        "GF_PATHS_PROVISIONING": str(provisioning),
        # Loopback only: a viewer needs no login, which is all the checks need (read, query).
        "GF_AUTH_ANONYMOUS_ENABLED": "true",
        "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer",
        "GF_ANALYTICS_REPORTING_ENABLED": "false",
        "GF_ANALYTICS_CHECK_FOR_UPDATES": "false",
        "GF_ANALYTICS_CHECK_FOR_PLUGIN_UPDATES": "false",
        "GF_LOG_MODE": "console",
        "FLEETSIGHT_PROMETHEUS_URL": prometheus_url,
        "FLEETSIGHT_LOGS_URL": logs_url,
        "FLEETSIGHT_DASHBOARDS_DIR": str(dashboards_dir),
    }


def command(settings: Settings) -> list[str]:
    return [str(binary(settings)), "server", "--homepath", str(home(settings))]


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/api/health", timeout=2).json().get("database") == "ok"
    except (httpx.HTTPError, ValueError):
        return False


# Grafana of this pin can fail its very first start: it creates org 1 for the admin user, then looks the
# org up again with the creation time as a condition (second resolution in SQLite). When the two calls
# straddle a second boundary it misses the org, inserts it again and exits on the primary key (upstream's
# "ignore unique constraint" fix matches SQLite's UNIQUE code, not PRIMARYKEY). The transaction rolls
# back, so a second start is a fresh first start with the same ~1 % chance; the stack's supervisor
# restarts it too.
FIRST_START_RACE = "failed to create default organization"
START_ATTEMPTS = 3


class GrafanaExited(RuntimeError):
    def __init__(self, code: int, log_tail: str) -> None:
        super().__init__(f"grafana exited ({code}); last log lines:\n{log_tail}")
        self.log_tail = log_tail


@contextmanager
def running(
    settings: Settings,
    port: int,
    data_dir: Path,
    prometheus_url: str,
    logs_url: str,
    dashboards_dir: Path = DASHBOARDS_DIR,
    provisioning: Path = PROVISIONING,
) -> Iterator[str]:
    """A Grafana server for a test or a one-off check, provisioned with the dashboards of
    `dashboards_dir` (and the provisioning files of `provisioning`); its URL, until the block ends."""
    problem = missing(settings)
    if problem:
        raise FileNotFoundError(problem)
    data_dir.mkdir(parents=True, exist_ok=True)
    given = environment(settings, port, data_dir, prometheus_url, logs_url, dashboards_dir, provisioning)
    env = {**os.environ, **given}
    url, log = f"http://{settings.host}:{port}", data_dir / "grafana.log"
    process: subprocess.Popen | None = None
    try:
        for attempt in range(1, START_ATTEMPTS + 1):
            with log.open("a") as out:
                process = subprocess.Popen(command(settings), env=env, stdout=out, stderr=subprocess.STDOUT)
            try:
                wait_ready(url, process, log)
                break
            except GrafanaExited as exited:
                if FIRST_START_RACE not in exited.log_tail or attempt == START_ATTEMPTS:
                    raise
        wait_provisioned(url, process, log, dashboard_uids(dashboards_dir))
        yield url
    finally:
        if process is not None:
            stop_process(process)


def wait_ready(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise GrafanaExited(process.returncode, tail(log))
        if ready(url):
            return
        time.sleep(0.2)  # polling interval of a deadline loop, not a synchronisation
    raise RuntimeError(f"grafana did not answer {url}/api/health in {READY_TIMEOUT_S:.0f} s:\n{tail(log)}")


def dashboard_uids(folder: Path) -> list[str]:
    """The uids of the dashboard files provisioning loads from folder."""
    return sorted(json.loads(path.read_text()).get("uid", "") for path in folder.glob("*.json"))


def provisioned(url: str, uids: list[str]) -> bool:
    """Every dashboard answers. Grafana listens before its file provisioning has finished, and then
    answers a dashboard's GET with a 500 (a nil provisioning service in this build), so /api/health
    alone is not enough."""
    try:
        with httpx.Client(base_url=url, timeout=5) as client:
            return all(client.get(f"/api/dashboards/uid/{uid}").status_code == 200 for uid in uids)
    except httpx.HTTPError:
        return False


def wait_provisioned(url: str, process: subprocess.Popen, log: Path, uids: list[str]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise GrafanaExited(process.returncode, tail(log))
        if provisioned(url, uids):
            return
        time.sleep(0.2)  # polling interval of a deadline loop, not a synchronisation
    raise RuntimeError(
        f"grafana did not serve the dashboards {', '.join(uids)} in {READY_TIMEOUT_S:.0f} s:\n{tail(log)}"
    )


def tail(log: Path, lines: int = 20) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""
