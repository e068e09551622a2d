"""The services (health, anomaly, chatbot) behind TLS with ``--web.config.file`` (exporter-toolkit's
format, read by fleetsight/webconfig.py as the exporters read it), each started as the stack starts it.
Over https with the CA checked they answer; plain HTTP on the same port gets no answer; a real Prometheus
scrapes the anomaly service over https with a read token from ``authorization.credentials_file`` (`up`)
and is refused with a wrong one. A bad file stops each service at start with the file and key named."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from fleetsight.procs import kill_group
from fleetsight.settings import REPO_ROOT
from health.component import serve_command
from support import FLEETSIGHT, free_port, self_signed, wait_until

READ_TOKEN = "tls-test-read-token-7c1d"
HEALTH_POLICY = REPO_ROOT / "health" / "policy.yml"


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A self-signed certificate for 127.0.0.1 (its own CA), and web configurations using it."""
    folder = tmp_path_factory.mktemp("service-tls")
    cert, key = self_signed(folder, "fleetsight-service")
    server = {"cert_file": str(cert), "key_file": str(key), "min_version": "TLS12"}
    write_yaml(folder / "web.yml", {"tls_server_config": server})
    write_yaml(folder / "web-tls13.yml", {"tls_server_config": {**server, "min_version": "TLS13"}})
    # the same certificate as client CA: mutual TLS, the client shows this certificate too
    mutual = {**server, "client_ca_file": str(cert), "client_auth_type": "RequireAndVerifyClientCert"}
    write_yaml(folder / "web-mtls.yml", {"tls_server_config": mutual})
    return folder


def write_yaml(path: Path, content: object) -> Path:
    path.write_text(yaml.safe_dump(content))
    return path


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Callable[..., None]]:
    """start(name, command, ready, env): the service in its own process group, stopped after the test
    (env: added to this environment; None removes a variable)."""
    processes: list[subprocess.Popen] = []

    def start(name: str, command: list[str], ready: Callable[[], bool], env: dict[str, str | None]) -> None:
        log = tmp_path / f"{name}.log"
        merged = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, env=merged, stdout=log.open("wb"),
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        processes.append(process)

        def alive_and_ready() -> bool:
            assert process.poll() is None, f"{name} exited:\n{log.read_text()[-3000:]}"
            try:
                return ready()
            except httpx.HTTPError:
                return False

        wait_until(alive_and_ready, timeout=60, what=f"{name} over TLS")

    yield start
    for process in processes:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            kill_group(process.pid)
            process.wait()


def refuses_plain_http(url: str) -> None:
    """Plain HTTP on the TLS port: the handshake fails and the request gets no HTTP answer."""
    with pytest.raises(httpx.HTTPError):
        httpx.get(url.replace("https://", "http://"), timeout=3)


def test_health_serves_mutual_tls(tls_dir: Path, started: Callable[..., None], tmp_path: Path) -> None:
    cert = str(tls_dir / "fleetsight-service.crt")
    client = ssl.create_default_context(cafile=cert)  # checks the server's certificate, shows its own
    client.load_cert_chain(cert, tls_dir / "fleetsight-service.key")
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    command = serve_command(
        f"127.0.0.1:{port}", tmp_path / "state", policy=HEALTH_POLICY, cluster="test",
        extra=("--web.config.file", str(tls_dir / "web-mtls.yml")),
    )  # fmt: skip
    ready = lambda: httpx.get(f"{url}/-/ready", verify=client, timeout=2).status_code == 200  # noqa: E731
    started("health", command, ready, {"FLEETSIGHT_HEALTH_TOKENS": ""})
    metrics = httpx.get(f"{url}/metrics", verify=client, timeout=5)
    assert metrics.status_code == 200 and "fleetsight_health_source_up" in metrics.text
    assert httpx.get(f"{url}/v1/nodes", verify=client, timeout=5).json()["nodes"] == []
    with pytest.raises(httpx.HTTPError):  # no client certificate: refused in the handshake
        httpx.get(f"{url}/metrics", verify=ssl.create_default_context(cafile=cert), timeout=5)
    refuses_plain_http(url)


def test_chatbot_serves_tls_with_a_minimum_version(tls_dir: Path, started: Callable[..., None]) -> None:
    trust = ssl.create_default_context(cafile=tls_dir / "fleetsight-service.crt")
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    command = [
        *FLEETSIGHT, "chatbot", "serve", "--listen", f"127.0.0.1:{port}", "--token-reads", "--rate-limit",
        "off", "--docs", str(REPO_ROOT / "docs" / "runbooks" / "PSUFailed.md"),
        "--web.config.file", str(tls_dir / "web-tls13.yml"),
    ]  # fmt: skip
    env = {"FLEETSIGHT_CHATBOT_TOKENS": f"{READ_TOKEN}=read", "FLEETSIGHT_CHATBOT_LLM_URL": None}
    started("chatbot", command, lambda: httpx.get(f"{url}/healthz", verify=trust, timeout=2).is_success, env)
    bearer = {"Authorization": f"Bearer {READ_TOKEN}"}
    assert httpx.get(f"{url}/metrics", verify=trust, timeout=5).status_code == 401  # /metrics is a read
    metrics = httpx.get(f"{url}/metrics", verify=trust, headers=bearer, timeout=5)
    assert metrics.status_code == 200 and "fleetsight_chatbot_" in metrics.text
    assert httpx.get(f"{url}/v1/status", verify=trust, headers=bearer, timeout=5).status_code == 200
    refuses_plain_http(url)
    old_client = ssl.create_default_context(cafile=tls_dir / "fleetsight-service.crt")
    old_client.maximum_version = ssl.TLSVersion.TLSv1_2  # below min_version: refused in the handshake
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/healthz", verify=old_client, timeout=5)


def test_prometheus_scrapes_the_anomaly_service_over_tls_with_a_read_token(
    tls_dir: Path, started: Callable[..., None], tmp_path: Path
) -> None:
    trust = ssl.create_default_context(cafile=tls_dir / "fleetsight-service.crt")
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    command = [
        *FLEETSIGHT, "anomaly", "serve", "--prometheus-url", f"http://127.0.0.1:{free_port()}",
        "--listen", f"127.0.0.1:{port}", "--token-reads", "--interval", "5",
        "--web.config.file", str(tls_dir / "web.yml"),
    ]  # fmt: skip
    ready = lambda: httpx.get(f"{url}/healthz", verify=trust, timeout=2).status_code == 200  # noqa: E731
    started("anomaly", command, ready, {"FLEETSIGHT_ANOMALY_TOKENS": f"{READ_TOKEN}=read"})
    bearer = {"Authorization": f"Bearer {READ_TOKEN}"}
    assert httpx.get(f"{url}/v1/stragglers", verify=trust, headers=bearer, timeout=5).status_code == 200
    refuses_plain_http(url)

    prometheus = shutil.which("prometheus")
    assert prometheus, "Prometheus is not installed: run `fleetsight setup`"
    (tmp_path / "good-token").write_text(READ_TOKEN + "\n")
    (tmp_path / "wrong-token").write_text("not-the-token\n")

    def job(name: str) -> dict:
        return {"job_name": name, "scrape_interval": "1s", "scrape_timeout": "1s", "scheme": "https",
                "tls_config": {"ca_file": str(tls_dir / "fleetsight-service.crt")},
                "authorization": {"credentials_file": str(tmp_path / f"{name}-token")},
                "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}  # fmt: skip

    config = write_yaml(tmp_path / "prometheus.yml", {"scrape_configs": [job("good"), job("wrong")]})
    prom_port = free_port()
    command = [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
               f"--web.listen-address=127.0.0.1:{prom_port}"]  # fmt: skip
    api = f"http://127.0.0.1:{prom_port}/api/v1"
    started("prometheus", command, lambda: httpx.get(f"{api}/status/buildinfo", timeout=2).is_success, {})

    def up() -> dict[str, str] | None:
        result = httpx.get(f"{api}/query", params={"query": "up"}, timeout=2).json()["data"]["result"]
        found = {r["metric"]["job"]: r["value"][1] for r in result}
        return found if {"good", "wrong"} <= set(found) and found["good"] == "1" else None

    assert wait_until(up, timeout=30, what="Prometheus scraping with the read token")["wrong"] == "0"
    targets = httpx.get(f"{api}/targets", timeout=5).json()["data"]["activeTargets"]
    wrong = next(t for t in targets if t["labels"]["job"] == "wrong")
    assert "401" in wrong["lastError"], wrong["lastError"]


def test_the_checks_service_serves_tls(tls_dir: Path, started: Callable[..., None], tmp_path: Path) -> None:
    """Where the check jobs post their results and Prometheus scrapes fleetsight_check_passed."""
    trust = ssl.create_default_context(cafile=tls_dir / "fleetsight-service.crt")
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    command = [*FLEETSIGHT, "checks", "serve", "--listen", f"127.0.0.1:{port}", "--state-dir",
               str(tmp_path / "checks"), "--web.config.file", str(tls_dir / "web.yml")]  # fmt: skip
    tokens = {"FLEETSIGHT_CHECKS_TOKENS": f"{READ_TOKEN}=results", "FLEETSIGHT_CHECKS_TOKENS_FILE": None}
    started(
        "checks", command, lambda: httpx.get(f"{url}/metrics", verify=trust, timeout=2).is_success, tokens
    )
    result = {"node": "n0042", "check": "dcgm_diag_r1", "passed": True, "summary": "ok", "finished": 1.8e9}
    bearer = {"Authorization": f"Bearer {READ_TOKEN}"}  # this test's one token, here with scope results
    httpx.post(f"{url}/v1/results", json=[result], headers=bearer, verify=trust, timeout=5).raise_for_status()
    metrics = httpx.get(f"{url}/metrics", verify=trust, timeout=5).text
    assert "fleetsight_check_passed{" in metrics and 'node="n0042"' in metrics
    refuses_plain_http(url)


@pytest.mark.parametrize(
    ("service", "content", "named"),
    [
        ("health", {"basic_auth_users": {"prometheus": "$2y$10$abc"}}, ["basic_auth_users", "bearer tokens"]),
        ("health", {"http_server_config": {}}, ["tls_server_config is required"]),
        ("anomaly", {"tls_server_config": {"cert_file": "/nonexistent.crt", "key_file": "/x.key"}},
         ["tls_server_config", "No such file"]),
        ("chatbot", {"tls_server_config": {"cert_file": "a", "key_file": "b", "min_version": "TLS1.3"}},
         ["tls_server_config.min_version"]),
        ("checks", {"http_server_config": {}}, ["tls_server_config is required"]),
    ],
)  # fmt: skip
def test_a_bad_web_config_stops_the_service_at_start(
    service: str, content: dict, named: list[str], tmp_path: Path
) -> None:
    bad = write_yaml(tmp_path / "web.yml", content)
    extra = {"anomaly": ["--prometheus-url", "http://127.0.0.1:9"], "health": [], "chatbot": [],
             "checks": ["--state-dir", str(tmp_path / "checks"), "--open-writes"]}[service]  # fmt: skip
    result = subprocess.run(
        [*FLEETSIGHT, service, "serve", "--listen", f"127.0.0.1:{free_port()}", *extra,
         "--web.config.file", str(bad)],
        capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
        env={**os.environ, "FLEETSIGHT_HEALTH_TOKENS": "", "FLEETSIGHT_RUN_DIR": str(tmp_path / "run")},
    )  # fmt: skip
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert f"--web.config.file {bad}:" in result.stderr, result.stderr
    assert all(word in result.stderr for word in named), result.stderr
