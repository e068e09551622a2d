"""What the secured local Kafka costs at start: the component's prepare (CA, broker certificate and SCRAM
passwords via openssl, server.properties, KRaft storage formatted with the SCRAM users) and its start to
ready (an admin metadata request over SASL_SSL answered), in a fresh run folder, N times.

    .venv/bin/python bench/kafka_start.py [--runs 3]

Run the same file from an older checkout (same .cache) for the PLAINTEXT figures it replaced.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from fleetsight.components import load_components  # noqa: E402
from fleetsight.settings import Settings  # noqa: E402
from support import free_port_base  # noqa: E402


def one_start(cache: Path) -> tuple[float, float]:
    base = Path(tempfile.mkdtemp(prefix="kafka-start-"))
    settings = Settings(run_dir=base / "run", port_base=free_port_base(), cache_dir=cache)
    kafka = load_components()["kafka"]
    began = time.monotonic()
    kafka.prepare(settings)
    prepared = time.monotonic()
    with open(base / "kafka.log", "wb") as log:
        process = subprocess.Popen(
            kafka.command(settings), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        while not kafka.ready(settings):
            if process.poll() is not None:
                raise SystemExit(f"Kafka exited; see {base / 'kafka.log'}")
            time.sleep(0.1)
        return prepared - began, time.monotonic() - prepared
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=Settings().cache_dir, help="where setup put Kafka")
    args = parser.parse_args()
    runs = [one_start(args.cache) for _ in range(args.runs)]
    for n, (prepare, ready) in enumerate(runs, 1):
        print(
            f"run {n}: prepare {prepare:.1f} s, start to ready {ready:.1f} s, total {prepare + ready:.1f} s"
        )
    totals = [prepare + ready for prepare, ready in runs]
    load = os.getloadavg()[0]
    print(f"median total {statistics.median(totals):.1f} s over {len(runs)} runs (load {load:.1f})")


if __name__ == "__main__":
    main()
