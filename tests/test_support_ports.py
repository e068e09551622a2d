"""The test servers' port picking survives a port taken between the pick and the bind: a server that dies
with "address already in use" is started again on another port (CI stop 54 lost seven tests to it)."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support import installed, served_on_a_free_port


def test_a_server_that_loses_its_port_is_started_again_on_another(tmp_path: Path) -> None:
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({"global": {"scrape_interval": "1m"}}))
    binary = installed("prometheus")
    given: list[int] = []
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        occupied = taken.getsockname()[1]

        def command_on(port: int) -> list[str]:
            # The first start is sent to the occupied port, as if someone had taken the picked one.
            given.append(port)
            listen = occupied if len(given) == 1 else port
            return [
                binary,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{listen}",
            ]

        with served_on_a_free_port("prometheus", command_on, tmp_path / "prometheus.log", "/-/ready") as url:
            assert httpx.get(f"{url}/-/ready", timeout=5).status_code == 200
    assert len(given) == 2
    assert url == f"http://127.0.0.1:{given[1]}"


def test_a_server_that_dies_for_another_reason_fails_with_its_log(tmp_path: Path) -> None:
    binary = installed("prometheus")
    calls: list[int] = []

    def command_on(port: int) -> list[str]:
        calls.append(port)
        return [binary, f"--config.file={tmp_path / 'missing.yml'}", f"--web.listen-address=127.0.0.1:{port}"]

    log = tmp_path / "prometheus.log"
    with (
        pytest.raises(pytest.fail.Exception, match="prometheus exited"),
        served_on_a_free_port("prometheus", command_on, log, "/-/ready"),
    ):
        pass
    assert len(calls) == 1, "a start that failed for another reason is not retried"
