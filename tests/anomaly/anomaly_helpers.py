"""What the anomaly tests share: a real Prometheus of their own, and stopping what they started."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from support import prometheus_process


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
