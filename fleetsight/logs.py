"""One log format for every FleetSight process: one event per line, key=value, on stderr."""

from __future__ import annotations

import logging
import sys

LOG_FORMAT = "ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"


def setup_logging(quiet: tuple[str, ...] = ("httpx",)) -> None:
    """INFO and up to stderr; ``quiet`` loggers at WARNING (httpx logs one line per request: noise
    for a service that polls Prometheus or a BMC every few seconds)."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=LOG_FORMAT)
    for name in quiet:
        logging.getLogger(name).setLevel(logging.WARNING)
