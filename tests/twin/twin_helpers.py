"""Helpers for the twin's tests: run `fleetsight twin run` as a real process and read its outputs the
way the real consumers would."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetsight.procs import stop_process
from fleetsight.settings import REPO_ROOT
from support import wait_until
from twin.truth import default_truth_path, load_truth

FLEETSIGHT = [sys.executable, "-m", "fleetsight.cli"]
SCENARIOS = REPO_ROOT / "twin" / "scenarios"
# One fault each, realism off: signatures are checked sample by sample (names may say the fault here:
# these are format tests, not evaluations).
FORMAT_SCENARIOS = Path(__file__).resolve().parent / "scenarios"


def scenario_arg(name: str) -> str:
    """A format-test scenario's path, else the name as given (a shipped scenario or a path)."""
    path = FORMAT_SCENARIOS / f"{name}.yaml"
    return str(path) if path.exists() else name


def twin_validate(*paths: str) -> subprocess.CompletedProcess[str]:
    """`fleetsight twin validate` on the scenario files, as an operator runs it (exit status not checked:
    the tests read the verdict per file)."""
    command = [*FLEETSIGHT, "twin", "validate", *paths]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, check=False)


@dataclass
class TwinRun:
    out: Path
    url: str | None
    process: subprocess.Popen | None
    log: Path

    def node(self, name: str) -> Path:
        return self.out / "nodes" / name

    @property
    def truth_path(self) -> Path:
        return default_truth_path(self.out)

    def truth(self) -> list[dict]:
        return load_truth(self.truth_path)

    def faults(self) -> list[dict]:
        """The truth's faults, without the benign disturbances."""
        return [line for line in self.truth() if not line["benign"]]

    def meta(self) -> dict:
        return json.loads((self.out / "meta.json").read_text())

    def kern(self, name: str) -> str:
        return (self.node(name) / "var/log/kern.log").read_text()

    def sysfs(self, name: str, path: str) -> str:
        return (self.node(name) / "sys" / path).read_text()

    def get(self, path: str) -> httpx.Response:
        assert self.url is not None, "this run does not serve"
        return httpx.get(self.url + path, timeout=10)

    def dcgm(self, name: str) -> dict[str, dict[tuple, float]]:
        """The node's /metrics parsed by prometheus_client: {metric: {(gpu, ...labels): value}}."""
        response = self.get(f"/dcgm/{name}/metrics")
        assert response.status_code == 200, response.text
        parsed: dict[str, dict[tuple, float]] = {}
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                parsed.setdefault(sample.name, {})[sample.labels["gpu"]] = sample.value
        return parsed

    def rank_logs(self, name: str, job: str) -> dict[int, str]:
        folder = self.node(name) / "var/log/jobs" / job
        return {int(p.stem.split("-")[1]): p.read_text() for p in folder.glob("rank-*.log")}


def start_twin(scenario: str, out: Path, *args: str, serve: bool = True) -> TwinRun:
    """Start the twin; with serve, wait until it has run the scenario and serves its last state."""
    log = out.parent / f"{out.name}.log"
    command = [*FLEETSIGHT, "twin", "run", "--scenario", scenario_arg(scenario), "--out", str(out), *args]
    if serve:
        command += ["--serve", "--listen", "127.0.0.1:0"]
    handle = open(log, "w")  # noqa: SIM115 - the process owns it until it ends
    process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    run = TwinRun(out, None, process, log)
    if not serve:
        assert process.wait(timeout=300) == 0, log.read_text()[-3000:]
        return run

    def served() -> str | None:
        if process.poll() is not None:
            pytest.fail(f"twin exited early ({process.returncode}):\n{log.read_text()[-3000:]}")
        text = log.read_text()
        match = re.search(r"event=serving url=(\S+)", text)
        return match.group(1) if match and "event=scenario_over" in text else None

    run.url = wait_until(served, timeout=240, what=f"twin run of {scenario} to finish")
    return run


def stop_twin(run: TwinRun) -> None:
    if run.process is not None and run.process.poll() is None:
        stop_process(run.process, timeout_s=20)


@pytest.fixture
def twin_factory(tmp_path: Path) -> Iterator:
    runs: list[TwinRun] = []

    def factory(scenario: str, *args: str, serve: bool = True, name: str = "out") -> TwinRun:
        run = start_twin(scenario, tmp_path / name, *args, serve=serve)
        runs.append(run)
        return run

    yield factory
    for run in runs:
        stop_twin(run)


def step_times(log: str) -> list[tuple[str, float]]:
    """(timestamp, step time in ms) from Megatron-style progress lines."""
    return [
        (m.group(1), float(m.group(2)))
        for m in re.finditer(
            r"^\[([^\]]+)\] iteration .*?elapsed time per iteration \(ms\): ([\d.]+)", log, re.M
        )
    ]
