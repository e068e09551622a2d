"""What the anomaly tests share: a real Prometheus of their own, and stopping what they started."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml


def start_prometheus(tmp: Path, port: int, scrape_configs: list[dict[str, Any]]) -> subprocess.Popen[bytes]:
    tmp.mkdir(parents=True, exist_ok=True)
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": scrape_configs}
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    return subprocess.Popen(
        [
            "prometheus",
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop(*processes: subprocess.Popen[bytes] | None) -> None:
    for process in processes:
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
