"""Real servers for the health tests, started once per session: an Alertmanager (Debian's) that the
tests POST alerts into through its API v2. Helpers live in health_helpers.py."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
import yaml
from health_helpers import Process

from support import free_port


@pytest.fixture(scope="session")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = shutil.which("prometheus-alertmanager")
    if binary is None:
        pytest.fail("prometheus-alertmanager is not installed: run `fleetsight setup`")
    folder = tmp_path_factory.mktemp("alertmanager")
    config = {"route": {"receiver": "null", "group_wait": "1s"}, "receivers": [{"name": "null"}]}
    (folder / "alertmanager.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    process = Process(
        "alertmanager",
        [
            binary,
            f"--config.file={folder / 'alertmanager.yml'}",
            f"--storage.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        folder / "alertmanager.log",
    )
    url = f"http://127.0.0.1:{port}"
    try:
        process.wait_ready(f"{url}/-/ready")
        yield url
    finally:
        process.stop()
