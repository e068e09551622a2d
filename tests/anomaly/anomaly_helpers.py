"""What the anomaly tests share: a real Prometheus of their own, stopping what they started, and a
shipped benign day through several detector settings."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import evaluation.anomaly as evaluation
from anomaly.detector import Detector, DetectorConfig
from anomaly.state import Straggler
from fleetsight.settings import REPO_ROOT
from support import prometheus_process

SCENARIOS = REPO_ROOT / "evaluation" / "scenarios" / "anomaly"


def start_prometheus(tmp: Path, port: int, scrape_configs: list[dict[str, Any]]) -> subprocess.Popen[bytes]:
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": scrape_configs}
    return prometheus_process(tmp, port, config)


def stop(*processes: subprocess.Popen[bytes] | None) -> None:
    for process in processes:
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


def detector_variants(**variants: dict[str, Any]) -> dict[str, Callable[[float], Detector]]:
    """evaluation.anomaly.run_scenario's ``detectors``: the shipped detector (``shipped``) and one per
    named variant's DetectorConfig overrides, each told the scenario's sample window."""
    settings = {"shipped": {}, **variants}
    return {
        name: (lambda sample_s, extra=extra: Detector(DetectorConfig(sample_average_s=sample_s, **extra)))
        for name, extra in settings.items()
    }


def benign_day_flags(day: str, minutes: float, **variants: dict[str, Any]) -> dict[str, list[Straggler]]:
    """A shipped benign day's first ``minutes`` at 5-s samples, one simulation through the shipped
    detector and each named variant (``detector_variants``): each one's flags. The day has no fault,
    so every flag is wrong."""
    run = evaluation.run_scenario(
        SCENARIOS / f"{day}.yaml",
        duration=minutes * 60.0,
        sample_window=5.0,
        detectors=detector_variants(**variants),
    )
    assert run.fault_free
    return {name: [e.straggler for e in got if e.kind == "flag"] for name, got in run.events.items()}
