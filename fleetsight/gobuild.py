"""Binaries that ``fleetsight setup`` builds from a Go module: Thanos, promtool 3.x, helm, kwok and the
Kubernetes control plane (deploy/tools.py). One builder, :class:`GoModuleBuild`; a build is a
configuration of it, and a module with needs of its own overrides one of its hooks.

No release binary can be downloaded here, and ``go install module@version`` is refused for modules whose
go.mod has replace directives. So the module source comes through the Go module proxy (``go mod
download``) and is either copied to a writable folder (the module cache is read-only and ``-mod=mod`` may
rewrite go.sum) or, where the module cannot build as itself (k8s.io/kubernetes maps its staging modules to
./staging), required by a small wrapper module; one package of it is built there. The build lands beside
its final place and is renamed, and a stamp naming the pinned build is written last: an interrupted build
leaves nothing the check accepts. The version is stamped into the binary with ``-X`` flags (by default
Prometheus's version package: ``--version``, ``*_build_info``) and read back after the build.

The hooks, in build order: :meth:`GoModuleBuild.download_source`, :meth:`~GoModuleBuild.prepare` (copy or
wrapper module), :meth:`~GoModuleBuild.ldflags`, :meth:`~GoModuleBuild.build_command`,
:meth:`~GoModuleBuild.build_in`, :meth:`~GoModuleBuild.reports_release` (the post-build check).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fleetsight.settings import Settings
from fleetsight.setup import (
    GO_LANE,
    InstallError,
    InstallStep,
    go_env,
    remove_leftovers,
    run_logged,
    stamp_matches,
    step_of,
    write_stamp,
)

VERSION_PACKAGE = "github.com/prometheus/common/version"
VERSION_TIMEOUT_S = 10

# (the wrapped module's go.mod, its version) -> the wrapper module's go.mod
WrapperGoMod = Callable[[str, str], str]


def version_output(command: list[str | os.PathLike]) -> str:
    """What a binary prints for its version command (stdout and stderr), or "" when it does not run."""
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=VERSION_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (result.stdout + result.stderr).strip() if result.returncode == 0 else ""


def require_go(purpose: str) -> None:
    if shutil.which("go") is None:
        raise InstallError(f"the Go toolchain is not on PATH: install Go to {purpose}")


def download_module(module: str, version: str, log: Path) -> Path:
    """`go mod download` a pinned module; its (read-only) folder in the module cache."""
    target = f"{module}@{version}"
    command = ["go", "mod", "download", "-json", target]
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
    result = subprocess.run(command, capture_output=True, text=True, env=go_env(), cwd=tempfile.gettempdir())
    with log.open("a") as out:
        out.write(result.stdout + result.stderr)
    if result.returncode != 0:
        raise InstallError(
            f"could not download {target} from the Go module proxy "
            f"(GOPROXY={os.environ.get('GOPROXY', 'default')}); see the log"
        )
    info = json.loads(result.stdout)
    if info.get("Error") or not info.get("Dir"):
        raise InstallError(f"go mod download answered an error: {info.get('Error', 'no Dir')}")
    return Path(info["Dir"])


@dataclass(frozen=True)
class GoModuleBuild:
    binary_name: str  # under .cache/bin
    module: str
    module_version: str  # the pin: change it and the next setup rebuilds (the stamp no longer matches)
    package: str  # inside the module (./cmd/thanos), or an import path when built in a wrapper module
    tags: str
    release: str  # the version the binary must report
    branch: str = ""
    stamp_detail: str = ""  # more that names the build in the stamp
    # ``package.variable=value`` for ``-X``; None: Prometheus's version package from release and branch
    version_vars: tuple[str, ...] | None = None
    version_args: tuple[str, ...] = ("--version",)  # how the binary reports its version (helm: version)
    # what the version output must contain after the build ({release} filled in); Prometheus's binaries
    # print "thanos, version 0.42.4 (branch: ...)", the others the bare release
    version_marker: str = "version {release} "
    wrapper_go_mod: WrapperGoMod | None = None  # set: build in a wrapper module that requires this one

    @property
    def stamp(self) -> str:
        detail = f"{self.stamp_detail} " if self.stamp_detail else ""
        return f"{self.module}@{self.module_version} {detail}tags={self.tags}"

    def binary(self, settings: Settings) -> Path:
        return settings.bin_dir / self.binary_name

    def stamp_file(self, settings: Settings) -> Path:
        return settings.bin_dir / f"{self.binary_name}.stamp"

    def reported_version(self, settings: Settings) -> str:
        return version_output([self.binary(settings), *self.version_args])

    def reports_release(self, settings: Settings) -> bool:
        """The post-build check: the binary runs and reports the pinned release."""
        marker = self.version_marker.format(release=self.release)
        return marker in self.reported_version(settings) + " "

    def present(self, settings: Settings) -> bool:
        """The binary runs and reports the pinned release, and the stamp names the pinned build."""
        if not self.binary(settings).is_file() or not stamp_matches(self.stamp_file(settings), self.stamp):
            return False
        return self.reports_release(settings)

    def ldflags(self) -> str:
        """The version variables, and no symbol table or DWARF (-s -w): nothing here debugs these
        binaries, and the linker (mostly on one core) has less to write."""
        version_vars = self.prometheus_version_vars() if self.version_vars is None else self.version_vars
        return " ".join(["-s", "-w", *(f"-X {item}" for item in version_vars)])

    def prometheus_version_vars(self) -> tuple[str, ...]:
        return (
            f"{VERSION_PACKAGE}.Version={self.release}",
            f"{VERSION_PACKAGE}.Revision={self.module_version}",
            f"{VERSION_PACKAGE}.Branch={self.branch}",
            f"{VERSION_PACKAGE}.BuildUser=fleetsight-setup",
        )

    def install_step(self, name: str, description: str, needed_by: str, eta: str) -> InstallStep:
        return step_of(self, name, description, needed_by, eta, lane=GO_LANE)

    # -- the build, in hooks that a module with its own needs overrides --

    def download_source(self, log: Path) -> Path:
        return download_module(self.module, self.module_version, log)

    def check_toolchain(self) -> None:
        require_go(f"build {self.binary_name}")

    def prepare(self, scratch: Path, log: Path) -> Path:
        """The folder to build in: a writable copy of the module's source, or the wrapper module."""
        source = self.download_source(log)
        if self.wrapper_go_mod is not None:
            go_mod = self.wrapper_go_mod((source / "go.mod").read_text(), self.module_version)
            return self.prepare_wrapper(go_mod, scratch / "wrapper", log)
        tree = scratch / "src"
        shutil.copytree(source, tree, symlinks=True)
        make_writable(tree)
        return tree

    def prepare_wrapper(self, go_mod: str, tree: Path, log: Path) -> Path:
        """A module (go_mod: it requires this one) whose only file imports the package to build."""
        tree.mkdir()
        (tree / "go.mod").write_text(go_mod)
        # a build-tagged import so that `go mod tidy` resolves the package's whole dependency graph
        (tree / "tools.go").write_text(f'//go:build tools\n\npackage tools\n\nimport _ "{self.package}"\n')
        run_logged(["go", "mod", "tidy"], log, cwd=tree, env=go_env())
        return tree

    def build_command(self, output: Path) -> list[str | os.PathLike]:
        tags = ["-tags", self.tags] if self.tags else []
        return ["go", "build", *tags, "-ldflags", self.ldflags(), "-o", output, self.package]

    def build_in(self, tree: Path, settings: Settings, log: Path) -> None:
        """Build inside tree into the binary's place, through a partial file named per process (two
        setups at once, CI and a developer, must not share it)."""
        partial = settings.bin_dir / f"{self.binary_name}.partial-{os.getpid()}"
        try:
            run_logged(self.build_command(partial), log, cwd=tree, env=go_env())
            self.stamp_file(settings).unlink(missing_ok=True)
            os.replace(partial, self.binary(settings))
        finally:
            partial.unlink(missing_ok=True)

    def install(self, settings: Settings, log: Path) -> None:
        self.check_toolchain()
        settings.bin_dir.mkdir(parents=True, exist_ok=True)
        build_root = settings.cache_dir / "build"
        build_root.mkdir(parents=True, exist_ok=True)
        remove_leftovers(settings.bin_dir, f"{self.binary_name}.partial-")
        remove_leftovers(build_root, f"{self.binary_name}-")
        with tempfile.TemporaryDirectory(
            prefix=f"{self.binary_name}-{os.getpid()}-", dir=build_root
        ) as scratch:
            self.build_in(self.prepare(Path(scratch), log), settings, log)
        if not self.reports_release(settings):
            reported = self.reported_version(settings)
            raise InstallError(f"the built {self.binary_name} does not report {self.release}: {reported!r}")
        write_stamp(self.stamp_file(settings), self.stamp)


def make_writable(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
