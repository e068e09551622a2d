"""One log stack per test session (logs_helpers.LogStack): Kafka, OpenSearch, the rsyslog shipper and
node side, the twin, Alertmanager with the Slack stand-in, and ElastAlert2."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from logs_helpers import LOG_STACK, TEST_SCENARIO, LogStack, port_base, twin_command

from fleetsight.components import load_components
from fleetsight.settings import Settings


@pytest.fixture(scope="session")
def log_stack() -> Iterator[LogStack]:
    # Not under pytest's tmp folder: that one is 0700, and OpenSearch runs as nobody.
    base = Path(tempfile.mkdtemp(prefix="fleetsight-logs-test-"))
    base.chmod(0o755)
    run_dir = base / "run"
    # a cluster name of the test's own, not a default: the documents must carry the stack's name
    settings = Settings(run_dir=run_dir, port_base=port_base(), cluster="logs-e2e")
    components = load_components()
    # The twin runs a short scenario with one fault of each log-visible kind, ten times real time.
    components["twin"] = dataclasses.replace(
        components["twin"], command=lambda s: twin_command(s, TEST_SCENARIO)
    )
    stack = LogStack(settings, components)
    try:
        for name in LOG_STACK:
            stack.start(name)
        yield stack
    finally:
        stack.stop_all()
        shutil.rmtree(base, ignore_errors=True)
