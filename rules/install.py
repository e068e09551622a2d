"""``fleetsight setup`` step for promtool 3.x, built from the Prometheus Go module.

Production runs the official Prometheus 3.x images while Debian ships 2.42, so the rules are checked and
unit-tested with both. No binary can be downloaded here: like Thanos (metrics/install.py), the module
source comes through the Go module proxy and ``./cmd/promtool`` is built from a writable copy with
``-mod=mod``. The Go module version v0.3NN.x is Prometheus v3.NN.x.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from fleetsight.settings import Settings
from fleetsight.setup import InstallError, InstallStep, binary_version, go_env, remove_leftovers, run_logged

# The pin: change it and the next `fleetsight setup` rebuilds (the stamp no longer matches).
PROMETHEUS_MODULE = "github.com/prometheus/prometheus"
PROMETHEUS_MODULE_VERSION = "v0.316.0"
BUILD_TAGS = "netgo,remove_all_sd"
PROMTOOL_STAMP = f"{PROMETHEUS_MODULE}@{PROMETHEUS_MODULE_VERSION} cmd/promtool tags={BUILD_TAGS}"


def prometheus_release(module_version: str = PROMETHEUS_MODULE_VERSION) -> str:
    """The release a module version stands for: v0.316.0 -> 3.16.0."""
    major_minor, patch = module_version.removeprefix("v0.").split(".", 1)
    return f"{int(major_minor) // 100}.{int(major_minor) % 100}.{patch}"


def promtool3_binary(settings: Settings) -> Path:
    """The promtool 3.x that setup builds (``.cache/bin/promtool3``)."""
    return settings.bin_dir / "promtool3"


def promtool3_stamp_file(settings: Settings) -> Path:
    return settings.bin_dir / "promtool3.stamp"


def promtool3_present(settings: Settings) -> bool:
    binary, stamp = promtool3_binary(settings), promtool3_stamp_file(settings)
    if not (binary.is_file() and stamp.is_file()) or stamp.read_text().strip() != PROMTOOL_STAMP:
        return False
    return f"version {prometheus_release()} " in binary_version(binary) + " "


def download_module_source(log: Path) -> Path:
    command = ["go", "mod", "download", "-json", f"{PROMETHEUS_MODULE}@{PROMETHEUS_MODULE_VERSION}"]
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
    result = subprocess.run(command, capture_output=True, text=True, env=go_env(), cwd=tempfile.gettempdir())
    with log.open("a") as out:
        out.write(result.stdout + result.stderr)
    if result.returncode != 0:
        raise InstallError(
            f"could not download {PROMETHEUS_MODULE}@{PROMETHEUS_MODULE_VERSION} from the Go module proxy "
            f"(GOPROXY={os.environ.get('GOPROXY', 'default')}); see the log"
        )
    info = json.loads(result.stdout)
    if info.get("Error") or not info.get("Dir"):
        raise InstallError(f"go mod download answered an error: {info.get('Error', 'no Dir')}")
    return Path(info["Dir"])


def make_writable(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | stat.S_IWUSR)


def version_ldflags() -> str:
    package = "github.com/prometheus/common/version"
    release = prometheus_release()
    return " ".join(
        [
            f"-X {package}.Version={release}",
            f"-X {package}.Revision={PROMETHEUS_MODULE_VERSION}",
            f"-X {package}.Branch=release-{release}",
            f"-X {package}.BuildUser=fleetsight-setup",
        ]
    )


def install_promtool3(settings: Settings, log: Path) -> None:
    if shutil.which("go") is None:
        raise InstallError("the Go toolchain is not on PATH: install Go to build promtool 3.x")
    source = download_module_source(log)
    settings.bin_dir.mkdir(parents=True, exist_ok=True)
    build_root = settings.cache_dir / "build"
    build_root.mkdir(parents=True, exist_ok=True)
    remove_leftovers(settings.bin_dir, "promtool3.partial-")
    remove_leftovers(build_root, "promtool3-")
    with tempfile.TemporaryDirectory(prefix=f"promtool3-{os.getpid()}-", dir=build_root) as scratch:
        tree = Path(scratch) / "src"
        shutil.copytree(source, tree, symlinks=True)
        make_writable(tree)
        # Build beside the final place and rename: an interrupted build leaves nothing the check accepts.
        partial = settings.bin_dir / f"promtool3.partial-{os.getpid()}"
        # promtool needs no service discovery; leaving the SD plugins out also avoids modules that
        # the proxy refuses (nomad's pseudo-version answers 403).
        build = [
            "go",
            "build",
            "-tags",
            BUILD_TAGS,
            "-ldflags",
            version_ldflags(),
            "-o",
            partial,
            "./cmd/promtool",
        ]
        try:
            run_logged(build, log, cwd=tree, env=go_env())
            promtool3_stamp_file(settings).unlink(missing_ok=True)
            os.replace(partial, promtool3_binary(settings))
        finally:
            partial.unlink(missing_ok=True)
    reported = binary_version(promtool3_binary(settings))
    if prometheus_release() not in reported:
        raise InstallError(f"the built promtool does not report {prometheus_release()}: {reported!r}")
    promtool3_stamp_file(settings).write_text(PROMTOOL_STAMP + "\n")


INSTALL_STEPS = [
    InstallStep(
        name="promtool3",
        description=f"promtool {prometheus_release()} (Prometheus 3.x rule checks), built from its Go module",
        needed_by="tests/rules (rules checked and unit-tested with promtool 2.x and 3.x)",
        check=promtool3_present,
        install=install_promtool3,
        eta="~3-6 min cold (Go build, 2 cores), ~30 s with warm Go caches",
    ),
]
