"""Fault-onset-to-Slack delay on the local stack, measured against the twin's ground truth.

Starts a stack (Prometheus pair, Thanos, Alertmanager pair, Slack stand-in, node_exporter) with a twin
playing tests/metrics/alert_faults.yaml and its node agents, waits for each fault's first Slack
message and, unless --no-resolved, for its resolved message, then prints one line per alert: the delay
from the fault's onset to the first message, the messages per channel (one each is the promise of the
HA pairs) and the delay from the fault's end to the resolved message. The scenario says which faults to
wait for; their onsets and ends are the twin's truth (read with twin.truth.load_faults as the twin
writes each line, at the fault's onset). Stops the stack at the end.

    .venv/bin/python bench/alert_delay.py                 # ~4 minutes
    .venv/bin/python bench/alert_delay.py --resolved-timeout 900   # also wait for GPUFellOffBus to resolve

GPUFellOffBus stays firing for 10 minutes after the last Xid 79 (its rule counts new Xids over 10 m),
so its resolved message comes late by design; by default the bench stops waiting after 5 minutes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests" / "metrics"), str(REPO / "tests")]

from metrics_helpers import (  # noqa: E402 - the test helpers read the stand-in's record and the scenario
    COMPONENTS_DIR,
    PlannedFault,
    about,
    per_channel,
    planned_faults,
    slack_messages,
)

from fleetsight import registry  # noqa: E402
from support import port_is_free  # noqa: E402
from twin.truth import Fault, default_truth_path, load_faults  # noqa: E402

STACK = ("e2e-twin", "e2e-agents", "node-exporter", "prometheus", "prometheus-b", "thanos-query")
ALERT_OF_FAULT = {"psu_failure": "PSUFailed", "xid": "GPUFellOffBus"}


def fleetsight(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetsight.cli", *args], env=env, cwd=REPO, capture_output=True, text=True
    )


def wait_for(record: Path, alert: str, node: str, status: str, deadline: float) -> float | None:
    while time.time() < deadline:
        found = about(slack_messages(record), alert, node, status)
        if found:
            return found[0].received_at
        time.sleep(0.5)
    return None


def truth_of(truth: Path, planned: PlannedFault, deadline: float) -> Fault | None:
    """The twin's truth line of a planned fault, once the twin has begun it."""
    while time.time() < deadline:
        found = [f for f in load_faults(truth) if (f.kind, f.node) == (planned.kind, planned.node)]
        if found:
            return found[0]
        time.sleep(0.5)
    return None


def measure(run_dir: Path, resolved_timeout: float) -> list[str]:
    record = run_dir / "data" / "slack-sink" / "messages.jsonl"
    twin_out = run_dir / "data" / "e2e-twin"
    lines = []
    for planned in planned_faults(twin_out):
        alert, node = ALERT_OF_FAULT[planned.kind], planned.node
        fault = truth_of(default_truth_path(twin_out), planned, planned.onset_unix + 300)
        if fault is None:
            lines.append(f"{alert:14} {node}  not in the twin's truth within 300 s of its planned onset")
            continue
        fired = wait_for(record, alert, node, "firing", fault.onset + 300)
        if fired is None:
            lines.append(f"{alert:14} {node}  no message within 300 s of onset")
            continue
        resolved = None
        if fault.end < fired + resolved_timeout:
            resolved = wait_for(record, alert, node, "resolved", fault.end + resolved_timeout)
        time.sleep(15)  # the window in which a duplicate would arrive
        channels = per_channel(about(slack_messages(record), alert, node, "firing"))
        resolved_text = f"{resolved - fault.end:6.1f} s" if resolved else "   not within the wait"
        lines.append(
            f"{alert:14} {node}  onset->Slack {fired - fault.onset:6.1f} s   "
            f"end->resolved {resolved_text}   messages per channel {channels}"
        )
        print(lines[-1], flush=True)
    return lines


def free_base(wanted: int | None) -> int:
    """The wanted port base if every port of the stack (the test components' included) is free, else
    the first free one from 30000 up."""
    os.environ["FLEETSIGHT_COMPONENT_PATH"] = str(COMPONENTS_DIR)  # their ports count too
    registry.reset()
    offsets = registry.port_offsets().values()
    for base in [wanted] if wanted is not None else range(30000, 60000, 500):
        if all(port_is_free(base + offset) for offset in offsets):
            return base
    sys.exit(f"ports in use from {wanted}: pick another --port-base")


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument(
        "--port-base", type=int, help="FLEETSIGHT_PORT_BASE of its stack (default: a free one)"
    )
    parser.add_argument("--resolved-timeout", type=float, default=300, help="seconds to wait for a resolve")
    args = parser.parse_args()
    base = free_base(args.port_base)
    run_dir = Path(tempfile.mkdtemp(prefix="alert-delay-")) / "run"
    env = {**os.environ, "FLEETSIGHT_RUN_DIR": str(run_dir), "FLEETSIGHT_PORT_BASE": str(base)}
    try:
        started = fleetsight(env, "up", *STACK, "--timeout", "240")
        if started.returncode != 0:
            sys.exit(f"fleetsight up failed:\n{started.stdout}\n{started.stderr}")
        print(f"stack up in {run_dir} (port base {base}); faults of tests/metrics/alert_faults.yaml:")
        measure(run_dir, args.resolved_timeout)
        print(f"machine: {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}")
    finally:
        fleetsight(env, "down", "--timeout", "30")


if __name__ == "__main__":
    main()
