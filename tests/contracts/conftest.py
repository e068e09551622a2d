"""The contract tests reuse other folders' helpers: the health tests' (the health service's scheduler
source) and the exporter tests' (a real HTTP server speaking JSON, the node agent's BMC collector), as
pytest puts those folders on sys.path only for their own tests."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.extend(str(TESTS / folder) for folder in ("health", "exporters"))
