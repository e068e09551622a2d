"""Binaries that ``fleetsight setup`` builds from a Go module (Thanos, promtool 3.x).

No release binary can be downloaded here, and ``go install module@version`` is refused for modules whose
go.mod has replace directives. So the module source comes through the Go module proxy (``go mod
download``), is copied to a writable folder (the module cache is read-only and ``-mod=mod`` may rewrite
go.sum) and one package of it is built there. The build lands beside its final place and is renamed, and
a stamp naming the pinned build is written last: an interrupted build leaves nothing the check accepts.
The version is stamped into the binary with Prometheus's ldflags (``--version``, ``*_build_info``).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fleetsight.settings import Settings
from fleetsight.setup import InstallError, InstallStep, binary_version, go_env, remove_leftovers, run_logged

VERSION_PACKAGE = "github.com/prometheus/common/version"


@dataclass(frozen=True)
class GoModuleBuild:
    binary_name: str  # under .cache/bin
    module: str
    module_version: str  # the pin: change it and the next setup rebuilds (the stamp no longer matches)
    package: str  # inside the module, e.g. ./cmd/thanos
    tags: str
    release: str  # the version the binary must report
    branch: str
    stamp_detail: str = ""  # more that names the build in the stamp

    @property
    def stamp(self) -> str:
        detail = f"{self.stamp_detail} " if self.stamp_detail else ""
        return f"{self.module}@{self.module_version} {detail}tags={self.tags}"

    def binary(self, settings: Settings) -> Path:
        return settings.bin_dir / self.binary_name

    def stamp_file(self, settings: Settings) -> Path:
        return settings.bin_dir / f"{self.binary_name}.stamp"

    def reported_version(self, settings: Settings) -> str:
        return binary_version(self.binary(settings))

    def reports_release(self, settings: Settings) -> bool:
        return f"version {self.release} " in self.reported_version(settings) + " "

    def present(self, settings: Settings) -> bool:
        """The binary runs and reports the pinned release, and the stamp names the pinned build."""
        binary, stamp = self.binary(settings), self.stamp_file(settings)
        if not (binary.is_file() and stamp.is_file()) or stamp.read_text().strip() != self.stamp:
            return False
        return self.reports_release(settings)

    def ldflags(self) -> str:
        return " ".join(
            [
                f"-X {VERSION_PACKAGE}.Version={self.release}",
                f"-X {VERSION_PACKAGE}.Revision={self.module_version}",
                f"-X {VERSION_PACKAGE}.Branch={self.branch}",
                f"-X {VERSION_PACKAGE}.BuildUser=fleetsight-setup",
            ]
        )

    def install_step(self, name: str, description: str, needed_by: str, eta: str) -> InstallStep:
        """The `fleetsight setup` step that builds this binary when it is missing or not the pinned one."""
        return InstallStep(
            name=name,
            description=description,
            needed_by=needed_by,
            check=self.present,
            install=self.install,
            eta=eta,
        )

    def download_source(self, log: Path) -> Path:
        """`go mod download` the pinned module; its (read-only) folder in the module cache."""
        target = f"{self.module}@{self.module_version}"
        command = ["go", "mod", "download", "-json", target]
        with log.open("a") as out:
            out.write(f"$ {' '.join(command)}\n")
        result = subprocess.run(
            command, capture_output=True, text=True, env=go_env(), cwd=tempfile.gettempdir()
        )
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

    # -- the build, in hooks that a module with its own needs overrides (deploy/tools.py, Grafana) --

    def check_toolchain(self) -> None:
        if shutil.which("go") is None:
            raise InstallError(f"the Go toolchain is not on PATH: install Go to build {self.binary_name}")

    def prepare(self, scratch: Path, log: Path) -> Path:
        """The folder to build in: a writable copy of the module's source."""
        tree = scratch / "src"
        shutil.copytree(self.download_source(log), tree, symlinks=True)
        make_writable(tree)
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
        self.stamp_file(settings).write_text(self.stamp + "\n")


def make_writable(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
