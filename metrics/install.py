"""``fleetsight setup`` step for Thanos: built from its Go module, since no binary download is possible.

``go install module@version`` is refused (Thanos's go.mod has replace directives), so the step
downloads the module source through the Go module proxy, copies it to a writable folder and builds
``./cmd/thanos`` there with ``-mod=mod``. The ``slicelabels`` build tag is not optional: without it the
sidecar panics on its first gRPC call. The version is stamped into the binary (``--version`` and
``thanos_build_info``) with the same ldflags the upstream release uses.

Go's module and build caches stay in their default places (~/go, ~/.cache/go-build; ~10 GB after a
build) so that a rebuild after a version bump only compiles what changed.
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

# The pins: change one and the next `fleetsight setup` rebuilds (the stamp no longer matches).
THANOS_MODULE = "github.com/thanos-io/thanos"
THANOS_VERSION = "v0.42.4"  # as in shared/STACK.md; its go.mod asks for Go 1.26
THANOS_BUILD_TAGS = "netgo,slicelabels"
THANOS_STAMP = f"{THANOS_MODULE}@{THANOS_VERSION} tags={THANOS_BUILD_TAGS}"


def thanos_binary(settings: Settings) -> Path:
    """The Thanos binary that setup builds (``.cache/bin/thanos``)."""
    return settings.bin_dir / "thanos"


def thanos_stamp_file(settings: Settings) -> Path:
    return settings.bin_dir / "thanos.stamp"


def thanos_present(settings: Settings) -> bool:
    """The binary runs and reports the pinned version, and the stamp names the pinned build."""
    binary, stamp = thanos_binary(settings), thanos_stamp_file(settings)
    if not (binary.is_file() and stamp.is_file()) or stamp.read_text().strip() != THANOS_STAMP:
        return False
    return f"version {THANOS_VERSION.removeprefix('v')} " in binary_version(binary) + " "


def download_module_source(log: Path) -> Path:
    """`go mod download` the pinned module; return its (read-only) folder in the module cache."""
    command = ["go", "mod", "download", "-json", f"{THANOS_MODULE}@{THANOS_VERSION}"]
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
    result = subprocess.run(command, capture_output=True, text=True, env=go_env(), cwd=tempfile.gettempdir())
    with log.open("a") as out:
        out.write(result.stdout + result.stderr)
    if result.returncode != 0:
        raise InstallError(
            f"could not download {THANOS_MODULE}@{THANOS_VERSION} from the Go module proxy "
            f"(GOPROXY={os.environ.get('GOPROXY', 'default')}); see the log"
        )
    info = json.loads(result.stdout)
    if info.get("Error") or not info.get("Dir"):
        raise InstallError(f"go mod download answered an error: {info.get('Error', 'no Dir')}")
    return Path(info["Dir"])


def make_writable(root: Path) -> None:
    """The module cache is read-only; `go build -mod=mod` may rewrite go.sum in the copy."""
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | stat.S_IWUSR)


def version_ldflags() -> str:
    package = "github.com/prometheus/common/version"
    return " ".join(
        [
            f"-X {package}.Version={THANOS_VERSION.removeprefix('v')}",
            f"-X {package}.Revision={THANOS_VERSION}",
            f"-X {package}.Branch=release-{THANOS_VERSION}",
            f"-X {package}.BuildUser=fleetsight-setup",
        ]
    )


def install_thanos(settings: Settings, log: Path) -> None:
    if shutil.which("go") is None:
        raise InstallError("the Go toolchain is not on PATH: install Go (Thanos's go.mod asks for 1.26)")
    source = download_module_source(log)
    settings.bin_dir.mkdir(parents=True, exist_ok=True)
    build_root = settings.cache_dir / "build"
    build_root.mkdir(parents=True, exist_ok=True)
    remove_leftovers(settings.bin_dir, "thanos.partial-")
    remove_leftovers(build_root, "thanos-")
    with tempfile.TemporaryDirectory(prefix=f"thanos-{os.getpid()}-", dir=build_root) as scratch:
        tree = Path(scratch) / "src"
        shutil.copytree(source, tree, symlinks=True)
        make_writable(tree)
        # Build next to the final place, then rename: an interrupted build leaves no binary that the
        # check could accept, and the stamp is written only after the rename.
        # (named per process: two setups at once, e.g. CI and a developer, must not share it)
        partial = settings.bin_dir / f"thanos.partial-{os.getpid()}"
        build = ["go", "build", "-tags", THANOS_BUILD_TAGS, "-ldflags", version_ldflags(), "-o", partial]
        try:
            run_logged([*build, "./cmd/thanos"], log, cwd=tree, env=go_env())
            thanos_stamp_file(settings).unlink(missing_ok=True)
            os.replace(partial, thanos_binary(settings))
        finally:
            partial.unlink(missing_ok=True)
    reported = binary_version(thanos_binary(settings))
    if THANOS_VERSION.removeprefix("v") not in reported:
        raise InstallError(f"the built thanos does not report {THANOS_VERSION}: {reported!r}")
    thanos_stamp_file(settings).write_text(THANOS_STAMP + "\n")


INSTALL_STEPS = [
    InstallStep(
        name="thanos",
        description=f"Thanos {THANOS_VERSION} (sidecar, store, query, compact), built from its Go module",
        needed_by="thanos sidecar/store/query/compact",
        check=thanos_present,
        install=install_thanos,
        eta="~4-8 min cold (Go build, 2 cores), ~1 min with warm Go caches",
    ),
]
