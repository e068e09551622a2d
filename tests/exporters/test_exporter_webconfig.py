"""The node agent behind TLS and basic auth (``--web.config.file``, exporter-toolkit's format), scraped by a
real Prometheus with the matching scrape settings: the right credentials are `up`, wrong ones and a
plain-HTTP scrape are not. promtool checks the same file, so the format is the one node_exporter reads."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import httpx
import pytest
import yaml
from exporter_helpers import FIXTURES, NodeSpec, build_node

from support import free_port, self_signed, wait_until

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "scrape-secret-0000"


@pytest.fixture(scope="module")
def secured_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    folder = tmp_path_factory.mktemp("webconfig")
    cert, key = self_signed(folder, "fleetsight-agent")
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
    web = folder / "web.yml"
    web.write_text(
        yaml.safe_dump(
            {"tls_server_config": {"cert_file": str(cert), "key_file": str(key)},
             "basic_auth_users": {"prometheus": hashed}}
        )
    )  # fmt: skip
    lines = (FIXTURES / "kernlog" / "xid_generations.log").read_text().splitlines()
    node = build_node(folder / "n0007", NodeSpec(oscs=2, kern_lines=lines))
    port = free_port()
    command = [
        sys.executable, "-m", "fleetsight.cli", "exporter", "node", "--node", "n0007", "--no-nvml",
        "--no-state", "--listen", f"127.0.0.1:{port}", "--web.config.file", str(web),
        "--sysfs-root", str(node["sys"]), "--procfs-root", str(node["proc"]),
        "--kmsg-file", str(node["kern_log"]),
    ]  # fmt: skip
    log = folder / "agent.log"
    process = subprocess.Popen(command, cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT)

    def answers() -> bool:
        assert process.poll() is None, log.read_text()
        try:
            return (
                httpx.get(f"https://127.0.0.1:{port}/metrics", verify=str(cert), timeout=2).status_code == 401
            )
        except httpx.HTTPError:
            return False

    wait_until(answers, timeout=30, what="the node agent over TLS")
    yield {"port": port, "cert": cert, "web": web, "folder": folder}
    process.terminate()
    process.wait(timeout=15)


def test_promtool_accepts_the_web_config(secured_agent: dict) -> None:
    result = subprocess.run(
        ["promtool", "check", "web-config", str(secured_agent["web"])], capture_output=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_basic_auth_and_tls_are_enforced(secured_agent: dict) -> None:
    url, cert = f"https://127.0.0.1:{secured_agent['port']}/metrics", str(secured_agent["cert"])
    assert httpx.get(url, verify=cert, auth=("prometheus", "wrong")).status_code == 401
    good = httpx.get(url, verify=cert, auth=("prometheus", PASSWORD))
    assert good.status_code == 200 and "fleetsight_collector_success" in good.text
    with pytest.raises(httpx.HTTPError):  # plain HTTP on a TLS port gets no answer
        httpx.get(f"http://127.0.0.1:{secured_agent['port']}/metrics", timeout=3)


def test_prometheus_scrapes_it_with_the_matching_settings(secured_agent: dict) -> None:
    prometheus = shutil.which("prometheus")
    assert prometheus, "Prometheus is not installed: run `fleetsight setup`"
    folder: Path = secured_agent["folder"]  # type: ignore[assignment]
    target = [f"127.0.0.1:{secured_agent['port']}"]
    tls = {"ca_file": str(secured_agent["cert"])}

    def job(name: str, password: str) -> dict:
        return {"job_name": name, "scrape_interval": "2s", "scrape_timeout": "2s", "scheme": "https",
                "tls_config": tls,
                "basic_auth": {"username": "prometheus", "password": password},
                "static_configs": [{"targets": target}]}  # fmt: skip

    config = {"scrape_configs": [job("good", PASSWORD), job("wrong", "nope")]}
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = folder / "prometheus.log"
    process = subprocess.Popen(
        [prometheus, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:

        def up() -> dict[str, str] | None:
            assert process.poll() is None, log.read_text()[-2000:]
            try:  # before it is ready, Prometheus answers 503 with a plain-text body
                result = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": "up"}).json()
            except (httpx.HTTPError, ValueError):
                return None
            found = {r["metric"]["job"]: r["value"][1] for r in result["data"]["result"]}
            # a first scrape may time out on a loaded machine (bcrypt's first check): wait for a good one
            return found if found.get("good") == "1" and "wrong" in found else None

        assert wait_until(up, timeout=90, what="a scrape with the right password")["wrong"] == "0"
    finally:
        process.terminate()
        process.wait(timeout=15)


def test_a_bad_web_config_is_named_at_start(tmp_path: Path) -> None:
    bad = tmp_path / "web.yml"
    bad.write_text(yaml.safe_dump({"basic_auth_users": {"prometheus": "plain-password"}}))
    result = subprocess.run(
        [sys.executable, "-m", "fleetsight.cli", "exporter", "node", "--no-state", "--no-nvml",
         "--listen", f"127.0.0.1:{free_port()}", "--web.config.file", str(bad)],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert (
        result.returncode != 0
        and "expected a bcrypt hash" in result.stderr
        and "Traceback" not in result.stderr
    )
