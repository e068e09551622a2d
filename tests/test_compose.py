"""The production stack (docker-compose.yml, Dockerfile) checked without a Docker engine.

Structure is checked against the real Compose Specification schema (tests/fixtures/compose-spec.json);
what the containers would run is checked by running the same programs here: Prometheus and
Alertmanager with the compose flags and mounts (paths moved under a temporary root), Thanos flags
against the real Thanos binary, FleetSight commands against its own CLI, and the Dockerfile's install
steps against the lock.
"""

from __future__ import annotations

import copy
import fnmatch
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlparse

import click
import httpx
import jsonschema
import pytest
import yaml

from fleetsight.settings import REPO_ROOT, Settings
from pipelines import logstash
from support import free_port, wait_until

COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
SCHEMA_FILE = REPO_ROOT / "tests" / "fixtures" / "compose-spec.json"
DOCKERFILE = REPO_ROOT / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
DEPLOYMENT_DOC = REPO_ROOT / "docs" / "deployment.md"
LOGSTASH_CONF = REPO_ROOT / "pipelines" / "logstash" / "pipeline" / "fleetsight-logs.conf"
OBJSTORE_FILE = REPO_ROOT / "metrics" / "thanos" / "objstore.yml"
GRAFANA_PROVISIONING = REPO_ROOT / "dashboards" / "provisioning"

# Operator-provided files (secrets, credentials) live here; each has a committed <name>.example.
OPERATOR_DIR = "secrets"
# Host paths outside the repo that node-level agents read (the host's own sysfs, procfs, logs).
HOST_SYSTEM_PATHS = {"/", "/sys", "/proc", "/var/log"}
COMPOSE_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")
THANOS_SERVICES = ("thanos-sidecar-a", "thanos-sidecar-b", "thanos-store", "thanos-compact", "thanos-query")


# ------------------------------------------------------------------------------------------ helpers
def interpolate_value(text: str, found: set[str] | None = None) -> str:
    """Compose's interpolation of one value: ${VAR:-default} from the environment, "$$" a literal "$"."""
    escaped = text.replace("$$", "\0")

    def value(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if found is not None:
            found.add(name)
        if default is None:
            raise AssertionError(f"${{{name}}} has no default: `docker compose up` would need it set")
        return os.environ.get(name, default)

    return COMPOSE_VARIABLE.sub(value, escaped).replace("\0", "$")


def interpolate(node: Any, found: set[str] | None = None) -> Any:
    """Interpolate every string of the parsed file (compose does it after YAML parsing, so comments
    are left alone)."""
    if isinstance(node, dict):
        return {key: interpolate(value, found) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate(value, found) for value in node]
    return interpolate_value(node, found) if isinstance(node, str) else node


def compose_variables() -> set[str]:
    found: set[str] = set()
    interpolate(yaml.safe_load(COMPOSE_FILE.read_text()), found)
    return found


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return interpolate(yaml.safe_load(COMPOSE_FILE.read_text()))


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def flag_values(command: list[str], flag: str) -> list[str]:
    """Values of --flag=value arguments (every occurrence, in order)."""
    prefix = f"--{flag}="
    return [arg.removeprefix(prefix) for arg in command if arg.startswith(prefix)]


def flag_value(command: list[str], flag: str) -> str:
    values = flag_values(command, flag)
    assert len(values) == 1, f"expected exactly one --{flag}= in {command}"
    return values[0]


def split_volume(spec: str | dict[str, Any]) -> tuple[str, str]:
    """(source, target) of a service volume, short or long syntax."""
    if isinstance(spec, dict):
        return spec.get("source", ""), spec["target"]
    source, target = spec.split(":")[:2]
    return source, target


def is_host_path(source: str) -> bool:
    return source.startswith((".", "/"))


def host_paths(compose: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, host path) for every file or folder the stack takes from the host."""
    found: list[tuple[str, str]] = []
    for name, service in compose["services"].items():
        for spec in service.get("volumes", []):
            source, _ = split_volume(spec)
            if is_host_path(source):
                found.append((f"{name} volume", source))
        env_files = service.get("env_file", [])
        for env_file in [env_files] if isinstance(env_files, str) else env_files:
            found.append((f"{name} env_file", env_file if isinstance(env_file, str) else env_file["path"]))
        build = service.get("build")
        if build:
            context = build if isinstance(build, str) else build.get("context", ".")
            found.append((f"{name} build context", context))
            if isinstance(build, dict) and "dockerfile" in build:
                found.append((f"{name} dockerfile", str(Path(context) / build["dockerfile"])))
    for kind in ("secrets", "configs"):
        for name, spec in compose.get(kind, {}).items():
            if "file" in spec:
                found.append((f"{kind}.{name}", spec["file"]))
    return found


def repo_relative(path: str) -> str:
    return Path(os.path.normpath(REPO_ROOT / path)).relative_to(REPO_ROOT).as_posix()


def bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> repo path, for the service's bind mounts of repo files."""
    mounts = {}
    for spec in service.get("volumes", []):
        source, target = split_volume(spec)
        if source.startswith("."):
            mounts[target] = REPO_ROOT / source
    return mounts


def published_port(service: dict[str, Any], container_port: int) -> bool:
    return any(str(spec).endswith(f":{container_port}") for spec in service.get("ports", []))


def listen_port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


# ------------------------------------------------------------------------------ compose specification
def compose_validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_FILE.read_text())
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema)


def spec_errors(document: dict[str, Any]) -> list[str]:
    validator = compose_validator()
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]
    # The schema states "a service has an image or a build" as a separate constraint; compose applies it.
    constraint = validator.schema["definitions"]["constraints"]["service"]
    for name, service in document.get("services", {}).items():
        errors += [f"services/{name}: {e.message}" for e in type(validator)(constraint).iter_errors(service)]
    return errors


def test_compose_file_validates_against_the_compose_specification(compose: dict[str, Any]) -> None:
    assert spec_errors(compose) == []


def test_the_schema_check_catches_a_malformed_service(compose: dict[str, Any]) -> None:
    broken = copy.deepcopy(compose)
    broken["services"]["grafana"]["restart_policy"] = "always"  # not a service key
    broken["services"]["kafka"]["healthcheck"]["retries"] = [5]  # wrong type
    del broken["services"]["seaweedfs"]["image"]  # neither image nor build
    errors = spec_errors(broken)
    assert any("restart_policy" in e for e in errors), errors
    assert any("services/kafka/healthcheck/retries" in e for e in errors), errors
    assert any(e.startswith("services/seaweedfs") for e in errors), errors


def test_interpolated_variables_have_defaults_and_are_documented() -> None:
    doc = DEPLOYMENT_DOC.read_text()
    for name in compose_variables():
        assert name.startswith("FLEETSIGHT_"), f"${{{name}}}: compose variables are FLEETSIGHT_*"
        assert name in doc, f"${{{name}}} is not documented in docs/deployment.md"


# ---------------------------------------------------------------------------------------- host paths
def test_every_mounted_host_path_exists_or_is_a_documented_operator_file(compose: dict[str, Any]) -> None:
    doc = DEPLOYMENT_DOC.read_text()
    problems = []
    for where, path in host_paths(compose):
        if path.startswith("/"):
            if path not in HOST_SYSTEM_PATHS:
                problems.append(f"{where}: absolute host path {path} is not an allowed system path")
            continue
        relative = repo_relative(path)
        if relative.startswith(f"{OPERATOR_DIR}/"):
            if not (REPO_ROOT / f"{relative}.example").is_file():
                problems.append(f"{where}: operator file {relative} has no {relative}.example")
            if relative not in doc:
                problems.append(f"{where}: operator file {relative} is not documented in docs/deployment.md")
        elif not (REPO_ROOT / relative).exists():
            problems.append(f"{where}: {relative} does not exist in the repo")
    assert problems == []


def test_operator_files_are_not_committed_and_never_copied_into_the_image() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", OPERATOR_DIR], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert [path for path in tracked if not path.endswith(".example")] == []
    assert dockerignored("secrets/slack_webhook_url", dockerignore_patterns())


# -------------------------------------------------------------------------------------------- images
def test_every_service_pins_its_image_or_builds_it(services: dict[str, dict[str, Any]]) -> None:
    project_version = importlib.metadata.version("fleetsight")
    for name, service in services.items():
        image = service.get("image", "")
        if "build" in service:
            # The image compose builds is tagged with the project's version, never "latest".
            assert image == f"fleetsight:{project_version}", f"{name}: built image tag {image!r}"
            continue
        assert image, f"{name}: neither an image nor a build"
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag, f"{name}: image {image!r} has no tag"
        assert tag != "latest" and "latest" not in tag, f"{name}: image {image!r} is not pinned"


# ------------------------------------------------------------------------------- Prometheus + Thanos
def replica_neutral(service: dict[str, Any]) -> dict[str, Any]:
    """A Prometheus service without what may differ between replicas: its replica name, its own data
    volume and its published host port."""
    neutral = copy.deepcopy(service)
    neutral["environment"].pop("PROMETHEUS_REPLICA")
    neutral["volumes"] = [v for v in neutral["volumes"] if split_volume(v)[1] != "/prometheus"]
    neutral["ports"] = [str(p).rsplit(":", 1)[1] for p in neutral["ports"]]
    return neutral


def test_prometheus_pair_differs_only_by_replica(services: dict[str, dict[str, Any]]) -> None:
    a, b = services["prometheus-a"], services["prometheus-b"]
    assert replica_neutral(a) == replica_neutral(b)
    assert (a["environment"]["PROMETHEUS_REPLICA"], b["environment"]["PROMETHEUS_REPLICA"]) == ("A", "B")
    data_volumes = [
        split_volume(v)[0] for s in (a, b) for v in s["volumes"] if split_volume(v)[1] == "/prometheus"
    ]
    assert len(set(data_volumes)) == 2, "each replica needs its own TSDB volume"
    command = a["command"]
    assert "--enable-feature=expand-external-labels" in command
    assert flag_value(command, "storage.tsdb.min-block-duration") == "2h"
    assert flag_value(command, "storage.tsdb.max-block-duration") == "2h"
    assert bind_mounts(a)["/etc/prometheus/prometheus.yml"] == REPO_ROOT / "metrics" / "prometheus.yml"
    assert bind_mounts(a)["/etc/prometheus/rules"] == REPO_ROOT / "rules"
    production = yaml.safe_load((REPO_ROOT / "metrics" / "prometheus.yml").read_text())
    assert production["global"]["external_labels"]["replica"] == "${PROMETHEUS_REPLICA}"


def test_each_thanos_sidecar_points_at_its_own_prometheus(services: dict[str, dict[str, Any]]) -> None:
    for replica in ("a", "b"):
        prometheus, sidecar = services[f"prometheus-{replica}"], services[f"thanos-sidecar-{replica}"]
        url = urlparse(flag_value(sidecar["command"], "prometheus.url"))
        assert url.hostname == f"prometheus-{replica}" and url.port == 9090
        assert sidecar["command"][0] == "sidecar"
        prometheus_data = {
            split_volume(v)[0] for v in prometheus["volumes"] if split_volume(v)[1] == "/prometheus"
        }
        tsdb_path = flag_value(sidecar["command"], "tsdb.path")
        sidecar_data = {split_volume(v)[0] for v in sidecar["volumes"] if split_volume(v)[1] == tsdb_path}
        assert sidecar_data == prometheus_data, f"sidecar {replica} must read prometheus-{replica}'s TSDB"
        assert sidecar["depends_on"][f"prometheus-{replica}"]["condition"] == "service_healthy"


def test_thanos_query_dedups_on_replica_and_reaches_every_store_api(
    services: dict[str, dict[str, Any]],
) -> None:
    command = services["thanos-query"]["command"]
    assert flag_values(command, "query.replica-label") == ["replica"]
    store_apis = {
        f"{name}:{listen_port(flag_value(services[name]['command'], 'grpc-address'))}"
        for name in ("thanos-sidecar-a", "thanos-sidecar-b", "thanos-store")
    }
    assert set(flag_values(command, "endpoint")) == store_apis
    # The straggler cycle's reads at 100,000 GPUs (docs/scaling.md): Go's collector at a quarter pace.
    assert services["thanos-query"]["environment"]["GOGC"] == "400"


def test_thanos_compactor_keeps_the_retention_classes(services: dict[str, dict[str, Any]]) -> None:
    command = services["thanos-compact"]["command"]
    assert flag_value(command, "retention.resolution-raw") == "30d"
    assert flag_value(command, "retention.resolution-5m") == "90d"
    assert flag_value(command, "retention.resolution-1h") == "365d"
    assert "--wait" in command


def test_object_store_bucket_user_and_policy_agree(services: dict[str, dict[str, Any]]) -> None:
    objstore_text = OBJSTORE_FILE.read_text()
    objstore = yaml.safe_load(objstore_text)
    bucket = objstore["config"]["bucket"]
    host, port = objstore["config"]["endpoint"].split(":")
    assert objstore["type"] == "S3" and host == "seaweedfs"
    store_script = services["seaweedfs"]["command"][0]
    assert f"-s3.port={port}" in store_script
    # The Thanos identity may read, write and list this bucket and nothing else.
    actions = re.search(r'"actions": \[(.*?)\]', store_script).group(1)
    assert sorted(json.loads(f"[{actions}]")) == [f"List:{bucket}", f"Read:{bucket}", f"Write:{bucket}"]
    init_script = services["seaweedfs-init"]["command"][0]
    assert f"s3.bucket.create -name {bucket}" in init_script
    # Thanos substitutes $(VAR) from the environment: each one must come from the env file it gets.
    settings_text = "\n".join(
        line for line in objstore_text.splitlines() if not line.lstrip().startswith("#")
    )
    needed = set(re.findall(r"\$\(([A-Za-z_0-9]+)\)", settings_text))
    example = REPO_ROOT / OPERATOR_DIR / "thanos-s3.env.example"
    provided = {line.split("=", 1)[0] for line in example.read_text().splitlines() if "=" in line}
    assert needed and needed <= provided
    assert all(f"${name}" in store_script for name in needed)  # compose's "$$" is a literal "$"
    assert services["seaweedfs"]["env_file"] == ["secrets/thanos-s3.env"]
    for name in THANOS_SERVICES:
        command = services[name]["command"]
        if flag_values(command, "objstore.config-file"):
            assert services[name]["env_file"] == ["secrets/thanos-s3.env"], name
            mounted = bind_mounts(services[name])[flag_value(command, "objstore.config-file")]
            assert mounted == OBJSTORE_FILE


def thanos_binary() -> Path:
    from metrics.install import THANOS_BUILD

    binary = THANOS_BUILD.binary(Settings())
    assert binary.is_file(), f"{binary} is missing: run `fleetsight setup` (it builds Thanos)"
    return binary


@pytest.mark.parametrize("service_name", THANOS_SERVICES)
def test_thanos_flags_are_accepted_by_the_real_thanos(
    services: dict[str, dict[str, Any]], service_name: str
) -> None:
    binary = thanos_binary()
    command = services[service_name]["command"]
    # kingpin reads every flag name before it acts on --help, so an unknown flag fails (values are not
    # checked this way). The control run proves the binary does reject a made-up flag.
    accepted = subprocess.run([binary, *command, "--help"], capture_output=True, text=True, timeout=30)
    assert accepted.returncode == 0, accepted.stderr[-2000:]
    control = subprocess.run(
        [binary, *command, "--no-such-flag", "--help"], capture_output=True, text=True, timeout=30
    )
    assert control.returncode != 0, "the binary accepted a made-up flag: this check proves nothing"


# ------------------------------------------------------------ real Prometheus and Alertmanager runs
class ContainerRoot:
    """Stands in for a container's file system: every absolute container path P becomes root/P, with
    the service's bind mounts linked in, so that the program runs with the compose flags unchanged
    apart from that prefix (and its listen addresses, moved to loopback)."""

    def __init__(self, root: Path, service: dict[str, Any]) -> None:
        self.root = root
        for target, source in bind_mounts(service).items():
            self.place(target).symlink_to(source)

    def place(self, container_path: str) -> Path:
        path = self.root / container_path.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def rewrite(self, container_path: str, old: str, new: str) -> None:
        """Replace a mounted file by a copy of it with `old` replaced by `new`."""
        path = self.place(container_path)
        text = path.read_text()
        path.unlink()
        path.write_text(text.replace(old, new))

    def arg(self, argument: str) -> str:
        flag, sep, value = argument.partition("=")
        if sep and value.startswith("/"):
            self.place(value)
            return f"{flag}={self.root}{value}"
        return argument


def start(command: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def answers(url: str) -> httpx.Response | None:
    try:
        response = httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return None
    return response if response.status_code == 200 else None


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        stop(process)


@pytest.mark.parametrize("replica", ["a", "b"])
def test_prometheus_replica_runs_with_its_compose_flags_and_mounts(
    services: dict[str, dict[str, Any]],
    tmp_path: Path,
    processes: list[subprocess.Popen[bytes]],
    replica: str,
) -> None:
    service = services[f"prometheus-{replica}"]
    root = ContainerRoot(tmp_path / "root", service)
    # Paths inside the configuration are container paths too.
    root.rewrite("/etc/prometheus/prometheus.yml", "/etc/prometheus/", f"{root.root}/etc/prometheus/")
    port = free_port()
    command = ["prometheus", *map(root.arg, service["command"]), f"--web.listen-address=127.0.0.1:{port}"]
    processes.append(start(command, tmp_path / "prometheus.log", service["environment"]))
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: answers(f"{base}/-/ready"), timeout=60, what=f"prometheus-{replica} ready")
    config = yaml.safe_load(httpx.get(f"{base}/api/v1/status/config", timeout=5).json()["data"]["yaml"])
    assert config["global"]["external_labels"]["replica"] == service["environment"]["PROMETHEUS_REPLICA"]
    flags = httpx.get(f"{base}/api/v1/status/flags", timeout=5).json()["data"]
    assert flags["storage.tsdb.min-block-duration"] == flags["storage.tsdb.max-block-duration"] == "2h"
    assert processes[0].poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]


def test_alertmanager_pair_forms_one_cluster(
    services: dict[str, dict[str, Any]], tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    names = ("alertmanager-a", "alertmanager-b")
    cluster_ports = {name: free_port() for name in names}
    web_ports = {name: free_port() for name in names}
    for name in names:
        service = services[name]
        root = ContainerRoot(tmp_path / name, service)
        for secret in service["secrets"]:
            target = secret["target"]
            root.place(target).symlink_to(REPO_ROOT / OPERATOR_DIR / f"{secret['source']}.example")
            root.rewrite("/etc/alertmanager/alertmanager.yml", target, f"{root.root}{target}")
        command = ["prometheus-alertmanager"]
        for argument in service["command"]:
            flag, _, value = argument.partition("=")
            if flag == "--cluster.listen-address":
                argument = f"{flag}=127.0.0.1:{cluster_ports[name]}"
            elif flag == "--cluster.peer":
                peer = value.rsplit(":", 1)[0]
                assert peer in names and peer != name, f"{name} peers with {value}"
                argument = f"{flag}=127.0.0.1:{cluster_ports[peer]}"
            command.append(root.arg(argument))
        command.append(f"--web.listen-address=127.0.0.1:{web_ports[name]}")
        processes.append(start(command, tmp_path / f"{name}.log"))

    def cluster_of(name: str) -> list[str]:
        response = answers(f"http://127.0.0.1:{web_ports[name]}/api/v2/status")
        return response.json()["cluster"].get("peers") or [] if response else []

    for name in names:
        wait_until(lambda n=name: len(cluster_of(n)) == 2, timeout=60, what=f"{name} sees both peers")


# ------------------------------------------------------------------- services and their references
def test_services_named_in_the_mounted_configs_exist(services: dict[str, dict[str, Any]]) -> None:
    production = yaml.safe_load((REPO_ROOT / "metrics" / "prometheus.yml").read_text())
    targets = [
        t
        for am in production["alerting"]["alertmanagers"]
        for c in am["static_configs"]
        for t in c["targets"]
    ]
    for job in production["scrape_configs"]:
        targets += [t for c in job.get("static_configs", []) for t in c["targets"]]
    for sd in (REPO_ROOT / "metrics" / "targets").glob("*/*.json"):
        targets += [t for group in json.loads(sd.read_text()) for t in group["targets"]]
    for target in targets:
        host, port = target.rsplit(":", 1)
        if host == "localhost":  # Prometheus scraping itself
            continue
        assert host in services, f"{target}: no such service"
        command = services[host].get("command", [])
        listens = flag_values(command, "listen") if isinstance(command, list) else []
        if listens:
            assert listen_port(listens[0]) == int(port), f"{target}: {host} listens on {listens[0]}"


def test_prometheus_finds_the_twins_nodes_through_http_sd_under_the_twin_profile(
    services: dict[str, dict[str, Any]],
) -> None:
    """The dcgm job's http_sd URL is the twin service's targets endpoint on the port it listens on,
    and the address the twin lists for itself (its listen address, 0.0.0.0 in the container) is
    relabelled to one Prometheus can reach (the service's name)."""
    production = yaml.safe_load((REPO_ROOT / "metrics" / "prometheus.yml").read_text())
    (job,) = [job for job in production["scrape_configs"] if job["job_name"] == "dcgm"]
    (sd,) = [sd for sd in job["http_sd_configs"] if sd["url"].endswith("/targets/dcgm.json")]
    url = urlparse(sd["url"])
    twin = services[url.hostname]
    assert twin["profiles"] == ["twin"] and twin["command"][:2] == ["twin", "run"]
    listen = flag_value(twin["command"], "listen")
    assert url.port == listen_port(listen) and url.path == "/targets/dcgm.json"
    # What the twin lists (twin/render.py dcgm_targets: its bound host and port), relabelled as
    # Prometheus does: a fully anchored regex, $1 for the first group.
    address = listen
    for rule in job.get("relabel_configs", []):
        if rule.get("source_labels") == ["__address__"] and rule.get("target_label") == "__address__":
            match = re.fullmatch(rule["regex"], address)
            if match:
                address = match.expand(re.sub(r"\$(\d+)", r"\\\1", rule["replacement"]))
    assert address == url.netloc, f"the twin lists {listen}; Prometheus would scrape {address}"


def test_long_running_services_have_healthchecks_and_restart_policies(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in services.items():
        if service.get("restart") == "no":  # one-shot jobs: others wait for them to complete
            continue
        assert service.get("restart") == "unless-stopped", name
        assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    for name, service in services.items():
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], f"{name} waits for {dependency} to be healthy"
            if condition["condition"] == "service_completed_successfully":
                assert services[dependency]["restart"] == "no", f"{dependency} is not a one-shot job"


def test_named_volumes_are_declared_and_used(compose: dict[str, Any]) -> None:
    used = {
        split_volume(spec)[0]
        for service in compose["services"].values()
        for spec in service.get("volumes", [])
        if not is_host_path(split_volume(spec)[0])
    }
    assert used == set(compose["volumes"])


def test_profiles_and_the_gpu_reservation(services: dict[str, dict[str, Any]]) -> None:
    profiled = {name: service["profiles"] for name, service in services.items() if "profiles" in service}
    assert profiled == {"dcgm-exporter": ["gpu"], "twin": ["twin"]}
    (device,) = services["dcgm-exporter"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    doc = DEPLOYMENT_DOC.read_text()
    assert "--profile gpu" in doc and "--profile twin" in doc


def test_alertmanager_gets_the_slack_secret_where_its_config_reads_it(
    services: dict[str, dict[str, Any]],
) -> None:
    config = yaml.safe_load((REPO_ROOT / "alerting" / "alertmanager.yml").read_text())
    (health,) = [r for r in config["receivers"] if r["name"] == "fleetsight-health"]
    (webhook,) = health["webhook_configs"]
    events_token = webhook["http_config"]["authorization"]["credentials_file"]
    for name in ("alertmanager-a", "alertmanager-b"):
        assert services[name]["secrets"] == [
            {"source": "slack_webhook_url", "target": config["global"]["slack_api_url_file"]},
            {"source": "health_events_token", "target": events_token},
        ]


def test_health_events_token_is_one_secret_for_its_sender_and_its_checker(
    services: dict[str, dict[str, Any]],
) -> None:
    # Alertmanager's receiver (above), the anomaly service and the health service must hold the same
    # token, or every webhook is refused with 401 and health falls back to the slow sweep.
    health = services["health"]
    assert "health_events_token" in health["secrets"]
    assert "--events-token-file=/run/secrets/health_events_token" in health["command"]
    anomaly = services["anomaly"]
    assert "health_events_token" in anomaly["secrets"]
    env = anomaly["environment"]
    assert env["FLEETSIGHT_ANOMALY_HEALTH_TOKEN_FILE"] == "/run/secrets/health_events_token"
    assert env["FLEETSIGHT_ANOMALY_HEALTH_URL"] == "http://health:9441"


# ------------------------------------------------------------------- FleetSight's own services
def resolve_command(args: list[str]) -> click.Context:
    """Parse args as `fleetsight ARGS` would, down to the leaf command, without running it: unknown
    sub-commands, unknown options and bad values raise click's usage errors."""
    from fleetsight.cli import main

    command: click.Command = main
    context = command.make_context("fleetsight", list(args), resilient_parsing=False)
    while isinstance(command, click.Group):
        name, command, rest = command.resolve_command(context, context._protected_args + context.args)
        context = command.make_context(name, rest, parent=context, resilient_parsing=False)
    return context


@pytest.mark.parametrize("service_name", ["fleetsight-node", "fleetsight-fabric", "twin", "anomaly"])
def test_fleetsight_service_commands_parse_with_the_real_cli(
    services: dict[str, dict[str, Any]], service_name: str
) -> None:
    command = services[service_name]["command"]
    try:
        resolve_command(command)
    except click.ClickException as error:
        pytest.fail(f"`fleetsight {' '.join(command)}`: {error.format_message()}")


def test_the_twin_scenario_ships_in_the_image(services: dict[str, dict[str, Any]]) -> None:
    scenario = flag_value(services["twin"]["command"], "scenario")
    assert (REPO_ROOT / scenario).is_file()
    assert not dockerignored(scenario, dockerignore_patterns())


# ---------------------------------------------------------------------------- Grafana provisioning
def grafana_expand(grafana: dict[str, Any], value: str) -> str:
    """A provisioning value with the ${VAR}s Grafana expands from its environment (os.ExpandEnv)."""
    environment = grafana["environment"]
    return re.sub(r"\$\{(\w+)\}", lambda m: str(environment[m.group(1)]), value)


def grafana_datasources(grafana: dict[str, Any]) -> list[dict[str, Any]]:
    """The datasources of the files compose mounts one by one into Grafana's datasources folder (the
    logs one is compose's own, with a login; the others are the shared provisioning files)."""
    mounts = bind_mounts(grafana)
    folder = PurePosixPath("/etc/grafana/provisioning/datasources")
    files = sorted(host for target, host in mounts.items() if PurePosixPath(target).parent == folder)
    # Every datasource of the shared provisioning files, compose has too (under the same file name).
    shared = {path.name for path in (GRAFANA_PROVISIONING / "datasources").glob("*.yml")}
    assert shared == {path.name for path in files}
    return [source for path in files for source in yaml.safe_load(path.read_text())["datasources"]]


def test_grafana_datasource_points_at_thanos_query(services: dict[str, dict[str, Any]]) -> None:
    grafana = services["grafana"]
    mounts = bind_mounts(grafana)
    assert mounts["/etc/grafana/provisioning/dashboards"] == GRAFANA_PROVISIONING / "dashboards"
    datasources = grafana_datasources(grafana)
    (default,) = [source for source in datasources if source.get("isDefault")]
    url = urlparse(grafana_expand(grafana, default["url"]))
    query_port = listen_port(flag_value(services["thanos-query"]["command"], "http-address"))
    assert (url.hostname, url.port, default["type"]) == ("thanos-query", query_port, "prometheus")


def test_grafana_dashboard_provider_loads_a_mounted_folder_of_valid_dashboards(
    services: dict[str, dict[str, Any]],
) -> None:
    mounts = bind_mounts(services["grafana"])
    datasource_uids = {source["uid"] for source in grafana_datasources(services["grafana"])}
    providers = [
        provider
        for path in sorted((GRAFANA_PROVISIONING / "dashboards").glob("*.yml"))
        for provider in yaml.safe_load(path.read_text())["providers"]
    ]
    assert providers
    for provider in providers:
        # A provider reads one dashboard file (its persona's folder); its folder is mounted.
        path = PurePosixPath(grafana_expand(services["grafana"], provider["options"]["path"]))
        folder = mounts.get(str(path.parent))
        assert folder is not None, f"provider path {path} is not mounted into grafana"
        dashboards = [folder / path.name]
        assert dashboards, f"{folder} holds no dashboard for the provider to load"
        for path in dashboards:
            dashboard = json.loads(path.read_text())
            assert dashboard["uid"] and dashboard["title"], path
            used = {
                panel_or_target["datasource"]["uid"]
                for panel in dashboard.get("panels", [])
                for panel_or_target in [panel, *panel.get("targets", [])]
                if isinstance(panel_or_target.get("datasource"), dict)
            }
            assert used <= datasource_uids, f"{path.name} uses unknown datasources {used - datasource_uids}"


# -------------------------------------------------------------------------------------- Logstash
def logstash_setting(section: str, key: str) -> str:
    """The value of `key => ...` inside the plugin block `section { ... }` of the pipeline file."""
    text = LOGSTASH_CONF.read_text()
    block = re.search(rf"\b{section}\s*\{{(.*?)\n  \}}", text, re.DOTALL)
    assert block, f"no {section} block in {LOGSTASH_CONF.name}"
    match = re.search(rf"^\s*{key}\s*=>\s*(.+)$", block.group(1), re.MULTILINE)
    assert match, f"{section} has no {key}"
    return match.group(1).strip()


def test_logstash_pipeline_reads_the_topics_and_names_the_ingest_pipelines(
    services: dict[str, dict[str, Any]],
) -> None:
    assert tuple(json.loads(logstash_setting("kafka", "topics"))) == logstash.KAFKA_TOPICS
    assert json.loads(logstash_setting("kafka", "group_id")) == logstash.KAFKA_CONSUMER_GROUP
    assert json.loads(logstash_setting("elasticsearch", "pipeline")) == logstash.ES_INGEST_PIPELINE
    assert json.loads(logstash_setting("elasticsearch", "index")) == logstash.ES_INDEX
    assert json.loads(logstash_setting("elasticsearch", "document_id")) == logstash.ES_DOCUMENT_ID
    # The topics exist: the one-shot logs-init runs `fleetsight logs apply` (no topic auto-creation).
    assert services["logs-init"]["command"][:2] == ["logs", "apply"]
    assert "--kafka=kafka:9092" in services["logs-init"]["command"]
    assert services["logstash"]["depends_on"]["logs-init"]["condition"] == "service_completed_successfully"
    kafka_properties = (REPO_ROOT / "pipelines" / "kafka" / "compose" / "server.properties").read_text()
    assert "auto.create.topics.enable=false" in kafka_properties.splitlines()
    # And Logstash reaches the broker (its SASL_SSL listener inside the network: tests/pipelines/
    # test_production_security.py checks the listeners) and Elasticsearch where compose puts them.
    (bootstrap,) = json.loads(logstash_setting("kafka", "bootstrap_servers")).split(",")
    assert bootstrap == "kafka:9092" and "INTERNAL://:9092" in kafka_properties
    (es_host,) = json.loads(logstash_setting("elasticsearch", "hosts"))
    assert urlparse(es_host).hostname == "elasticsearch"
    assert bind_mounts(services["logstash"])["/usr/share/logstash/pipeline"] == LOGSTASH_CONF.parent


# -------------------------------------------------------------------------------------- Dockerfile
def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [
        line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")
    ]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def dockerignore_patterns() -> list[str]:
    lines = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def pattern_matches(pattern: str, path: str) -> bool:
    if pattern.startswith("**/"):  # at any depth
        parts = path.split("/")
        return any(fnmatch.fnmatchcase("/".join(parts[i:]), pattern[3:]) for i in range(len(parts)))
    return fnmatch.fnmatchcase(path, pattern)


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule, for the pattern forms .dockerignore uses: a path is excluded when it or one of
    its parent folders matches the last matching pattern (a "!" pattern re-includes)."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        glob = pattern.removeprefix("!").strip("/")
        if any(pattern_matches(glob, candidate) for candidate in candidates):
            excluded = not negate
    return excluded


def test_dockerfile_base_user_and_entrypoint() -> None:
    instructions = dockerfile_instructions()
    (base,) = [args for op, args in instructions if op == "FROM"]
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?", base), base
    runs = " ".join(args for op, args in instructions if op == "RUN")
    assert "uv sync --frozen --no-dev --all-extras" in runs  # the image runs anomaly, chatbot, twin
    users = [args for op, args in instructions if op == "USER"]
    assert users and users[-1] not in {"root", "0"} and not users[-1].startswith(("root:", "0:"))
    (entrypoint,) = [args for op, args in instructions if op == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["fleetsight"]


def test_dockerignore_keeps_code_and_drops_local_state() -> None:
    patterns = dockerignore_patterns()
    for kept in [
        "pyproject.toml",
        "uv.lock",
        "README.md",
        "fleetsight/cli.py",
        "exporters/cli.py",
        "twin/cli.py",
    ]:
        assert not dockerignored(kept, patterns), kept
    for dropped in [
        ".venv/bin/python",
        ".cache/bin/thanos",
        "run/data/x",
        "secrets/minio_root_password",
        "fleetsight/__pycache__/cli.cpython-311.pyc",
        ".git/HEAD",
    ]:
        assert dockerignored(dropped, patterns), dropped


def build_context(destination: Path) -> None:
    """Copy what `docker build .` would send: the repo less what .dockerignore excludes."""
    patterns = dockerignore_patterns()
    for folder, subfolders, files in os.walk(REPO_ROOT):
        relative_folder = Path(folder).relative_to(REPO_ROOT)
        # Skip ignored folders without walking them (.venv, .cache hold gigabytes).
        subfolders[:] = [
            d for d in subfolders if not dockerignored((relative_folder / d).as_posix(), patterns)
        ]
        for name in files:
            relative = (relative_folder / name).as_posix()
            if not dockerignored(relative, patterns):
                target = destination / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO_ROOT / relative, target)


def test_dockerfile_install_steps_work_from_the_build_context(tmp_path: Path) -> None:
    """The image's `uv sync` steps, run here on a copy of the build context: the lock must be current,
    every package the wheel lists must be in the context, and the installed CLI must start."""
    context, venv = tmp_path / "context", tmp_path / "venv"
    build_context(context)
    env = {
        **os.environ,
        "UV_PROJECT_ENVIRONMENT": str(venv),
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_LINK_MODE": "copy",
    }
    env.pop("VIRTUAL_ENV", None)
    syncs = [args for op, args in dockerfile_instructions() if op == "RUN" and args.startswith("uv sync")]
    assert len(syncs) == 2
    for sync in syncs:
        result = subprocess.run(
            sync.split(), cwd=context, env=env, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, f"{sync}:\n{result.stderr[-3000:]}"
    installed = subprocess.run(
        [str(venv / "bin" / "fleetsight"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    # compose and the chart run the anomaly service, the chatbot, the twin and the report from this image
    services = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sklearn, scipy, bm25s, numpy, matplotlib, starlette"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert services.returncode == 0, f"the image lacks a service's extra:\n{services.stderr[-2000:]}"
    dev_tools = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import pytest"], capture_output=True, timeout=60
    )
    assert dev_tools.returncode != 0, "--no-dev installed the dev group"


# ------------------------------------------------------------------------------------------- docs
def test_deployment_doc_names_every_secret_profile_and_published_port(compose: dict[str, Any]) -> None:
    doc = DEPLOYMENT_DOC.read_text()
    for name in compose["secrets"]:
        assert name in doc, f"secret {name} is not documented"
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            host_port = str(port).split(":")[-2]
            assert host_port in doc, f"{name}: published port {host_port} is not documented"
