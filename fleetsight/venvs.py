"""Private virtual environments that ``fleetsight setup`` installs for a tool whose pinned dependencies
do not fit the project's own (ElastAlert2 pins an elasticsearch 7 client), under ``.cache/<folder>``.

One install for all: a fresh venv, the pinned requirements from PyPI, then a stamp naming the pins,
written last, so an interrupted install leaves nothing the check accepts and a changed pin reinstalls.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from fleetsight.settings import Settings
from fleetsight.setup import InstallError, InstallStep, run_logged, stamp_matches, step_of, write_stamp

STAMP_NAME = "fleetsight.stamp"


@dataclass(frozen=True)
class PrivateVenv:
    folder: str  # under the cache folder
    label: str  # what the errors call the tool
    requirements: tuple[str, ...]  # pinned, name==version: the stamp names them
    executable: str  # under bin/: the check wants it
    # the venv's Python must be older than this: this interpreter when it is, else the system's python3
    python_below: tuple[int, int] | None = None

    @property
    def stamp(self) -> str:
        return " ".join(requirement.replace("==", " ") for requirement in self.requirements)

    def root(self, settings: Settings) -> Path:
        return settings.cache_dir / self.folder

    def bin(self, settings: Settings, name: str) -> Path:
        return self.root(settings) / "bin" / name

    def present(self, settings: Settings) -> bool:
        stamp = self.root(settings) / STAMP_NAME
        return self.bin(settings, self.executable).is_file() and stamp_matches(stamp, self.stamp)

    def python(self) -> str:
        if self.python_below is None or sys.version_info < self.python_below:
            return sys.executable
        return "python3"

    def install(self, settings: Settings, log: Path) -> None:
        root = self.root(settings)
        settings.cache_dir.mkdir(parents=True, exist_ok=True)
        pip = [str(root / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check"]
        try:
            # --clear: a venv an interrupted install left (no stamp) starts over
            run_logged([self.python(), "-m", "venv", "--clear", str(root)], log)
            run_logged([*pip, *self.requirements], log)
        except InstallError as exc:
            raise InstallError(f"could not install {self.label} into {root} ({exc}); see the log") from exc
        write_stamp(root / STAMP_NAME, self.stamp)

    def install_step(self, name: str, description: str, needed_by: str, eta: str) -> InstallStep:
        return step_of(self, name, description, needed_by, eta)
