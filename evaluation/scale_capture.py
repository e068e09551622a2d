"""The fleet-scale capture: run the twin's small cluster (metrics/scale/scenario.yaml) and save what
every exporter of its nodes answers, as a user runs them (the series budget counts it, the load source
replays it):

- dcgm-exporter: the twin's ``/dcgm/<node>/metrics`` (dcgm-exporter's default counters for 8 GPUs);
- the FleetSight node agent: ``fleetsight exporter node --once`` over the twin's files and BMCs;
- the fabric exporter: ``fleetsight exporter fabric --once`` over the twin's UFM;
- node_exporter: Debian's ``prometheus-node-exporter`` on this host, with the local stack's flags.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from exporters.component import node_entries, write_nodes_file
from fleetsight.procs import free_loopback_port
from metrics.scale.capture import SCENARIO, Capture

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "fleetsight.cli"]
NODE_EXPORTER = "prometheus-node-exporter"


class CaptureError(RuntimeError):
    """An exporter or the twin did not answer; the message says which and why."""


def wait_for(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise CaptureError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


@contextmanager
def served_twin(work: Path, scenario: Path = SCENARIO) -> Iterator[str]:
    """The twin run to the end of the scenario at full speed, then serving its last state."""
    port = free_loopback_port()
    log = work / "twin.log"
    with open(log, "w") as handle:
        process = subprocess.Popen(
            [*CLI, "twin", "run", "--scenario", str(scenario), "--out", str(work / "twin"),
             "--truth", str(work / "truth.jsonl"), "--serve", "--listen", f"127.0.0.1:{port}"],
            cwd=REPO, stdout=handle, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for(lambda: "scenario_over" in log.read_text() or process.poll() is not None, 180, "the twin")
        if process.poll() is not None:
            raise CaptureError(f"the twin exited early:\n{log.read_text()[-2000:]}")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=20)


def run_cli(args: list[str], env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [*CLI, *args], cwd=REPO, capture_output=True, text=True, timeout=300, env=env or dict(os.environ)
    )
    if result.returncode != 0:
        raise CaptureError(f"fleetsight {' '.join(args[:2])} failed: {result.stderr[-2000:]}")
    return result.stdout


def node_exporter_text(work: Path) -> str:
    """This host's node_exporter, with the local stack's flags (metrics/local.py)."""
    port = free_loopback_port()
    process = subprocess.Popen(
        [NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{port}", "--no-collector.textfile"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/metrics"

        def answers() -> bool:
            try:
                return httpx.get(url, timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(answers, 30, "node_exporter")
        return httpx.get(url, timeout=10).text
    finally:
        process.terminate()
        process.wait(timeout=10)


def capture(work: Path, scenario: Path = SCENARIO) -> Capture:
    work.mkdir(parents=True, exist_ok=True)
    with served_twin(work, scenario) as url:
        targets = httpx.get(f"{url}/targets/dcgm.json", timeout=10).json()
        nodes = [group["labels"]["node"] for group in targets]
        dcgm = {n: httpx.get(f"{url}/dcgm/{n}/metrics", timeout=10).text for n in nodes}
        nodes_file = work / "nodes.json"
        write_nodes_file(nodes_file, node_entries(work / "twin", url, work / "gpus"))
        env = {**os.environ, "STATE_DIRECTORY": str(work / "state")}
        agent = run_cli(["exporter", "node", "--nodes-file", str(nodes_file), "--once"], env)
        fabric = run_cli(
            ["exporter", "fabric", "--once", "--ufm-url", f"{url}/ufm",
             "--ufm-telemetry-url", f"{url}/ufm/csv/metrics"]
        )  # fmt: skip
    return Capture(dcgm, agent, fabric, node_exporter_text(work), nodes)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        description="Run the twin's small cluster and save every exporter's exposition (the load source's "
        "templates, the series budget's input).",
        epilog="Example: python -m evaluation.scale_capture /tmp/cap",
    )
    parser.add_argument("folder", type=Path, help="where to save the expositions")
    args = parser.parse_args(argv)
    capture(args.folder / "work").save(args.folder)
    print(f"capture: saved in {args.folder}")


if __name__ == "__main__":
    main()
