"""OpenSearch for the log path, as ``fleetsight setup`` installs it from Maven Central, and what the stack
runner and the tests use to start it (its command line, an instance folder).

- The integ-test distribution zip plus the ``ingest-common`` module (grok, dissect, date, ... processors)
  assembled from its jars, from ``maven/opensearch.pom.xml``, and the ``lang-painless`` and
  ``lang-mustache`` modules (``if`` conditions, ``script`` processors and ``{{field}}`` templates, which
  Elasticsearch has built in) from ``maven/opensearch-module.pom.xml``. It refuses to run as root, so
  when setup runs as root its files belong to :data:`OPENSEARCH_USER` and the server is started through
  ``runuser`` (:func:`opensearch_command`).
- OpenSearch with its security plugin (``maven/opensearch-security.pom.xml``, the plugin's own zip put in
  by its own installer) is a second install beside the first, hard-linked to it: the security tests
  start it (configured by ``opensearch_security.py``); the local stack keeps the one without.
"""

from __future__ import annotations

import os
import pwd
import shutil
import zipfile
from pathlib import Path
from typing import NamedTuple

from fleetsight.settings import Settings
from fleetsight.setup import InstallError, run_logged, stamp_matches, write_stamp

from .maven_install import (
    MAVEN_DIR,
    STAMP_NAME,
    file_sha256,
    maven_copy_dependencies,
    replace_dir,
    require_tools,
    staging_dir,
)

# The pin: change it and the next `fleetsight setup` re-installs (the stamp no longer matches).
OPENSEARCH_VERSION = "2.19.3"
OPENSEARCH_POM = MAVEN_DIR / "opensearch.pom.xml"
MODULE_POM = MAVEN_DIR / "opensearch-module.pom.xml"
SECURITY_POM = MAVEN_DIR / "opensearch-security.pom.xml"

OPENSEARCH_USER = "nobody"
"""Who OpenSearch runs as when setup and the runner are root (it refuses root)."""
OPENSEARCH_HEAP = ("512m", "1g")
INGEST_COMMON_CLASS = "org.opensearch.ingest.common.IngestCommonPlugin"


class ScriptModule(NamedTuple):
    name: str  # the folder under modules/
    artifact: str  # org.opensearch.plugin:<artifact> on Maven Central
    classname: str
    policy: str  # what the real module grants itself


SCRIPT_MODULES = (
    ScriptModule(
        "lang-painless",
        "lang-painless",
        "org.opensearch.painless.PainlessPlugin",
        # It compiles scripts into classes at run time.
        'grant {\n  permission java.lang.RuntimePermission "createClassLoader";\n'
        '  permission java.lang.RuntimePermission "getClassLoader";\n};\n',
    ),
    ScriptModule(
        "lang-mustache",
        "lang-mustache-client",  # the module's classes, as published for clients (the module is not)
        "org.opensearch.script.mustache.MustachePlugin",
        'grant {\n  permission java.lang.reflect.ReflectPermission "suppressAccessChecks";\n};\n',
    ),
)

# -- OpenSearch ------------------------------------------------------------------------------------

OPENSEARCH_STAMP = (
    f"opensearch {OPENSEARCH_VERSION} ingest-common {OPENSEARCH_VERSION} heap {'-'.join(OPENSEARCH_HEAP)} "
    f"pom {file_sha256(OPENSEARCH_POM)} modules {file_sha256(MODULE_POM)} "
    f"{' '.join(m.name for m in SCRIPT_MODULES)}"
)


def opensearch_home(settings: Settings) -> Path:
    """OpenSearch's install folder (bin/, lib/, modules/ incl. ingest-common, config/ templates)."""
    return settings.cache_dir / "opensearch"


def opensearch_run_as() -> str | None:
    """The user OpenSearch must run as: :data:`OPENSEARCH_USER` when we are root, else ourselves."""
    return OPENSEARCH_USER if os.geteuid() == 0 else None


def opensearch_command(settings: Settings, home: Path | None = None) -> list[str]:
    """The command line that starts OpenSearch; configure it with :func:`prepare_opensearch_instance`'s
    environment. As root it goes through ``runuser`` (same process group, no new session). To stop it,
    SIGTERM runuser's child (the JVM): runuser then exits with its status. A SIGTERM to runuser itself
    is forwarded, but runuser SIGKILLs the server 2 s later, which cuts a clean shutdown short."""
    command = [str((home or opensearch_home(settings)) / "bin" / "opensearch")]
    user = opensearch_run_as()
    return ["runuser", "-u", user, "--", *command] if user else command


def java_home() -> Path:
    java = shutil.which("java")
    if java is None:
        raise InstallError("java is not on PATH: install a JDK 17+ (Debian: openjdk-17-jdk-headless)")
    return Path(java).resolve().parent.parent


def chown_tree(root: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    for path in [root, *root.rglob("*")]:
        os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)


def prepare_opensearch_instance(
    settings: Settings,
    instance_dir: Path,
    *,
    http_port: int,
    transport_port: int,
    cluster_name: str = "fleetsight",
    home: Path | None = None,
) -> dict[str, str]:
    """Make one single-node instance in instance_dir (config/, data/, logs/, tmp/) listening on
    loopback only, owned by the user it runs as; return the environment to start it with. home: the
    install it runs from (default: the local stack's, :func:`opensearch_home`)."""
    config = instance_dir / "config"
    shutil.copytree((home or opensearch_home(settings)) / "config", config, dirs_exist_ok=True)
    for sub in ("data", "logs", "tmp"):
        (instance_dir / sub).mkdir(parents=True, exist_ok=True)
    (config / "opensearch.yml").write_text(
        "\n".join(
            [
                "# Written by FleetSight: one node on loopback.",
                f"cluster.name: {cluster_name}",
                "node.name: node-1",
                "network.host: 127.0.0.1",
                f"http.port: {http_port}",
                f"transport.port: {transport_port}",
                "discovery.type: single-node",
                f"path.data: {instance_dir / 'data'}",
                f"path.logs: {instance_dir / 'logs'}",
                "action.auto_create_index: true",
                "",
            ]
        )
    )
    user = opensearch_run_as()
    if user:
        chown_tree(instance_dir, user)
    return {
        **os.environ,
        "OPENSEARCH_PATH_CONF": str(config),
        "OPENSEARCH_JAVA_HOME": str(java_home()),
        "OPENSEARCH_TMPDIR": str(instance_dir / "tmp"),
    }


def owner_is(path: Path, user: str) -> bool:
    try:
        return path.stat().st_uid == pwd.getpwnam(user).pw_uid
    except (OSError, KeyError):
        return False


def put_in_place(staged: Path, stamp: str, user: str | None, final: Path) -> None:
    """A staged OpenSearch install finished: stamped, owned by the user it runs as, then swapped in."""
    write_stamp(staged / STAMP_NAME, stamp)
    if user:
        chown_tree(staged, user)
    replace_dir(staged, final)


def opensearch_present(settings: Settings) -> bool:
    home = opensearch_home(settings)
    module = home / "modules" / "ingest-common"
    user = opensearch_run_as()
    return (
        shutil.which("java") is not None
        and stamp_matches(home / STAMP_NAME, OPENSEARCH_STAMP)
        and (home / "bin" / "opensearch").is_file()
        and (home / "lib" / f"opensearch-{OPENSEARCH_VERSION}.jar").is_file()
        and (module / "plugin-descriptor.properties").is_file()
        and (module / f"ingest-common-{OPENSEARCH_VERSION}.jar").is_file()
        and all(
            (home / "modules" / m.name / f"{m.artifact}-{OPENSEARCH_VERSION}.jar").is_file()
            for m in SCRIPT_MODULES
        )
        and (user is None or owner_is(home / "config", user))
    )


def extract_zip(archive: Path, target: Path) -> None:
    """Unzip keeping the files' Unix modes (the launch scripts must stay executable)."""
    with zipfile.ZipFile(archive) as zipped:
        for member in zipped.infolist():
            path = Path(zipped.extract(member, target))
            mode = member.external_attr >> 16 & 0o777
            if mode:
                path.chmod(mode)


def artifact_name(jar: str) -> str:
    """``opensearch-grok-2.19.3.jar`` -> ``opensearch-grok``: the artifact without its version."""
    stem = jar.removesuffix(".jar")
    parts = stem.split("-")
    while parts and parts[-1][:1].isdigit():
        parts.pop()
    return "-".join(parts)


def assemble_module(home: Path, name: str, classname: str, jars: list[Path], policy: str = "") -> None:
    """modules/<name>: its jars minus those the server already has in lib/ (a class twice on the
    classpath makes OpenSearch refuse to start), and the descriptor the module loader reads."""
    module = home / "modules" / name
    module.mkdir(parents=True)
    in_lib = {artifact_name(jar.name) for jar in (home / "lib").glob("*.jar")}
    for jar in jars:
        if artifact_name(jar.name) not in in_lib:
            shutil.copy2(jar, module / jar.name)
    (module / "plugin-descriptor.properties").write_text(
        "\n".join(
            [
                f"description=The {name} module, assembled by fleetsight setup",
                f"version={OPENSEARCH_VERSION}",
                f"name={name}",
                f"classname={classname}",
                "java.version=11",
                f"opensearch.version={OPENSEARCH_VERSION}",
                "",
            ]
        )
    )
    if policy:
        (module / "plugin-security.policy").write_text(policy)


def heap_options() -> str:
    low, high = OPENSEARCH_HEAP
    header = "# Written by `fleetsight setup`: a small heap for one-node test and demo stacks."
    return f"{header}\n-Xms{low}\n-Xmx{high}\n"


def check_traversable(path: Path, user: str) -> None:
    """The run-as user must be able to reach the install folder through every parent."""
    for parent in path.resolve().parents:
        if not os.stat(parent).st_mode & 0o001:
            raise InstallError(
                f"{user} cannot enter {parent} (no o+x), so OpenSearch cannot run from {path}: "
                f"`chmod o+x {parent}` or set FLEETSIGHT_CACHE_DIR to a folder it can reach"
            )


def install_opensearch(settings: Settings, log: Path) -> None:
    require_tools("java", "mvn")
    user = opensearch_run_as()
    if user:
        check_traversable(opensearch_home(settings), user)
    staged = staging_dir(settings, "opensearch")
    try:
        download = staged / "download"
        maven_copy_dependencies(OPENSEARCH_POM, download, {"opensearch.version": OPENSEARCH_VERSION}, log)
        archive = download / f"opensearch-{OPENSEARCH_VERSION}.zip"
        if not archive.is_file():
            raise InstallError(f"Maven finished but {archive.name} is missing")
        extract_zip(archive, staged / "unpacked")
        home = staged / "unpacked" / f"opensearch-{OPENSEARCH_VERSION}"
        assemble_module(home, "ingest-common", INGEST_COMMON_CLASS, sorted(download.glob("*.jar")))
        for module in SCRIPT_MODULES:
            jars_dir = staged / module.name
            properties = {"opensearch.version": OPENSEARCH_VERSION, "module.artifact": module.artifact}
            maven_copy_dependencies(MODULE_POM, jars_dir, properties, log)
            assemble_module(
                home, module.name, module.classname, sorted(jars_dir.glob("*.jar")), module.policy
            )
        (home / "config" / "jvm.options.d" / "fleetsight-heap.options").write_text(heap_options())
        put_in_place(home, OPENSEARCH_STAMP, user, opensearch_home(settings))
    finally:
        shutil.rmtree(staged, ignore_errors=True)


# -- OpenSearch with its security plugin (tests only) ---------------------------------------------

SECURITY_PLUGIN_VERSION = f"{OPENSEARCH_VERSION}.0"  # the plugin's own four-part version
SECURITY_PLUGIN = "opensearch-security"
OPENSEARCH_SECURED_STAMP = (
    f"{OPENSEARCH_STAMP} + {SECURITY_PLUGIN} {SECURITY_PLUGIN_VERSION} pom {file_sha256(SECURITY_POM)}"
)


def opensearch_secured_home(settings: Settings) -> Path:
    """A second OpenSearch install, the first one plus the security plugin. The local stack keeps the
    unsecured one (every local client would need a credential); tests/pipelines/
    test_opensearch_security.py starts this one (pipelines/opensearch_security.py configures it)."""
    return settings.cache_dir / "opensearch-secured"


def opensearch_secured_present(settings: Settings) -> bool:
    home = opensearch_secured_home(settings)
    plugin = home / "plugins" / SECURITY_PLUGIN
    user = opensearch_run_as()
    return (
        opensearch_present(settings)
        and stamp_matches(home / STAMP_NAME, OPENSEARCH_SECURED_STAMP)
        and (plugin / "plugin-descriptor.properties").is_file()
        and (plugin / f"{SECURITY_PLUGIN}-{SECURITY_PLUGIN_VERSION}.jar").is_file()
        and (user is None or owner_is(home / "config", user))
    )


def link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # a file system without hard links
        shutil.copy2(source, target)


def link_tree(source: Path, target: Path) -> None:
    """A copy of the OpenSearch install: jars and scripts hard-linked (no second 60 MB; neither install
    ever writes them), config/ copied for real (the plugin installer adds to it)."""

    def top_level(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if n in ("config", STAMP_NAME)] if Path(folder) == source else []

    shutil.copytree(source, target, copy_function=link_or_copy, ignore=top_level)
    shutil.copytree(source / "config", target / "config")


def install_opensearch_security(settings: Settings, log: Path) -> None:
    require_tools("java", "mvn")
    if not opensearch_present(settings):
        raise InstallError(
            "OpenSearch itself is not installed: run `fleetsight setup --only opensearch` first"
        )
    user = opensearch_run_as()
    staged = staging_dir(settings, "opensearch-secured")
    try:
        download = staged / "download"
        properties = {"security.version": SECURITY_PLUGIN_VERSION}
        maven_copy_dependencies(SECURITY_POM, download, properties, log)
        archive = download / f"{SECURITY_PLUGIN}-{SECURITY_PLUGIN_VERSION}.zip"
        if not archive.is_file():
            raise InstallError(f"Maven finished but {archive.name} is missing")
        home = staged / "home"
        link_tree(opensearch_home(settings), home)
        # The plugin's own installer: it checks the version, asks nothing with --batch (the plugin
        # wants extra Java permissions: its policy file, listed in the log), and adds config/ defaults
        # that pipelines/opensearch_security.py replaces in each instance.
        installer = [
            str(home / "bin" / "opensearch-plugin"),
            "install",
            "--batch",
            archive.resolve().as_uri(),
        ]
        run_logged(installer, log, env={**os.environ, "OPENSEARCH_JAVA_HOME": str(java_home())})
        put_in_place(home, OPENSEARCH_SECURED_STAMP, user, opensearch_secured_home(settings))
    finally:
        shutil.rmtree(staged, ignore_errors=True)
