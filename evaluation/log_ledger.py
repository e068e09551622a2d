"""Every log line's fate, counted by its identity at both ends of the log path: at the edge, the twin's
node files (a line is its file and the offset of its first byte, as rsyslog's imfile reports it in
``log.file.path`` and ``log.offset``); in the index, one entry per document. What is written and never
indexed is lost; what is indexed more than once is duplicated.

Used by the game day (evaluation/gameday.py) and the log path's outage test
(tests/pipelines/test_nothing_lost.py).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx

from fleetsight.search_pages import sorted_pages

# The twin's log files on each node (under <node>/var/log/), as the node-side rsyslog reads them.
NODE_LOG_FILES = ("kern.log", "fabricmanager.log", "bmc-sel.log", "jobs/*/rank-*.log")
INDEX_PATTERN = "fleetsight-logs-*"
PAGE = 5000

Origin = tuple[str, int]  # (file, offset of the line's first byte)


def written_origins(nodes_root: Path) -> set[Origin]:
    """Every complete line under the twin's node trees (a last line without its newline is not yet a
    line: imfile sends nothing else)."""
    origins = set()
    for path in [path for pattern in NODE_LOG_FILES for path in nodes_root.glob(f"*/var/log/{pattern}")]:
        offset = 0
        for line in path.read_bytes().splitlines(keepends=True):
            if line.endswith(b"\n"):
                origins.add((str(path), offset))
            offset += len(line)
    return origins


def indexed_origins(search_url: str, nodes_root: Path, timeout_s: float = 60.0) -> list[Origin]:
    """(file, offset) of every indexed document from the twin's files, one entry per document (so a
    duplicate appears twice). Refreshes the indices first, so that what was indexed is searchable."""
    with httpx.Client(base_url=search_url, timeout=timeout_s) as client:
        client.post(f"/{INDEX_PATTERN}/_refresh").raise_for_status()
        body = {
            "_source": ["log.file.path", "log.offset"],
            "query": {"prefix": {"log.file.path": str(nodes_root) + "/"}},
            # A line indexed twice shares all three: sorted_pages reads such a group whole.
            "sort": [{"log.file.path": "asc"}, {"log.offset": "asc"}, {"event.id": "asc"}],
        }

        def search(request: dict) -> list[dict]:
            response = client.post(f"/{INDEX_PATTERN}/_search", json=request)
            response.raise_for_status()
            return response.json()["hits"]["hits"]

        return [
            (h["_source"]["log"]["file"]["path"], h["_source"]["log"]["offset"])
            for hits in sorted_pages(search, body, PAGE)
            for h in hits
        ]


@dataclass(frozen=True)
class LedgerCount:
    written: int
    indexed: int  # distinct lines found in the index
    lost: int
    duplicated: int  # documents beyond the first of each line
    unexpected: int  # indexed lines the files do not have (a file rewritten under the reader)
    waited_s: float

    @property
    def exact(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and self.unexpected == 0


def count(written: set[Origin], documents: list[Origin], waited_s: float = 0.0) -> LedgerCount:
    counts = Counter(documents)
    return LedgerCount(
        written=len(written),
        indexed=len(counts),
        lost=len(written - set(counts)),
        duplicated=sum(n - 1 for n in counts.values()),
        unexpected=len(set(counts) - written),
        waited_s=round(waited_s, 1),
    )


def settle(search_url: str, nodes_root: Path, timeout_s: float, interval_s: float = 3.0) -> LedgerCount:
    """Wait (up to timeout_s) until every written line is indexed, then count. The writer must have
    stopped: the files are read once, at the start. An index that cannot be searched counts as waiting."""
    written = written_origins(nodes_root)
    began = time.monotonic()
    documents: list[Origin] = []
    while True:
        with contextlib.suppress(httpx.HTTPError):  # keep the last answer: the index may be coming back
            documents = indexed_origins(search_url, nodes_root)
        if set(documents) >= written or time.monotonic() - began >= timeout_s:
            return count(written, documents, time.monotonic() - began)
        time.sleep(interval_s)
