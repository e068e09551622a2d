"""What the Maven-fetched installs of the log path (Kafka, OpenSearch) share: the jars fetched from Maven
Central by ``mvn dependency:copy-dependencies``, each install assembled in a temporary folder beside its
final place and renamed into place only when complete, with a stamp of the pinned versions (and the pom's
hash) that the checks compare. Maven's local repository stays in its default place (~/.m2). Its own
module: the way of fetching and swapping in changes apart from what each server needs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from fleetsight.settings import Settings
from fleetsight.setup import InstallError, remove_leftovers, run_logged

DEPENDENCY_PLUGIN_VERSION = "3.8.1"
MAVEN_DIR = Path(__file__).resolve().parent / "maven"
STAMP_NAME = "fleetsight.stamp"


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def require_tools(*tools: str) -> None:
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        raise InstallError(
            f"{', '.join(missing)} not on PATH: install a JDK 17+ and Maven "
            "(Debian: apt-get install openjdk-17-jdk-headless maven)"
        )


def maven_copy_dependencies(pom: Path, output: Path, properties: dict[str, str], log: Path) -> None:
    """Copy the pom's dependencies (and theirs) from Maven Central into output."""
    defines = [f"-D{key}={value}" for key, value in properties.items()]
    command = [
        "mvn", "-B", "-q", "-f", pom, "dependency:copy-dependencies", f"-DoutputDirectory={output}",
        f"-Ddependency.plugin.version={DEPENDENCY_PLUGIN_VERSION}", *defines,
    ]  # fmt: skip
    try:
        run_logged(command, log)
    except InstallError as exc:
        raise InstallError(
            f"Maven could not fetch the jars of {pom.name} from Maven Central ({exc}); see the log"
        ) from exc


def replace_dir(staged: Path, final: Path) -> None:
    """Move a complete staged folder into place; the old one (an older version) goes."""
    if final.exists():
        retired = final.with_name(f"{final.name}.old-{os.getpid()}")
        shutil.rmtree(retired, ignore_errors=True)
        os.replace(final, retired)
        shutil.rmtree(retired, ignore_errors=True)
    os.replace(staged, final)


def staging_dir(settings: Settings, name: str) -> Path:
    settings.cache_dir.mkdir(parents=True, exist_ok=True)
    remove_leftovers(settings.cache_dir, f"{name}.partial-")
    remove_leftovers(settings.cache_dir, f"{name}.old-")
    staged = Path(tempfile.mkdtemp(prefix=f"{name}.partial-{os.getpid()}-", dir=settings.cache_dir))
    staged.chmod(0o755)  # mkdtemp's 0700 would follow the folder into place
    return staged
