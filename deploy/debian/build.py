"""`make deb`: the Debian packages, built by Debian's own tools (dpkg-buildpackage with debhelper).

1. The Python runtimes: relocatable virtual environments (``uv venv --relocatable``, the system's
   python3.11) holding locked dependencies (``uv export --frozen`` of uv.lock). Two of them, both
   installed as /opt/fleetsight/venv: fleetsight-python (central hosts) with the extras the packaged
   services import, and fleetsight-python-node (GPU nodes) with only the distributions the node agent
   imports (and what they depend on in the lock), not the central services' numpy, scipy, scikit-learn
   and embedding model. Each is built once per uv.lock under .cache/deb/ and reused; FleetSight's own
   code (one wheel) is installed into copies at every build (it changes far more often than the lock).
2. A staging tree under build/deb/: debian/ from deploy/debian/debian, the runtimes under runtimes/
   <package>/, and files/<package>/ laid out as installed (units, conffiles under /etc/fleetsight,
   Slurm hooks, configuration).
3. ``dpkg-buildpackage -b -us -uc`` there; the .deb files land in build/deb/.

Why debhelper over a bare ``dpkg-deb --build``: it writes the conffiles list, the systemd maintainer
snippets (enable, start, restart on upgrade, stop on remove, purge) and the md5sums, and lintian knows it.

Usage: python -m deploy.debian.build [--out build/deb]
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
VERSION = "0.1.0"
PYTHON = "/usr/bin/python3.11"  # the interpreter the venv links to: Depends: python3.11
CENTRAL_UNITS = ("fabric", "anomaly", "health", "chatbot", "checks", "fleet")


@dataclass(frozen=True)
class Runtime:
    """One Python runtime package: the lock's dependencies with these extras, or, with ``only``, just
    those distributions and their dependencies in the lock."""

    package: str
    extras: tuple[str, ...]
    only: tuple[str, ...] = ()


# What the central services import beyond the core.
FULL = Runtime("fleetsight-python", ("gpu", "anomaly", "chatbot"))
# What the node agent (`fleetsight exporter node`, `exporter make-web-config` of the postinst) and
# `fleetsight logs rsyslog-config` import, traced from sys.modules after running them (BMC over Redfish
# and IPMI included); bcrypt for the web configuration, nvidia-ml-py for the GPU map. The Slurm hooks
# run on the system's python3 and import only the standard library. Not fastapi, uvicorn or pydantic:
# only the central services serve HTTP through them. tests/deploy_debian/test_node_runtime.py runs the
# node agent from this runtime alone, so a missing one fails there.
NODE = Runtime(
    "fleetsight-python-node",
    ("gpu",),
    ("bcrypt", "click", "httpx", "nvidia-ml-py", "prometheus-client", "pyyaml", "rich"),
)
RUNTIMES = (FULL, NODE)


def run(command: list[str], cwd: Path = REPO, **kwargs: object) -> None:
    result = subprocess.run(command, cwd=cwd, check=False, **kwargs)  # type: ignore[call-overload]
    if result.returncode != 0:
        raise SystemExit(f"deb: `{' '.join(map(str, command))}` exited {result.returncode}")


def uv() -> str:
    found = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not Path(found).exists():
        raise SystemExit("deb: uv not found (run `make setup`)")
    return found


def lock_key(runtime: Runtime) -> str:
    digest = hashlib.sha256((REPO / "uv.lock").read_bytes())
    digest.update(" ".join((PYTHON, *runtime.extras, "only:", *runtime.only)).encode())
    return digest.hexdigest()[:16]


def lock_dependencies() -> dict[str, set[str]]:
    """uv.lock's packages and what each depends on (all its versions and markers together)."""
    depends: dict[str, set[str]] = {}
    for package in tomllib.loads((REPO / "uv.lock").read_text())["package"]:
        depends.setdefault(package["name"], set()).update(d["name"] for d in package.get("dependencies", []))
    return depends


def closure(names: tuple[str, ...], depends: dict[str, set[str]]) -> set[str]:
    """These distributions and everything they depend on (markers ignored: a dependency for another
    platform is named here but skipped by the install, as its marker says)."""
    missing = set(names) - depends.keys()
    if missing:
        raise SystemExit(f"deb: not in uv.lock: {', '.join(sorted(missing))}")
    found: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo.extend(depends[name])
    return found


def export_command(runtime: Runtime, requirements: Path) -> list[str]:
    extras = [item for extra in runtime.extras for item in ("--extra", extra)]
    command = [uv(), "export", "--frozen", "--no-dev", "--no-emit-project", *extras, "-o", str(requirements)]
    if runtime.only:
        # the lock's pins and hashes stay uv's own; everything outside the closure is left out
        depends = lock_dependencies()
        dropped = sorted(depends.keys() - closure(runtime.only, depends) - {"fleetsight"})
        command += [item for name in dropped for item in ("--no-emit-package", name)]
    return [*command, "-q"]


def check_exported(runtime: Runtime, requirements: Path) -> None:
    """uv exports only what the project with these extras needs: a name of ``only`` outside that would
    be left out without a word."""
    exported = {line.split("==")[0] for line in requirements.read_text().splitlines() if "==" in line}
    missing = set(runtime.only) - exported
    if missing:
        extras = ", ".join(runtime.extras) or "none"
        raise SystemExit(
            f"deb: {runtime.package}: {', '.join(sorted(missing))} not locked with extras {extras}"
        )


def cached_venv(runtime: Runtime) -> Path:
    """The dependencies' venv of this runtime for this uv.lock: built on the first call, reused after."""
    venv = REPO / ".cache" / "deb" / f"venv-{runtime.package}-{lock_key(runtime)}"
    if (venv / ".complete").exists():
        print(f"deb: {runtime.package}: dependencies: cached {venv.relative_to(REPO)}")
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    started = time.monotonic()
    requirements = venv.with_suffix(".txt")
    venv.parent.mkdir(parents=True, exist_ok=True)
    run(export_command(runtime, requirements))
    check_exported(runtime, requirements)
    run([uv(), "venv", "--relocatable", "--python", PYTHON, "-q", str(venv)])
    run([uv(), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "-r", str(requirements)])
    (venv / ".complete").touch()
    took = time.monotonic() - started
    print(f"deb: {runtime.package}: dependencies: built {venv.relative_to(REPO)} in {took:.0f} s")
    return venv


def put(source: Path | str, target: Path, mode: int = 0o644) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(source, Path):
        shutil.copyfile(source, target)
    else:
        target.write_text(source)
    target.chmod(mode)


def node_files(root: Path) -> None:
    conf = HERE / "conf"
    unit = "fleetsight-node.service"
    put(REPO / "deploy" / "systemd" / unit, root / "lib/systemd/system" / unit)
    put(conf / "node.env", root / "etc/fleetsight/node.env")
    put(conf / "healthcheck.env", root / "etc/fleetsight/healthcheck.env")
    # The light checks on a timer (docs/checks.md): `fleetsight checks run` from the node runtime, results
    # posted to the checks service; the timer is what gets enabled.
    for light in ("fleetsight-checks-light.service", "fleetsight-checks-light.timer"):
        put(REPO / "deploy" / "systemd" / light, root / "lib/systemd/system" / light)
    put(conf / "checks-light.env", root / "etc/fleetsight/checks-light.env")
    put(conf / "checks-tools.yml", root / "etc/fleetsight/checks-tools.yml")
    put(conf / "60-fleetsight-ipmi.rules", root / "lib/udev/rules.d/60-fleetsight-ipmi.rules")
    # The site's own dcgm-exporter reads it (-f / DCGM_EXPORTER_COLLECTORS): the fields FleetSight's
    # rules and services need, under names its go-dcgm resolves (docs/dcgm.md).
    put(REPO / "exporters" / "dcgm" / "counters.csv", root / "etc/fleetsight/dcgm/counters.csv")
    put(REPO / "deploy" / "slurm" / "healthcheck.py", root / "usr/lib/fleetsight/slurm/healthcheck", 0o755)
    put(REPO / "health" / "prolog.py", root / "usr/lib/fleetsight/slurm/preflight", 0o755)
    put(REPO / "deploy" / "slurm" / "prolog.sh", root / "usr/lib/fleetsight/slurm/prolog", 0o755)
    generator = "make-exporter-web-config"  # the postinst runs it: TLS + basic auth on from the start
    put(HERE / "bin" / generator, root / "usr/lib/fleetsight" / generator, 0o755)
    rsyslog = subprocess.run(
        [sys.executable, "-m", "fleetsight.cli", "logs", "rsyslog-config", "--broker", "kafka:19092"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    put(rsyslog, root / "etc/fleetsight/rsyslog-fleetsight.conf")


def central_files(root: Path) -> None:
    conf = HERE / "conf"
    for name in CENTRAL_UNITS:
        unit = f"fleetsight-{name}.service"
        put(REPO / "deploy" / "systemd" / unit, root / "lib/systemd/system" / unit)
        put(conf / f"{name}.env", root / f"etc/fleetsight/{name}.env")
    put(conf / "cluster.env", root / "etc/fleetsight/cluster.env")  # the cluster's one name
    put(conf / "clusters.yml.example", root / "etc/fleetsight/fleet/clusters.yml.example")  # global layer
    put(REPO / "health" / "policy.yml", root / "etc/fleetsight/health-policy.yml")
    put(REPO / "metrics" / "prometheus.yml", root / "etc/fleetsight/prometheus/prometheus.yml")
    for rule in sorted((REPO / "rules").glob("*.yml")):
        put(rule, root / "etc/fleetsight/prometheus/rules" / rule.name)
    put(REPO / "alerting" / "alertmanager.yml", root / "etc/fleetsight/alertmanager/alertmanager.yml")
    put(REPO / "metrics" / "thanos" / "objstore.yml", root / "etc/fleetsight/thanos/objstore.yml")
    docs = root / "usr/share/fleetsight/docs"
    for page in sorted((REPO / "docs").rglob("*.md")):
        put(page, docs / page.relative_to(REPO / "docs"))


def fleetsight_wheel(folder: Path) -> Path:
    """FleetSight's own code as one wheel, installed into every runtime (built once per build)."""
    run([uv(), "build", "--wheel", "-q", "--out-dir", str(folder), str(REPO)])
    return next(folder.glob("fleetsight-*.whl"))


def stage_runtime(runtime: Runtime, wheel: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    run(["cp", "-a", str(cached_venv(runtime)), str(target)])
    (target / ".complete").unlink()
    (target / ".gitignore").unlink(missing_ok=True)  # uv's, for checkouts: not for a package
    python = target / "bin" / "python"
    run([uv(), "pip", "install", "-q", "--no-deps", "--reinstall", "--python", str(python), str(wheel)])


def stage_debian(source: Path) -> None:
    shutil.copytree(HERE / "debian", source / "debian")
    for package in (HERE / "overrides").glob("*"):
        put(package, source / "debian" / f"{package.name}.lintian-overrides")
    # Both runtimes create the fleetsight user and remove its state on purge: one source for both.
    debian = source / "debian"
    for script in ("postinst", "postrm"):
        shutil.copy2(debian / f"{FULL.package}.{script}", debian / f"{NODE.package}.{script}")


def stage(out: Path) -> Path:
    source = out / f"fleetsight-{VERSION}"
    shutil.rmtree(source, ignore_errors=True)
    stage_debian(source)
    started = time.monotonic()
    wheel = fleetsight_wheel(source / "wheel")
    for runtime in RUNTIMES:
        stage_runtime(runtime, wheel, source / "runtimes" / runtime.package)
    print(f"deb: FleetSight {VERSION} into the runtimes in {time.monotonic() - started:.0f} s")
    node_files(source / "files" / "fleetsight-node")
    central_files(source / "files" / "fleetsight-central")
    return source


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=REPO / "build" / "deb", help="Where the .deb files go")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.deb"):
        old.unlink()
    started = time.monotonic()
    source = stage(out / "src")
    run(["dpkg-buildpackage", "-b", "-us", "-uc", "--no-pre-clean"], cwd=source)
    for built in sorted((out / "src").glob("*.deb")):
        shutil.move(built, out / built.name)
        print(f"deb: {out / built.name} ({(out / built.name).stat().st_size >> 20} MiB)")
    print(f"deb: done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
