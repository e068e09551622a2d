"""The long outages of the nothing-lost test: OpenSearch away 5 minutes, Kafka 1 minute (with the node-side
rsyslog restarted during it), while the twin writes; prints lines written / indexed / missing /
duplicated. Runs tests/pipelines/test_nothing_lost.py with long outages (about 12 minutes).

    .venv/bin/python bench/logs_outages.py [--opensearch-s 300] [--kafka-s 60]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--opensearch-s", type=float, default=300.0)
    parser.add_argument("--kafka-s", type=float, default=60.0)
    args = parser.parse_args()
    # The twin must outlive both outages and the servers' restarts (8x real time); on a loaded machine
    # OpenSearch and the shippers take minutes to come back, hence the margin.
    twin_minutes = int((args.opensearch_s + args.kafka_s + 900) * 8 / 60)
    env = {
        **os.environ,
        "FLEETSIGHT_LOSS_OPENSEARCH_OUTAGE_S": str(args.opensearch_s),
        "FLEETSIGHT_LOSS_KAFKA_OUTAGE_S": str(args.kafka_s),
        "FLEETSIGHT_LOSS_TWIN_DURATION": f"{twin_minutes}m",
    }
    command = [
        sys.executable,
        "-m",
        "pytest",
        "tests/pipelines/test_nothing_lost.py",
        "-q",
        "-s",
        "-p",
        "no:cacheprovider",
        "--tb=native",  # pytest's own traceback rendering has crashed here (INTERNALERROR) on a failure
    ]
    sys.exit(subprocess.run(command, cwd=REPO, env=env).returncode)


if __name__ == "__main__":
    main()
