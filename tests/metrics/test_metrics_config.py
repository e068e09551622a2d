"""The local configuration is production's with only addresses and paths swapped, production's dcgm
relabelling really gives every GPU series a `node` (checked on a real Prometheus), and `fleetsight up`
refuses a broken rule file, a receiver with a bad URL or a missing secret, naming the file and the
problem, without starting the component half-configured."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from alerting import component as alerting
from fleetsight.settings import Settings
from metrics import local
from support import StackEnv, free_port, wait_until

PRODUCTION = yaml.safe_load(local.PRODUCTION_CONFIG.read_text())
PRODUCTION_JOBS = {job["job_name"]: job for job in PRODUCTION["scrape_configs"]}


def settings_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("FLEETSIGHT_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("FLEETSIGHT_PORT_BASE", "34000")
    monkeypatch.setenv("FLEETSIGHT_CLUSTER", "config-test")
    return Settings()


# ------------------------------------------------------------------------- derived configuration
@pytest.mark.parametrize("replica", ["A", "B"])
def test_each_replica_runs_production_with_local_addresses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, replica: str
) -> None:
    settings = settings_for(tmp_path, monkeypatch)
    local.prepare_prometheus(settings, replica)  # promtool check config passes, or this raises
    config = yaml.safe_load(local.prometheus_config_path(settings, replica).read_text())

    # production reads both from its environment; the local stack writes the stack's values
    assert PRODUCTION["global"]["external_labels"] == {
        "cluster": "${FLEETSIGHT_CLUSTER}",
        "replica": "${PROMETHEUS_REPLICA}",
    }
    assert config["global"]["external_labels"] == {"cluster": settings.cluster, "replica": replica}
    assert config["global"]["scrape_interval"] == PRODUCTION["global"]["scrape_interval"]
    assert config["alerting"]["alert_relabel_configs"] == PRODUCTION["alerting"]["alert_relabel_configs"]
    (targets,) = config["alerting"]["alertmanagers"]
    assert targets["static_configs"][0]["targets"] == [
        f"127.0.0.1:{settings.port('alertmanager')}",
        f"127.0.0.1:{settings.port('alertmanager_b')}",
    ]
    assert config["rule_files"][0] == str(local.RULES_DIR / "*.yml")
    for job in config["scrape_configs"]:
        production = PRODUCTION_JOBS.get(job["job_name"])
        if production is None:
            continue  # a component's own job, not in production
        # Everything but where the targets are comes from production unchanged.
        assert local.without_addresses(job) == local.without_addresses(production), job["job_name"]
        for address in local.addresses_of(job).values():
            assert "127.0.0.1" in json.dumps(address), job["job_name"]
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert {"prometheus", "dcgm", "fleetsight-node", "fleetsight-fabric", "node"} <= jobs


def test_one_replica_scrapes_only_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`fleetsight up prometheus` starts replica A alone: its prometheus job must not list the peer that
    never started (a target that is always down fires ExporterDown for it)."""
    settings = settings_for(tmp_path, monkeypatch)
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    state = {"components": [{"name": "prometheus"}, {"name": "alertmanager"}]}
    (settings.run_dir / "state.json").write_text(json.dumps(state))
    config = local.prometheus_config(settings, "A")
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "prometheus"]
    assert job["static_configs"] == [{"targets": [f"127.0.0.1:{settings.port('prometheus')}"]}]
    state["components"].append({"name": "prometheus-b"})
    (settings.run_dir / "state.json").write_text(json.dumps(state))
    config = local.prometheus_config(settings, "A")
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "prometheus"]
    assert len(job["static_configs"][0]["targets"]) == 2


def test_production_scrape_intervals() -> None:
    intervals = {
        name: job.get("scrape_interval", PRODUCTION["global"]["scrape_interval"])
        for name, job in PRODUCTION_JOBS.items()
    }
    assert intervals["dcgm"] == intervals["fleetsight-node"] == intervals["fleetsight-fabric"] == "5s"
    assert intervals["node"] == "60s"
    assert "http_sd_configs" in PRODUCTION_JOBS["dcgm"], "the twin's http_sd (compose --profile twin)"


def test_production_scrapes_every_job_the_local_stack_declares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `fleetsight up` scrapes, production scrapes too: every job a component declares (the
    services' own /metrics among them, e.g. the checks service's fleetsight_check_passed) is a job of
    metrics/prometheus.yml, so the local config takes production's settings for it; and each service
    job's file_sd folder has its example list (metrics/targets/<job>/)."""
    settings = settings_for(tmp_path, monkeypatch)
    declared = local.declared_jobs(settings)
    assert "fleetsight-checks" in declared, "the checks component declares its scrape job"
    assert sorted(set(declared) - set(PRODUCTION_JOBS)) == [], "scraped locally, never in production"
    for name in ("anomaly", "fleetsight-health", "fleetsight-chatbot", "fleetsight-checks"):
        (sd,) = PRODUCTION_JOBS[name]["file_sd_configs"]
        assert sd["files"] == [f"/etc/prometheus/targets/{name}/*.json"], name
        examples = list((local.METRICS_DIR / "targets" / name).glob("*.json*"))
        assert examples, f"metrics/targets/{name}/ has no target list"
    config = local.prometheus_config(settings)
    (checks,) = [job for job in config["scrape_configs"] if job["job_name"] == "fleetsight-checks"]
    assert checks["static_configs"] == [{"targets": [f"127.0.0.1:{settings.port('checks')}"]}]
    assert local.without_addresses(checks) == local.without_addresses(PRODUCTION_JOBS["fleetsight-checks"])


@pytest.mark.stack
def test_the_local_stack_scrapes_the_checks_service(stack_env: StackEnv) -> None:
    """`fleetsight up checks prometheus`: Prometheus scrapes the checks service under the production
    job name (`up{job="fleetsight-checks"} == 1`), and a result posted to the service becomes
    fleetsight_check_passed / _last_run_timestamp_seconds in Prometheus, the series ActiveCheckFailed
    reads."""
    stack_env.cli("up", "checks", "prometheus", "--timeout", "120", timeout=180)
    finished = 1_800_000_000.0
    result = {
        "node": "n0042",
        "check": "dcgm_diag_r1",
        "passed": False,
        "summary": "test",
        "finished": finished,
    }
    # the token the stack wrote for the service (checks/component.py): a post needs scope `results`
    token = (stack_env.run_dir / "config" / "checks" / "checks_token").read_text().strip()
    assert httpx.post(stack_env.url("checks", "/v1/results"), json=[result], timeout=10).status_code == 401
    bearer = {"Authorization": f"Bearer {token}"}
    httpx.post(
        stack_env.url("checks", "/v1/results"), json=[result], headers=bearer, timeout=10
    ).raise_for_status()
    url = stack_env.url("prometheus", "/api/v1/query")

    def query(expr: str) -> list[dict[str, Any]]:
        try:
            answer = httpx.get(url, params={"query": expr}, timeout=5).json()
        except (httpx.HTTPError, ValueError):
            return []
        return answer.get("data", {}).get("result", [])

    (up,) = wait_until(
        lambda: query('up{job="fleetsight-checks"} == 1'), timeout=120, interval=1,
        what="Prometheus's first scrape of the checks service (job fleetsight-checks)",
    )  # fmt: skip
    assert up["metric"]["instance"] == f"127.0.0.1:{stack_env.port('checks')}"
    (passed,) = wait_until(
        lambda: query('fleetsight_check_passed{job="fleetsight-checks",node="n0042"}'), timeout=60,
        interval=1, what="the posted result in Prometheus",
    )  # fmt: skip
    assert passed["metric"]["check"] == "dcgm_diag_r1" and passed["value"][1] == "0"
    (stamp,) = query('fleetsight_check_last_run_timestamp_seconds{job="fleetsight-checks",node="n0042"}')
    assert float(stamp["value"][1]) == finished


class DcgmExporterPage(BaseHTTPRequestHandler):
    """dcgm-exporter's /metrics as it looks on a host: `Hostname`, no `node` (that is Prometheus's job)."""

    body = (
        b"# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        b'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1",pci_bus_id="00000000:18:00.0",device="nvidia0",'
        b'modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-host-07"} 97\n'
    )

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture
def dcgm_exporter() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), DcgmExporterPage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_dcgm_hostname_becomes_node_on_a_real_prometheus(tmp_path: Path, dcgm_exporter: str) -> None:
    """Production's dcgm job, pointed at a dcgm-exporter page, on a real Prometheus."""
    job = {
        **local.without_addresses(PRODUCTION_JOBS["dcgm"]),
        "static_configs": [{"targets": [dcgm_exporter]}],
    }
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump({"global": PRODUCTION["global"] | {"external_labels": {}}, "scrape_configs": [job]})
    )
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:

        def series() -> list[dict[str, Any]]:
            try:
                response = httpx.get(
                    f"http://127.0.0.1:{port}/api/v1/query", params={"query": "DCGM_FI_DEV_GPU_UTIL"}
                )
            except httpx.HTTPError:
                return []
            return response.json()["data"]["result"] if response.status_code == 200 else []

        (found,) = wait_until(series, timeout=60, what="Prometheus to scrape the dcgm-exporter page")
        print(f"scraped series labels: {found['metric']}")
        assert found["metric"]["node"] == "gpu-host-07"
        assert found["metric"]["Hostname"] == "gpu-host-07"  # dcgm-exporter's own label is kept
    finally:
        process.terminate()
        process.wait(timeout=20)
        log.close()


# -------------------------------------------------------------------------- refusing to start
def up_refused(stack: StackEnv, *components: str) -> str:
    """What `fleetsight up` said about why it refused: its error (a check before anything starts), or
    the failed components' details (the same text the table shows, unfolded)."""
    result = stack.cli("up", *components, "--timeout", "60", check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    said = [result.stderr]
    state_file = stack.run_dir / "state.json"
    if state_file.exists():
        said += [f"{c['name']}: {c['detail']}" for c in json.loads(state_file.read_text())["components"]]
    return "\n".join(said)


def never_started(stack: StackEnv, name: str) -> bool:
    """The component has no process and never had one: either the pre-flight check refused the whole
    stack (no state at all) or the component failed in its own preparation."""
    state_file = stack.run_dir / "state.json"
    if state_file.exists():
        (entry,) = [c for c in json.loads(state_file.read_text())["components"] if c["name"] == name]
        if entry["status"] != "failed" or entry["pid"] is not None:
            return False
    return not (stack.run_dir / "logs" / f"{name}.log").exists()


@pytest.mark.stack
def test_up_names_a_rule_file_with_a_syntax_error(stack_env: StackEnv, tmp_path: Path) -> None:
    broken = tmp_path / "broken_rules.yml"
    broken.write_text("groups:\n  - name: broken\n    rules:\n      - alert: Broken\n        expr: up ==\n")
    stack_env.env[local.EXTRA_RULES_ENV] = str(broken)
    output = up_refused(stack_env, "prometheus", "prometheus-b")
    print(output[-600:])
    assert str(broken) in output and "parse error" in output
    assert never_started(stack_env, "prometheus") and never_started(stack_env, "prometheus-b")


@pytest.mark.stack
def test_up_names_a_receiver_with_a_bad_url(stack_env: StackEnv, tmp_path: Path) -> None:
    config = yaml.safe_load(alerting.PRODUCTION_CONFIG.read_text())
    receiver = next(r for r in config["receivers"] if r.get("slack_configs"))
    receiver["slack_configs"][0]["api_url"] = "hooks.slack.invalid/services/T0/B0/x"  # no scheme
    routing = tmp_path / "alertmanager.yml"
    routing.write_text(yaml.safe_dump(config, sort_keys=False))
    stack_env.env[alerting.CONFIG_ENV] = str(routing)
    output = up_refused(stack_env, "alertmanager", "alertmanager-b")
    print(output[-600:])
    assert str(routing) in output
    assert f"receiver {receiver['name']!r}" in output and "not an http(s) URL" in output
    assert never_started(stack_env, "alertmanager") and never_started(stack_env, "alertmanager-b")


@pytest.mark.stack
def test_up_names_a_missing_secret_file_without_printing_secrets(stack_env: StackEnv, tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    stack_env.env[alerting.SECRETS_DIR_ENV] = str(secrets)
    output = up_refused(stack_env, "alertmanager")
    print(output[-600:])
    assert str(secrets / alerting.SLACK_SECRET) in output and "cannot be read" in output
    assert never_started(stack_env, "alertmanager")

    # Present but not a URL: named, and its content never printed.
    (secrets / alerting.SLACK_SECRET).write_text("xoxb-not-a-webhook-url-secret\n")
    stack_env.cli("down", check=False)
    output = up_refused(stack_env, "alertmanager")
    assert "is not an http(s) URL" in output and "xoxb" not in output


# ------------------------------------------------------------------ same flags as docker-compose.yml
COMPOSE = yaml.safe_load((local.METRICS_DIR.parent / "docker-compose.yml").read_text())["services"]
ADDRESS_AND_PATH_FLAGS = {
    "--config.file", "--storage.tsdb.path", "--web.listen-address", "--tsdb.path", "--prometheus.url",
    "--objstore.config-file", "--grpc-address", "--http-address", "--data-dir", "--endpoint",
}  # fmt: skip
LOCAL_ONLY_FLAGS = {"--sync-block-duration"}  # the store's refresh, shortened for a small local bucket


def flags(command: list[str]) -> set[str]:
    """The flags that are neither addresses nor paths, with their values."""
    return {
        argument
        for argument in command
        if argument.startswith("--")
        and argument.split("=", 1)[0] not in ADDRESS_AND_PATH_FLAGS | LOCAL_ONLY_FLAGS
    }


def test_local_processes_run_with_the_compose_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_for(tmp_path, monkeypatch)
    pairs = {
        "prometheus-a": local.prometheus_command(settings, "A"),
        "prometheus-b": local.prometheus_command(settings, "B"),
        "thanos-sidecar-a": local.sidecar_command(settings, "A"),
        "thanos-store": local.store_command(settings),
        "thanos-compact": local.compact_command(settings),
        "thanos-query": local.query_command(settings),
    }
    for service, command in pairs.items():
        assert flags(command) == flags(COMPOSE[service]["command"]), service
        if service.startswith("thanos"):
            assert command[1] == COMPOSE[service]["command"][0], f"{service}: thanos sub-command"
    query_endpoints = [a for a in pairs["thanos-query"] if a.startswith("--endpoint=")]
    assert len(query_endpoints) == len(
        [a for a in COMPOSE["thanos-query"]["command"] if a.startswith("--endpoint=")]
    )
    for replica in ("A", "B"):
        command = alerting.command(settings, replica)
        assert len([a for a in command if a.startswith("--cluster.peer=127.0.0.1:")]) == 1
        assert any(a.startswith("--cluster.listen-address=127.0.0.1:") for a in command)
