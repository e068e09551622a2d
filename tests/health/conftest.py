"""Real servers for the health tests, started once per session: an Alertmanager (Debian's, tests/support.py)
that the tests POST alerts into through its API v2. Helpers live in health_helpers.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support import alertmanager_server


@pytest.fixture(scope="session")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with alertmanager_server(tmp_path_factory.mktemp("alertmanager")) as url:
        yield url
