"""`make deb`: the Debian packages, built by Debian's own tools (dpkg-buildpackage with debhelper).

1. The Python runtime: a relocatable virtual environment (``uv venv --relocatable``, the system's
   python3.11) holding the locked dependencies (``uv export --frozen`` of uv.lock, with the extras the
   packaged services import). Built once per uv.lock under .cache/deb/ and reused; FleetSight's own
   code is installed into a copy at every build (it changes far more often than the lock).
2. A staging tree under build/deb/: debian/ from deploy/debian/debian, the venv, and files/<package>/
   laid out as installed (units, conffiles under /etc/fleetsight, Slurm hooks, configuration).
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
VERSION = "0.1.0"
PYTHON = "/usr/bin/python3.11"  # the interpreter the venv links to: Depends: python3.11
EXTRAS = ("gpu", "anomaly", "chatbot")  # what the packaged services import beyond the core
CENTRAL_UNITS = ("fabric", "anomaly", "health", "chatbot")


def run(command: list[str], cwd: Path = REPO, **kwargs: object) -> None:
    result = subprocess.run(command, cwd=cwd, check=False, **kwargs)  # type: ignore[call-overload]
    if result.returncode != 0:
        raise SystemExit(f"deb: `{' '.join(map(str, command))}` exited {result.returncode}")


def uv() -> str:
    found = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not Path(found).exists():
        raise SystemExit("deb: uv not found (run `make setup`)")
    return found


def lock_key() -> str:
    digest = hashlib.sha256((REPO / "uv.lock").read_bytes())
    digest.update(" ".join((PYTHON, *EXTRAS)).encode())
    return digest.hexdigest()[:16]


def cached_venv() -> Path:
    """The dependencies' venv for this uv.lock: built on the first call, reused after."""
    venv = REPO / ".cache" / "deb" / f"venv-{lock_key()}"
    if (venv / ".complete").exists():
        print(f"deb: dependencies: cached {venv.relative_to(REPO)}")
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    started = time.monotonic()
    requirements = venv.with_suffix(".txt")
    venv.parent.mkdir(parents=True, exist_ok=True)
    extras = [item for extra in EXTRAS for item in ("--extra", extra)]
    run([uv(), "export", "--frozen", "--no-dev", "--no-emit-project", *extras, "-o", str(requirements), "-q"])
    run([uv(), "venv", "--relocatable", "--python", PYTHON, "-q", str(venv)])
    run([uv(), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "-r", str(requirements)])
    (venv / ".complete").touch()
    print(f"deb: dependencies: built {venv.relative_to(REPO)} in {time.monotonic() - started:.0f} s")
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
    put(conf / "60-fleetsight-ipmi.rules", root / "lib/udev/rules.d/60-fleetsight-ipmi.rules")
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
    put(REPO / "health" / "policy.yml", root / "etc/fleetsight/health-policy.yml")
    put(REPO / "metrics" / "prometheus.yml", root / "etc/fleetsight/prometheus/prometheus.yml")
    for rule in sorted((REPO / "rules").glob("*.yml")):
        put(rule, root / "etc/fleetsight/prometheus/rules" / rule.name)
    put(REPO / "alerting" / "alertmanager.yml", root / "etc/fleetsight/alertmanager/alertmanager.yml")
    put(REPO / "metrics" / "thanos" / "objstore.yml", root / "etc/fleetsight/thanos/objstore.yml")
    docs = root / "usr/share/fleetsight/docs"
    for page in sorted((REPO / "docs").rglob("*.md")):
        put(page, docs / page.relative_to(REPO / "docs"))


def stage(out: Path) -> Path:
    source = out / f"fleetsight-{VERSION}"
    shutil.rmtree(source, ignore_errors=True)
    shutil.copytree(HERE / "debian", source / "debian")
    for package in (HERE / "overrides").glob("*"):
        put(package, source / "debian" / f"{package.name}.lintian-overrides")
    started = time.monotonic()
    run(["cp", "-a", str(cached_venv()), str(source / "venv")])
    (source / "venv" / ".complete").unlink()
    (source / "venv" / ".gitignore").unlink(missing_ok=True)  # uv's, for checkouts: not for a package
    python = source / "venv" / "bin" / "python"
    run([uv(), "pip", "install", "-q", "--no-deps", "--reinstall", "--python", str(python), str(REPO)])
    print(f"deb: FleetSight {VERSION} into the venv in {time.monotonic() - started:.0f} s")
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
