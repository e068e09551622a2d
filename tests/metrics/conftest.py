"""The metrics stack the tests of this folder share: one `fleetsight up` per session with the Prometheus
pair, both Thanos sidecars, store and query, the Alertmanager pair, the Slack stand-in, node_exporter,
and a twin running tests/metrics/alert_faults.yaml with its node agents (test components joined
through FLEETSIGHT_COMPONENT_PATH). History for the sidecar test is backfilled before the stack starts.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.util
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from metrics_helpers import (
    COMPONENTS_DIR,
    HISTORY_SCENARIO,
    STACK_CLUSTER,
    MetricsStack,
    component_pid,
    freeze,
    thaw,
)

from fleetsight.settings import REPO_ROOT
from support import FLEETSIGHT, StackEnv, free_port_base, port_is_free

STACK_COMPONENTS = (
    "e2e-twin",
    "e2e-agents",
    "node-exporter",
    "prometheus",
    "prometheus-b",
    "thanos-query",
)
# The backfilled history ends this long before now: well clear of the replicas' live head block.
HISTORY_ENDS_BEFORE_NOW = dt.timedelta(hours=3)


def e2e_component_ports() -> dict[str, int]:
    path = COMPONENTS_DIR / "metrics_e2e_twin" / "component.py"
    spec = importlib.util.spec_from_file_location("metrics_e2e_twin_ports", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.PORTS)


def backfill_history(out: Path) -> Path:
    end = (dt.datetime.now(dt.UTC) - HISTORY_ENDS_BEFORE_NOW).replace(microsecond=0)
    command = [
        *FLEETSIGHT, "evaluate", "backfill", "--scenario", str(HISTORY_SCENARIO), "--out", str(out),
        "--end", end.isoformat().replace("+00:00", "Z"), "--no-agents",
    ]  # fmt: skip
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert list(out.glob("*/meta.json")), f"the backfill wrote no block: {result.stdout}"
    return out


def port_base_with_test_components() -> int:
    extra = e2e_component_ports().values()
    for _ in range(50):
        base = free_port_base()
        if all(port_is_free(base + offset) for offset in extra):
            return base
    raise RuntimeError("no free port range for the metrics stack")


@pytest.fixture(scope="session")
def metrics_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetricsStack]:
    root = tmp_path_factory.mktemp("metrics-stack")
    history = backfill_history(root / "history")
    base = port_base_with_test_components()
    env = {
        **os.environ,
        "FLEETSIGHT_RUN_DIR": str(root / "run"),
        "FLEETSIGHT_PORT_BASE": str(base),
        "FLEETSIGHT_COMPONENT_PATH": str(COMPONENTS_DIR),
        "FLEETSIGHT_CLUSTER": STACK_CLUSTER,
        "COLUMNS": "80",
    }
    stack = StackEnv(root / "run", base, env)
    try:
        result = stack.cli("up", *STACK_COMPONENTS, "--timeout", "240", timeout=300)
        # An outage that must begin before the twin's first fault: Alertmanager A stops before the PSU
        # failure on n0003 begins (its test checks later what arrived meanwhile).
        alertmanager = component_pid(stack.run_dir, "alertmanager")
        freeze(alertmanager)
        yield MetricsStack(stack, result.stdout, history, alertmanager, time.time())
    finally:
        for component in ("thanos-sidecar", "alertmanager", "prometheus-b"):
            thaw_component(stack.run_dir, component)  # a stopped process would hold `down` up
        stack.cli("down", "--timeout", "30", check=False)


def thaw_component(run_dir: Path, name: str) -> None:
    with contextlib.suppress(FileNotFoundError, ValueError, AssertionError, ProcessLookupError):
        thaw(component_pid(run_dir, name))
